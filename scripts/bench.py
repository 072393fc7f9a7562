"""Benchmark: the course's trainers against what a reader would pick instead, in ONE command.

    python scripts/bench.py [--quick] [--epochs N] [--subset N] [--ranks 1,2] [--json out.json]

Every row trains the same LeNet from the same initialisation, batch 256, lr 0.2, plain SGD, for the
same epochs:
  reference   helpers.train (Part II: per-image DataLoader, per-parameter allreduce), 1 device
  fast        helpers.train_fast (Part IV: resident data, flat fused step, CUDA graph on a GPU)
  compile     torch.compile(mode="reduce-overhead") of the plain nn.Module's step, 1 device
  ddp         torch's DistributedDataParallel on 1 and 2 ranks (NCCL, one GPU per rank; else gloo
              processes on the CPU, one thread each, pinned to cores)
  scratch     helpers.DDPFromScratch on the same ranks, when that module exists
The in-process rows run in this process (one thread on a CPU, so a rank is a core everywhere); the
ranks are spawned from it. For each row: median seconds per epoch (epochs 2 onwards) with its
spread, final test accuracy, peak GPU memory, and its speed relative to the reference. Quick size
(--quick, COURSE_QUICK=1) is for CI: it says that its figures are too short to compare. Full size
(on a GPU, or with COURSE_FULL=1) is all of Fashion-MNIST for 10 epochs; on a CPU the default is
4 epochs of 25,600 images, minutes on 2 cores. --epochs/--subset override either.
It reports figures; it is not a timed test.
"""
import argparse
import contextlib
import importlib.util
import io
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root

import torch  # noqa: E402

import helpers  # noqa: E402

QUICK = dict(num_epochs=3, subset=1024)
CPU = dict(num_epochs=4, subset=25600)   # minutes on 2 cores: enough to learn, and to compare
FULL = dict(num_epochs=10, subset=None)
COMPILE_QUICK_ON_CPU = False   # a first CPU compile costs tens of seconds: too much for CI


def median_spread(times):
    """(median, min, max) of the epoch times from epoch 2 on (epoch 1 pays for warm-up)."""
    t = times[1:] if len(times) > 1 else times
    return statistics.median(t), min(t), max(t)


def peak_memory_reset():
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(0)


def peak_memory_mib():
    return torch.cuda.max_memory_allocated(0) / 2**20 if torch.cuda.is_available() else None


def row(name, ranks, epoch_times, test_acc, peak_mem, note=""):
    med, lo, hi = median_spread(epoch_times)
    return dict(trainer=name, devices=ranks, sec_per_epoch=med, spread=[lo, hi],
                epoch_times=epoch_times, test_acc=test_acc, peak_mem_mib=peak_mem, note=note)


def run_in_process(name, fn, args, size):
    peak_memory_reset()
    kw = dict(num_epochs=size["num_epochs"], subset=size["subset"], seed=args.seed, plot=False)
    with contextlib.redirect_stdout(io.StringIO()):   # the trainers' own lines: the table says it
        r = fn(1, args.batch_size, args.lr, **kw)
    note = "CUDA graph" if r.get("used_graph") else ""
    return row(name, 1, r["epoch_times"], r["test_acc"], peak_memory_mib(), note)


def run_compiled(args, size):
    """torch.compile(mode='reduce-overhead') of one SGD step of the plain module."""
    from torch.nn import functional as F
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    X, y = helpers.load_tensors(True, size["subset"], device)
    X_test, y_test = helpers.load_tensors(False, size["subset"], device)
    net = helpers.lenet_module_from(helpers.init_lenet_params(seed=args.seed)).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)

    def step(Xb, yb):
        loss = F.cross_entropy(net(Xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss.detach()

    import logging
    logging.getLogger("torch").setLevel(logging.ERROR)   # compiler notes are not results
    try:
        torch._logging.set_logs(all=logging.ERROR)
    except (AttributeError, TypeError):   # older torch: the logger level above suffices
        pass
    compiled = torch.compile(step, mode="reduce-overhead")
    loader = helpers.ResidentLoader(X, y, args.batch_size, seed=args.seed)
    peak_memory_reset()
    times = []
    for _ in range(size["num_epochs"]):
        timer = helpers.Timer([device])
        with timer:
            for idx in loader.index_batches():
                compiled(X[idx], y[idx])
        times.append(timer.times[-1])
    with torch.no_grad():
        correct = sum(int((net(Xc).argmax(1) == yc).sum())
                      for Xc, yc in zip(X_test.split(2048), y_test.split(2048)))
    return row("compile", 1, times, correct / len(y_test), peak_memory_mib(),
               "first epoch includes compiling")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI size: too short to compare")
    p.add_argument("--epochs", type=int, help="epochs per row (at least 2: epoch 1 is warm-up)")
    p.add_argument("--subset", type=int, help="training images (default: all, or 1024 quick)")
    p.add_argument("--ranks", default="1,2", help="rank counts for the DDP rows (default 1,2)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    p.add_argument("--json", help="also write the results to this JSON file (atomically)")
    args = p.parse_args(argv)
    if args.epochs is not None and args.epochs < 2:
        p.error("--epochs must be at least 2: epoch 1 is warm-up and is not counted")

    gpu = torch.cuda.is_available()
    quick = args.quick or helpers.quick()
    with contextlib.redirect_stdout(io.StringIO()):
        size = dict(QUICK if args.quick else helpers.choose(FULL, CPU, tiny=QUICK))
    if args.epochs is not None:
        size["num_epochs"] = args.epochs
    if args.subset is not None:
        size["subset"] = args.subset
    ranks = [int(k) for k in args.ranks.split(",")]
    if not gpu:
        torch.set_num_threads(1)   # one core per rank everywhere: rows compare like with like
    where = torch.cuda.get_device_name(0) if gpu else f"CPU ({os.cpu_count()} cores)"
    label = "quick" if quick else "full" if size == FULL else "CPU"
    print(f"bench: {label} size {size}, batch {args.batch_size}, "
          f"lr {args.lr}, on {where}, torch {torch.__version__}")
    if not gpu:
        print("bench: no GPU: in-process rows use 1 thread, each DDP rank is a gloo process with "
              "1 thread on its own core; the figures are CPU figures, not GPU ones")
    t_start = time.perf_counter()
    rows = [run_in_process("reference", helpers.train, args, size),
            run_in_process("fast", helpers.train_fast, args, size)]
    if args.no_compile:
        print("bench: compile row skipped (--no-compile)")
    elif quick and not gpu and not COMPILE_QUICK_ON_CPU:
        print("bench: compile row skipped at quick size on a CPU: its first compile alone costs "
              "tens of seconds here (run without --quick to include it)")
    else:
        try:
            rows.append(run_compiled(args, size))
        except Exception as e:   # no compiler, unsupported platform: say why, go on
            print(f"bench: compile row skipped: torch.compile failed here "
                  f"({type(e).__name__}: {str(e).splitlines()[0][:160]})")
    have_scratch = importlib.util.find_spec("helpers.data_parallel.scratch") is not None
    if not have_scratch:
        print("bench: DDPFromScratch row skipped: helpers.data_parallel.scratch is not "
              "importable here")
    for k in ranks:
        wrappers = ["ddp"] + (["scratch"] if have_scratch and k > 1 else [])
        got, backend = helpers.bench_ranks(k, wrappers, args.batch_size, args.lr,
                                           size["num_epochs"], size["subset"], args.seed)
        for w in wrappers:
            r = got[w]
            rows.append(row(w, k, r["epoch_times"], r["test_acc"], r["peak_mem_mib"],
                            f"{backend}, {k} process(es)"))
            rows[-1]["param_sum"] = r["param_sum"]   # the same for every rank count and wrapper

    ref = rows[0]["sec_per_epoch"]
    print(f"\n{'trainer':<10} {'ranks':>5} {'s/epoch':>9} {'spread':>17} {'test acc':>8} "
          f"{'peak mem':>10} {'speed':>7}  note")
    for r in rows:
        mem = "n/a" if r["peak_mem_mib"] is None else f"{r['peak_mem_mib']:.0f} MiB"
        lo, hi = r["spread"]
        print(f"{r['trainer']:<10} {r['devices']:>5} {r['sec_per_epoch']:>9.3f} "
              f"{lo:>8.3f}-{hi:<8.3f} {r['test_acc']:>8.3f} {mem:>10} "
              f"{ref / r['sec_per_epoch']:>6.2f}x  {r['note']}")
    get = {(r["trainer"], r["devices"]): r["sec_per_epoch"] for r in rows}
    ratios = {f"{r['trainer']}_{r['devices']}_speed_over_reference": ref / r["sec_per_epoch"]
              for r in rows[1:]}
    for w in ("ddp", "scratch"):
        if (w, 1) in get and (w, 2) in get:
            ratios[f"{w}_2_over_1_speed"] = get[w, 1] / get[w, 2]
    if ("scratch", 2) in get and ("ddp", 2) in get:
        ratios["scratch_over_ddp_2_speed"] = get["ddp", 2] / get["scratch", 2]
    print("\nratios (speed: how many times as fast; > 1 is faster):")
    for name, v in ratios.items():
        print(f"  {name}: {v:.2f}")
    print(f"bench: {len(rows)} rows in {time.perf_counter() - t_start:.0f} s")
    if quick:
        print("bench: quick size: a few steps per epoch, so these figures are too short to "
              "compare; run without --quick for ratios")
    if args.json:
        out = dict(quick=quick, size=size, batch_size=args.batch_size, lr=args.lr, device=where,
                   torch=torch.__version__, python=platform.python_version(),
                   cuda=torch.version.cuda, threads=torch.get_num_threads(), rows=rows,
                   ratios=ratios, argv=sys.argv[1:] if argv is None else argv,
                   date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        helpers.write_json(args.json, out, indent=2)
        print(f"bench: results written to {args.json}")
    return rows, ratios


if __name__ == "__main__":
    main()
