"""Benchmark: the reference-style trainer against the course's fast trainer, in ONE process.

    python scripts/bench.py [--quick] [--epochs N] [--devices 1,2] [--subset N] [--json out.json]

Both train the same LeNet (same initialisation), batch 256, lr 0.2, for the same epochs, on the
same device(s): `helpers.train` (Part II: per-image DataLoader, per-parameter allreduce) and
`helpers.train_fast` (Part IV: resident data, flat gradients, a CUDA graph on one GPU). For each it
prints the median seconds per epoch (epochs 2 onwards), the final test accuracy and the peak
device memory, then the ratios. 2 devices are simulated on one GPU (or the CPU) when fewer exist.
Full size (all of Fashion-MNIST, 10 epochs) on a GPU; quick size with --quick, COURSE_QUICK=1 or
without a GPU. It reports figures; it is not a timed test.
"""
import argparse
import contextlib
import io
import json
import os
import platform
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root

import torch  # noqa: E402

import helpers  # noqa: E402

QUICK = dict(num_epochs=3, subset=2048)
FULL = dict(num_epochs=10, subset=None)


def peak_memory_reset(devices):
    for d in {str(d) for d in devices}:
        if d.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(d)


def peak_memory_mib(devices):
    """Sum over the distinct GPUs used of torch.cuda.max_memory_allocated; None on the CPU."""
    cuda = sorted({str(d) for d in devices if str(d).startswith("cuda")})
    if not cuda:
        return None
    return sum(torch.cuda.max_memory_allocated(d) for d in cuda) / 2**20


def run(name, fn, k, args, size):
    with contextlib.redirect_stdout(io.StringIO()):   # the trainer says it once, not twice
        devices = helpers.get_devices(k)
    helpers.synchronize(devices)
    peak_memory_reset(devices)
    t0 = time.perf_counter()
    kw = dict(num_epochs=size["num_epochs"], subset=size["subset"], seed=args.seed, plot=False)
    if name == "fast" and args.replica_streams and torch.cuda.is_available():
        kw["replica_streams"] = True
    note = None
    try:
        r = fn(k, args.batch_size, args.lr, **kw)
    except Exception as e:   # a CUDA graph that cannot be captured here: report, run eagerly
        if name != "fast":
            raise
        note = f"CUDA graph failed ({type(e).__name__}: {e}); measured eagerly instead"
        print(f"bench: {note}")
        peak_memory_reset(devices)
        t0 = time.perf_counter()
        kw.pop("replica_streams", None)
        r = fn(k, args.batch_size, args.lr, cuda_graph=False, **kw)
    return dict(note=note, trainer=name, devices=k, device_names=[str(d) for d in devices],
                sec_per_epoch=r["sec_per_epoch"], epoch_times=r["epoch_times"],
                test_acc=r["test_acc"], peak_mem_mib=peak_memory_mib(devices),
                used_cuda_graph=r.get("used_graph", False), total_s=time.perf_counter() - t0)


def fmt_mem(m):
    return "n/a (CPU)" if m is None else f"{m:.1f} MiB"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small run (the default without a GPU)")
    p.add_argument("--epochs", type=int, help="epochs per run (at least 2: epoch 1 is warm-up)")
    p.add_argument("--subset", type=int, help="training images (default: all, or 2048 quick)")
    p.add_argument("--devices", default="1,2", help="comma-separated device counts (default 1,2)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replica-streams", action="store_true",
                   help="fast trainer: each replica on its own CUDA stream (one GPU)")
    p.add_argument("--json", help="also write the results to this JSON file")
    args = p.parse_args(argv)

    gpu = torch.cuda.is_available()
    quick = args.quick or helpers.quick() or not gpu
    size = dict(QUICK if quick else FULL)
    if args.epochs is not None:
        size["num_epochs"] = args.epochs
    if args.subset is not None:
        size["subset"] = args.subset
    ks = [int(k) for k in args.devices.split(",")]
    where = torch.cuda.get_device_name(0) if gpu else f"CPU ({os.cpu_count()} cores)"
    print(f"bench: {'quick' if quick else 'full'} size {size}, batch {args.batch_size}, "
          f"lr {args.lr}, on {where}, torch {torch.__version__}")
    if not gpu:
        print("bench: no GPU -- the CPU run shows correctness and relative overheads, not GPU speed")

    rows = []
    for k in ks:
        for name, fn in (("reference", helpers.train), ("fast", helpers.train_fast)):
            rows.append(run(name, fn, k, args, size))

    print(f"\n{'trainer':<10} {'devices':>7} {'s/epoch':>9} {'test acc':>9} {'peak memory':>14}")
    for r in rows:
        print(f"{r['trainer']:<10} {r['devices']:>7} {r['sec_per_epoch']:>9.4f} "
              f"{r['test_acc']:>9.3f} {fmt_mem(r['peak_mem_mib']):>14}"
              f"{'  (CUDA graph)' if r['used_cuda_graph'] else ''}")
    get = {(r["trainer"], r["devices"]): r for r in rows}
    ratios = {}
    print()
    for k in ks:
        ref, fast = get["reference", k], get["fast", k]
        speed = ref["sec_per_epoch"] / fast["sec_per_epoch"]
        ratios[f"speedup_{k}dev"] = speed
        mem = ("" if ref["peak_mem_mib"] is None else
               f"; peak memory fast/reference {fast['peak_mem_mib'] / ref['peak_mem_mib']:.2f}")
        print(f"ratio {k} device(s): fast is {speed:.2f}x the reference's speed "
              f"({ref['sec_per_epoch']:.4f} -> {fast['sec_per_epoch']:.4f} s/epoch); "
              f"test acc {ref['test_acc']:.3f} -> {fast['test_acc']:.3f}{mem}")
    if len(ks) > 1:
        k0 = ks[0]
        for k in ks[1:]:
            for name in ("reference", "fast"):
                r = get[name, k]["sec_per_epoch"] / get[name, k0]["sec_per_epoch"]
                ratios[f"{name}_{k}dev_over_{k0}dev"] = r
                print(f"ratio {k} vs {k0} device(s), {name}: {r:.2f}x the time per epoch")
    if args.json:
        out = dict(quick=quick, size=size, replica_streams=args.replica_streams, batch_size=args.batch_size, lr=args.lr,
                   device=where, torch=torch.__version__, python=platform.python_version(),
                   cuda=torch.version.cuda, rows=rows, ratios=ratios,
                   argv=sys.argv[1:] if argv is None else argv)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"bench: results written to {args.json}")
    return rows, ratios


if __name__ == "__main__":
    main()
