"""Benchmark: the course's trainers against what a reader would pick instead, in ONE command.

    python scripts/bench.py [--quick] [--epochs N] [--subset N] [--ranks 1,2] [--rounds 3]
                            [--rows reference,fast,...] [--targets cpu|gpu|none] [--json out.json]

Every row trains the same LeNet from the same initialisation, batch 256, lr 0.2, plain SGD:
  reference     helpers.train (Part II: per-image DataLoader, per-parameter allreduce), 1 device
  fast          helpers.train_fast (Part IV: resident data, flat fused step), in its fastest form
                here: compiled forward+backward on a CPU (of helpers.lenet_fused: the same LeNet,
                leaving out what its pools throw away), a CUDA graph on a GPU
  fast-eager    the same without compiling (CPU; what the chapters run)
  fast-compile  the CUDA graph AND the compiled forward+backward (GPU: does compiling pay there?)
  fast-shared   2 devices sharing one GPU (GPU only: the 2-devices-on-one target)
  compile       torch.compile(mode="reduce-overhead") of the plain nn.Module's step, 1 device
                (helpers.train_compiled)
  ddp, scratch, fast (with --ranks)  torch's DistributedDataParallel, helpers.DDPFromScratch and
                the fast trainer on k ranks (NCCL, one GPU per rank; else gloo processes on the
                CPU, one thread each, pinned to cores)
The rows take turns: every round runs each row once, in the opposite order every other round
(ABAB...), and round r uses seed + r, so a row's test accuracy comes from --rounds seeds. A row's
figure in a round is its median seconds per epoch from epoch 2 on (epoch 1 pays for warm-up and
compiling: its excess is reported); each ratio is divided round by round (helpers.ratio), with
its median and spread, and "within noise" where the spread crosses 1 ("cannot tell" from one
round: no spread). The JSON keeps every sample. Quick size (--quick, COURSE_QUICK=1) is for
CI: too short to compare. Full size (on a GPU, or with COURSE_FULL=1): all of Fashion-MNIST for
10 epochs; on a CPU the default is 4 epochs of 25,600 images. Every argument is checked before
any row runs.
"""
import argparse
import contextlib
import importlib.util
import io
import os
import platform
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root

import torch

import helpers

QUICK = dict(num_epochs=3, subset=1024)
CPU = dict(num_epochs=4, subset=25600)   # minutes on 2 cores: enough to learn, and to compare
FULL = dict(num_epochs=10, subset=None)
IN_PROCESS = ("reference", "fast", "fast-eager", "fast-compile", "fast-shared", "compile")
ON_RANKS = ("ddp", "scratch", "fast")
GPU_TARGETS = dict(fast_sec=0.15, fast_over_reference=10.0, shared_over_one=1.2)
RANK_TIMEOUT = 3600.0   # seconds a row on ranks may take: a busy 2-core machine is slow


# --- arguments: all checked before any row runs ----------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI size: too short to compare")
    p.add_argument("--epochs", type=int, help="epochs per row (at least 2: epoch 1 is warm-up)")
    p.add_argument("--subset", type=int, help="training images (default: all, or 1024 quick)")
    p.add_argument("--ranks", help="rank counts for the rows on ranks, e.g. 1,2 (empty: none;"
                   " default 1,2, or 2 at quick size)")
    p.add_argument("--rows", help="trainers to run, comma-separated (default: all that apply)")
    p.add_argument("--rounds", type=int, help="rounds (seeds) per row (default 3; 1 quick)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-steps", type=int, default=20,
                   help="steps of the same-arithmetic check (reference against fast)")
    p.add_argument("--no-compile", action="store_true", help="no torch.compile anywhere")
    p.add_argument("--targets", choices=("auto", "cpu", "gpu", "none"), default="auto",
                   help="the speed targets to judge (auto: gpu on a GPU, cpu otherwise)")
    p.add_argument("--json", help="also write the results (every sample) to this JSON file")
    args = p.parse_args(argv)
    try:
        validate_args(args)
    except ValueError as e:
        p.error(str(e))
    return args


def validate_args(args):
    """Refuse, with the fix, anything that would fail or mislead later."""
    if args.epochs is not None and args.epochs < 2:
        raise ValueError("--epochs must be at least 2: epoch 1 is warm-up and is not counted")
    for name in ("subset", "batch_size", "rounds", "check_steps"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {v}")
    try:
        helpers.validate_lr(args.lr)
    except ValueError:
        raise ValueError(f"--lr must be a positive, finite number, got {args.lr}: e.g. "
                         "--lr 0.2") from None
    helpers.validate_seed(args.seed + (args.rounds or 3) - 1, "--seed")   # round r: seed + r
    helpers.quick(), helpers.full()   # a value these switches do not know is refused
    if args.ranks is None:
        args.ranks = "2" if args.quick or helpers.quick() else "1,2"
    try:
        args.ranks = [int(k) for k in args.ranks.split(",") if k.strip()]
    except ValueError:
        raise ValueError(f"--ranks {args.ranks!r} is not a comma-separated list of rank counts: "
                         "use e.g. --ranks 1,2 (or --ranks '' for none)") from None
    bad = [k for k in args.ranks if k < 1]
    if bad:
        raise ValueError(f"--ranks must be at least 1 each, got {bad}: use e.g. --ranks 1,2")
    if len(set(args.ranks)) < len(args.ranks):
        raise ValueError(f"--ranks {args.ranks} repeats a count: give each once, e.g. --ranks "
                         f"{','.join(map(str, sorted(set(args.ranks))))}")
    for k in args.ranks:
        if args.batch_size % k:
            lo = args.batch_size - args.batch_size % k
            hi = lo + k
            raise ValueError(f"batch {args.batch_size} does not split evenly over {k} ranks: use "
                             f"--batch-size {lo or hi} or {hi}, or other --ranks")
    known = IN_PROCESS + ON_RANKS
    if args.rows is not None:
        args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
        unknown = [r for r in args.rows if r not in known]
        if unknown or not args.rows:
            raise ValueError(f"--rows {unknown or 'empty'}: choose among {', '.join(known)}")
    if args.json:
        helpers.validate_output_path(args.json, "--json")   # a folder, a missing or read-only one
    try:
        helpers.ensure_data()   # every row trains on Fashion-MNIST: on disk before the first
    except helpers.DataMissingError as e:
        raise ValueError(str(e)) from None


def plan(args, gpu):
    """The size, rounds and rows this run does (a row: trainer, devices or ranks, where)."""
    quick = args.quick or helpers.quick()
    with contextlib.redirect_stdout(io.StringIO()):
        size = dict(QUICK if args.quick else helpers.choose(FULL, CPU, tiny=QUICK))
    size["num_epochs"] = args.epochs or size["num_epochs"]
    size["subset"] = args.subset or size["subset"]
    rounds = args.rounds or (1 if quick else 3)
    compile_ok = not args.no_compile and (gpu or not quick)   # a CPU compile: tens of seconds
    wanted = args.rows or [r for r in IN_PROCESS + ON_RANKS if r != "fast-shared" or gpu]
    rows = []
    for name in IN_PROCESS:
        if name not in wanted or (name == "fast-shared" and not gpu and not args.rows):
            continue   # 2 simulated devices on a CPU run one after the other: asked for only
        if name == "fast-compile" and not compile_ok or name == "compile" and args.no_compile:
            continue   # compile without a compile budget (quick, CPU): dynamo's eager backend
        if name == "fast-compile" and not gpu or name == "fast-eager" and gpu:
            continue
        if name == "fast-eager" and not compile_ok:
            continue   # the fast row itself runs eagerly then
        rows.append(dict(trainer=name, n=2 if name == "fast-shared" else 1, where="process"))
    for k in args.ranks:
        for name in ON_RANKS:
            if name in wanted and (name != "scratch" or k > 1):
                rows.append(dict(trainer=name, n=k, where="ranks"))
    return quick, size, rounds, compile_ok, rows


# --- the rows ----------------------------------------------------------------------------------

def run_in_process(row, size, args, seed, gpu, compile_ok):
    kw = dict(num_epochs=size["num_epochs"], subset=size["subset"], seed=seed, plot=False)
    if row["trainer"] == "reference":
        fn = helpers.train
    elif row["trainer"] == "compile":
        return helpers.train_compiled(args.batch_size, args.lr, size["num_epochs"], size["subset"],
                                      seed, backend=None if compile_ok else "eager")
    else:
        fn = helpers.train_fast
        kw.update(verbose=False, compile=compile_ok and (row["trainer"] == "fast-compile"
                                                        or row["trainer"] == "fast" and not gpu))
        if row["trainer"] == "fast-shared":
            kw.update(replica_streams=gpu)
    with contextlib.redirect_stdout(io.StringIO()):   # the trainers' own lines: the table says it
        r = fn(row["n"], args.batch_size, args.lr, **kw)
    notes = [w for w, on in (("CUDA graph", r.get("used_graph")),
                             ("compiled", r.get("compiled"))) if on]
    return dict(epoch_times=r["epoch_times"], test_acc=r["test_acc"], note=", ".join(notes))


def run_on_ranks(row, size, args, seed, compile_ok):
    k, name = row["n"], row["trainer"]
    if name == "fast":
        cfg = dict(batch_size=args.batch_size, lr=args.lr, num_epochs=size["num_epochs"],
                   subset=size["subset"], seed=seed, compile=compile_ok)
        backend = helpers.choose_backend(k)
        r = helpers.launch(helpers.train_fast_rank, k, cfg, quiet=True, timeout=RANK_TIMEOUT)[0]
        note = f"{backend}, {helpers.plural(k, 'process')}" + (
            ", compiled" if r.compiled else "")
    else:
        got, backend = helpers.bench_ranks(k, [name], args.batch_size, args.lr,
                                           size["num_epochs"], size["subset"], seed,
                                           timeout=RANK_TIMEOUT)
        r, note = got[name], f"{backend}, {helpers.plural(k, 'process')}"
    return dict(epoch_times=r.epoch_times, test_acc=r.test_acc, note=note,
                param_sum=r.param_sum)


# --- the checks: same arithmetic, and the targets ------------------------------------------------

def same_arithmetic(size, args, steps, compile_ok):
    """Max |parameter difference| between Part II's train_batch and the fast trainer, fed the
    same batches (ResidentLoader's order) from the same start, after `steps` steps."""
    X, y = helpers.load_tensors(True, size["subset"])
    p0 = helpers.init_lenet_params(seed=args.seed)
    ref = [helpers.get_params(p0, "cpu")]
    nets = {"eager": helpers.FastDataParallel(p0, ["cpu"], args.lr, X, y)}
    if compile_ok:
        nets["compiled"] = helpers.FastDataParallel(p0, ["cpu"], args.lr, X, y, compile=True)
    loader = helpers.ResidentLoader(X, y, args.batch_size, seed=args.seed)
    batches = (loader.index_batches() * steps)[:steps]
    for idx in batches:
        helpers.train_batch(X[idx], y[idx], ref, ["cpu"], args.lr)
        for net in nets.values():
            net.step(idx)
    return {name: max((a - b).abs().max().item() for a, b in zip(ref[0], net.params[0]))
            for name, net in nets.items()}


def target_word(v):
    """'met' / 'NOT met' when the whole spread says so; from one round, that round's reading."""
    word = "met" if v["met"] else "NOT met"
    return word if v.get("rounds", helpers.MIN_ROUNDS) >= helpers.MIN_ROUNDS else (
        f"{word} in the one round (no spread: cannot tell)")


def judge(targets, rows, ratios):
    """The speed targets, each with its figure and whether the whole spread meets it (with
    `rounds`: from fewer than helpers.MIN_ROUNDS the spread is one sample, so cannot tell)."""
    key = {(r["trainer"], r["n"], r["where"]): r for r in rows}
    out = []

    def add(what, ratio, limit=1.0):
        if ratio is not None:
            out.append(dict(target=what, median=ratio["median"], spread=ratio["spread"],
                            limit=limit, met=ratio["spread"][0] > limit,
                            rounds=len(ratio["samples"])))
    if targets == "cpu":
        for r in rows:
            if r["where"] == "process" and r["trainer"] not in ("fast", "fast-eager"):
                add(f"fast faster than {r['trainer']}", ratios.get(f"fast_1_over_{r['name']}"))
        add("fast at least 2x the reference", ratios.get("fast_1_over_reference_1"), 2.0)
        for k in sorted({r["n"] for r in rows if r["where"] == "ranks"}):
            add(f"fast on {k} ranks faster than ddp on {k}",
                ratios.get(f"fast_ranks_{k}_over_ddp_ranks_{k}"))
    elif targets == "gpu":
        fast = key.get(("fast", 1, "process"))
        if fast:
            sec = fast["sec_per_epoch"]
            out.append(dict(target=f"fast <= {GPU_TARGETS['fast_sec']} s/epoch",
                            median=sec.median, spread=[sec.lo, sec.hi],
                            limit=GPU_TARGETS["fast_sec"], met=sec.hi <= GPU_TARGETS["fast_sec"],
                            rounds=len(sec.samples)))
        add(f"fast at least {GPU_TARGETS['fast_over_reference']:.0f}x the reference",
            ratios.get("fast_1_over_reference_1"), GPU_TARGETS["fast_over_reference"])
        shared = ratios.get("fast_1_over_fast-shared_2")   # two devices' time / one's
        if shared:
            lim = GPU_TARGETS["shared_over_one"]
            out.append(dict(target=f"2 devices sharing one GPU <= {lim}x one device's time",
                            median=shared["median"], spread=shared["spread"], limit=lim,
                            met=shared["spread"][1] <= lim, rounds=len(shared["samples"])))
        if len(out) < 3:
            print("bench: some GPU targets were not measured (their rows did not run)")
    return out


# --- the run -------------------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    gpu = torch.cuda.is_available()
    quick, size, rounds, compile_ok, rows = plan(args, gpu)
    if not gpu:
        torch.set_num_threads(1)   # one core per rank everywhere: rows compare like with like
    where = torch.cuda.get_device_name(0) if gpu else f"CPU ({os.cpu_count()} cores)"
    targets = args.targets if args.targets != "auto" else "none" if quick else (
        "gpu" if gpu else "cpu")
    label = "quick" if quick else "full" if size == FULL else "CPU"
    word = "round" if rounds == 1 else "rounds"
    print(f"bench: {label} size {size}, batch {args.batch_size}, lr {args.lr}, {rounds} {word} "
          f"(seeds {args.seed}-{args.seed + rounds - 1}), on {where}, torch {torch.__version__}")
    if not gpu:
        print("bench: no GPU: in-process rows use 1 thread, each rank is a gloo process with 1 "
              "thread on its own core; the figures are CPU figures, not GPU ones")
    if not compile_ok:
        print("bench: no torch.compile rows (--no-compile)" if args.no_compile else
              "bench: at quick size on a CPU a first compile alone costs tens of seconds: the "
              "compile row runs dynamo with its eager backend (the same step, no code "
              "generated), the other rows are not compiled")
    if importlib.util.find_spec("helpers.data_parallel.scratch") is None:
        rows = [r for r in rows if r["trainer"] != "scratch"]
        print("bench: DDPFromScratch rows skipped: helpers.data_parallel.scratch is not "
              "importable here")
    load = [helpers.machine_load()]
    t_start = time.perf_counter()
    for r in rows:
        r.update(name=f"{r['trainer']}_{r['n']}" if r["where"] == "process"
                 else f"{r['trainer']}_ranks_{r['n']}", rounds=[])
    for rnd in range(rounds):
        seed = args.seed + rnd
        for r in (rows if rnd % 2 == 0 else rows[::-1]):
            try:
                got = (run_in_process(r, size, args, seed, gpu, compile_ok)
                       if r["where"] == "process" else run_on_ranks(r, size, args, seed,
                                                                    compile_ok))
            except Exception as e:   # e.g. no compiler: say why, keep the other rows
                r["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                print(f"bench: {r['name']} failed in round {rnd + 1}: {r['error']}")
                continue
            t = got["epoch_times"]
            got.update(seed=seed, sec_per_epoch=helpers.Measurement(t[1:]).median,
                       first_epoch_extra_s=t[0] - helpers.Measurement(t[1:]).median)
            r["rounds"].append(got)
            print(f"bench: round {rnd + 1}/{rounds}: {r['name']}: {got['sec_per_epoch']:.3f} "
                  f"s/epoch, test acc {got['test_acc']:.3f}", flush=True)
        load.append(helpers.machine_load())
    rows = [r for r in rows if len(r["rounds"]) == rounds]   # a row that failed is left out
    if not rows:
        raise SystemExit("bench: every row failed (see above)")
    for r in rows:
        r["sec_per_epoch"] = helpers.Measurement([x["sec_per_epoch"] for x in r["rounds"]])
        r["test_acc"] = helpers.Measurement([x["test_acc"] for x in r["rounds"]], unit="")
        r["note"] = r["rounds"][-1]["note"]
    ratios = {}
    ref = next((r for r in rows if r["trainer"] == "reference"), None)
    pairs = [(r, ref) for r in rows if ref and r is not ref]
    fast = next((r for r in rows if r["name"] == "fast_1"), None)
    pairs += [(fast, r) for r in rows if fast and r["where"] == "process" and r is not fast
              and r is not ref]
    for r in rows:
        if r["trainer"] == "fast" and r["where"] == "ranks":
            pairs += [(r, o) for o in rows if o["where"] == "ranks" and o["n"] == r["n"]
                      and o is not r]
        if r["trainer"] == "scratch":               # the course's DDP against torch's
            pairs += [(r, o) for o in rows if o["name"] == f"ddp_ranks_{r['n']}"]
        if r["where"] == "ranks" and r["n"] > 1:   # k ranks against one
            pairs += [(r, o) for o in rows if o["name"] == f"{r['trainer']}_ranks_1"]
    for a, b in pairs:
        ratios[f"{a['name']}_over_{b['name']}"] = helpers.ratio(b["sec_per_epoch"],
                                                                 a["sec_per_epoch"]).to_dict()
    print_table(rows, ref)
    print("\nratios (speed: how many times as fast, round by round; > 1 is faster):")
    for name, v in ratios.items():
        spread = (f"{v['spread'][0]:.2f}-{v['spread'][1]:.2f}" if len(v["samples"]) >= 2 else
                  "one round, no spread")
        print(f"  {name}: {v['median']:.2f}x ({spread}) {v['verdict']}")
    if rounds < helpers.MIN_ROUNDS:
        print("  (one round: every verdict is 'cannot tell'; "
              f"--rounds {helpers.MIN_ROUNDS} or more gives a spread)")
    diffs = same_arithmetic(size, args, args.check_steps, compile_ok and not gpu)
    print(f"\nsame arithmetic: after {args.check_steps} steps from the same start on the same "
          "batches, max |parameter difference| from Part II's train_batch: "
          + ", ".join(f"fast {k} {v:.2g}" for k, v in diffs.items()))
    print("  (rows fed another order or rounding end elsewhere: near chance the 0.01-initialised "
          "LeNet amplifies any difference, so compare accuracies over the seeds)")
    verdicts = judge(targets, rows, ratios)
    for v in verdicts:
        print(f"target: {v['target']}: {v['median']:.3g} ({v['spread'][0]:.3g}-"
              f"{v['spread'][1]:.3g}): {target_word(v)}")
    load.append(helpers.machine_load())
    busy = [f"{x:.2f}" for x in load if x is not None]
    print(f"bench: {len(rows)} rows x {rounds} {word} in {time.perf_counter() - t_start:.0f} s;"
          f" machine load (1-min load average per core) {', '.join(busy) or 'unknown'}")
    if quick:
        print("bench: quick size: a few steps per epoch, so these figures are too short to "
              "compare; run without --quick for ratios")
    out = dict(quick=quick, size=size, rounds=rounds, batch_size=args.batch_size, lr=args.lr,
               seed=args.seed, device=where, torch=torch.__version__,
               python=platform.python_version(), cuda=torch.version.cuda,
               threads=torch.get_num_threads(), machine_load=load,
               rows=[dict(r, sec_per_epoch=r["sec_per_epoch"].to_dict(),
                          test_acc=r["test_acc"].to_dict()) for r in rows],
               ratios=ratios, same_arithmetic=dict(steps=args.check_steps, max_diff=diffs),
               targets=dict(kind=targets, verdicts=verdicts),
               argv=sys.argv[1:] if argv is None else list(argv),
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    if args.json:
        helpers.write_json(args.json, out, indent=1)
        print(f"bench: results written to {args.json}")
    return out


def print_table(rows, ref):
    print(f"\n{'trainer':<12} {'n':>2} {'s/epoch':>8} {'spread':>15} {'test acc':>18} "
          f"{'1st ep +s':>9} {'speed':>6}  note")
    for r in rows:
        s, a = r["sec_per_epoch"], r["test_acc"]
        speed = f"{ref['sec_per_epoch'].median / s.median:.2f}x" if ref else "-"
        extra = helpers.Measurement([x["first_epoch_extra_s"] for x in r["rounds"]]).median
        where = (helpers.plural(r["n"], "rank") if r["where"] == "ranks" else
                 helpers.plural(r["n"], "device"))
        print(f"{r['trainer']:<12} {r['n']:>2} {s.median:>8.3f} {s.lo:>7.3f}-{s.hi:<7.3f} "
              f"{a.median:>6.3f} ({a.lo:.3f}-{a.hi:.3f}) {extra:>9.1f} {speed:>6}  "
              f"{where}; {r['note']}")


if __name__ == "__main__":
    main()
