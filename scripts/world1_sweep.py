"""Every launch target of the chapters once, on ONE rank with NCCL on cuda:0: the NCCL path of
the multi-rank chapters on a one-GPU machine.

There, the chapters' launches of 2 or more ranks fall back to gloo on the CPU, so their NCCL
path never runs. But a CPU tensor handed to an NCCL collective, or a CPU model fed GPU data,
fails at world 1 exactly as at world 8 (NCCL registers for CUDA tensors only), so one GPU
flushes out most device mistakes of the NCCL path (tests/test_fake_cuda.py finds them without
a GPU; this is the real thing). The targets and their small cfgs are tests/chapter_targets.py's.

    python scripts/world1_sweep.py [--backend nccl|gloo] [--only a,b] [--json OUT.json]
(from the repository root; gloo: the same runs on the CPU, as CI and `make gpu-dry` do so that
the sweep itself stays right). Prints OK / FAIL / SKIP per target with the first line of each
failure and where it arose; exits with the number of failures (0: all ran).
"""
import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
os.environ.setdefault("COURSE_QUICK", "1")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    p.add_argument("--only", default="", help="comma-separated target names")
    p.add_argument("--json", default=None, help="write the results here too")
    p.add_argument("--timeout", type=float, default=540.0, help="seconds for all the runs")
    a = p.parse_args(argv)
    import chapter_targets as ct

    import helpers  # after the argument checks
    if a.backend == "nccl" and helpers.num_gpus() < 1:
        p.error("--backend nccl needs a GPU: on a CPU use --backend gloo")
    only = {s for s in a.only.split(",") if s}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [t for t in ct.targets(tmp) if not only or t.name in only]
        unknown = only - {t.name for t in rows}
        if unknown:
            p.error(f"no launch target {sorted(unknown)} in tests/chapter_targets.py")
        runs = [(t.name, t.fn, dict(t.cfg, **t.world1)) for t in rows
                if t.world1 is not None and not t.gloo_only]
        got = helpers.launch(ct.each, 1, dict(runs=runs), backend=a.backend, quiet=True,
                             timeout=a.timeout)[0]
    report, fails = {}, 0
    for t in rows:
        if t.gloo_only or t.world1 is None:
            why = "its chapters launch it on gloo" if t.gloo_only else \
                f"needs {t.world} ranks"
            report[t.name] = dict(status="skip", why=why, owner=t.owner)
            print(f"SKIP {t.name}: {why}", flush=True)
            continue
        r = got[t.name]
        ok = r["error"] is None
        fails += not ok
        report[t.name] = dict(status="ok" if ok else "fail", error=r["error"],
                              seconds=round(r["seconds"], 2), owner=t.owner)
        print(f"{'OK  ' if ok else 'FAIL'} {t.name} ({r['seconds']:.1f} s)"
              + ("" if ok else f": {r['error']}"), flush=True)
    import torch
    gpu = torch.cuda.get_device_name(0) if a.backend == "nccl" else "none (gloo on the CPU)"
    summary = dict(backend=a.backend, torch=torch.__version__, gpu=gpu,
                   seconds=round(time.perf_counter() - t0, 1), failures=fails, targets=report)
    print(f"world-1 sweep ({a.backend}): {sum(v['status'] == 'ok' for v in report.values())} "
          f"ok, {fails} failed, {sum(v['status'] == 'skip' for v in report.values())} skipped "
          f"in {summary['seconds']} s", flush=True)
    if a.json:
        helpers.write_json(a.json, summary)
    return min(fails, 125)


if __name__ == "__main__":
    sys.exit(main())
