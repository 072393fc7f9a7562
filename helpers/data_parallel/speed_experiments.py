"""Part IV: real data-parallel workers on a CPU -- k gloo processes, one thread each, pinned.

Simulated devices in one process run one after another, so their timings say nothing about
parallel speed. Here each worker is its own process with one thread on its own core (as far as
there are cores), and the k workers train LeNet on their slices of the same global batches,
summing gradients with `torch.distributed.all_reduce` (gloo). A worker times each step's compute
(forward + backward), its communication (the all-reduce, including any wait for the other
workers) and its update, so a step's split is measured, not assumed; and, to say where a worker's
time went, its thread's CPU time during compute (wall time above it is time off its core) and,
on the clock all the machine's processes share, when each worker arrived at the all-reduce (the
wait for the last one, and the time after it).

The workers are launch targets fn(rank, world, cfg) (helpers.launch): a spawned rank imports
its function by name, so they live here rather than in a notebook.
"""
import statistics
import time
from typing import NamedTuple

import torch

from ..devices import synced_now, synchronize
from ..runtime.group import choose_backend, pin_to_core
from ..runtime.launch import launch, take
from ..runtime.progress import report_progress
from ..timing import turn_order
from .results import EpochRun, RankSums, WorkerSweep, WorkerTimes

__all__ = ["dp_timing_worker", "time_data_parallel", "allreduce_compare_worker",
           "compare_with_dist_all_reduce", "lenet_module_from",
           "bench_worker", "bench_ranks", "gloo_allreduce_worker", "time_gloo_allreduce"]

MODES = ("fast", "reference")   # one flat all-reduce + fused update / one per parameter tensor


class _Run(NamedTuple):
    name: str
    global_batch: int
    steps: int
    reps: int
    mode: str
    return_params: bool


def _read_run(run):
    """One run of cfg["runs"], read by `take`: a misspelt key is refused, not run as the
    default."""
    try:
        return _Run(*take(run, "name", "global_batch", "steps", "reps", mode="fast",
                          return_params=False))
    except TypeError as e:
        raise TypeError(f"run {run.get('name', run)!r}: {e}") from None


def _flat_params(params):
    """Parameters as views into one flat buffer, gradients as views into another (fast mode)."""
    from .fast import flat_replica
    return flat_replica(params, torch.device("cpu"))


class _Trainer:
    """One rank's share of one timing run for k workers: its own LeNet (same initialisation on
    every rank) and its own generator of global batches (the same on every rank and every k)."""

    def __init__(self, run, k, lr, seed):
        from ..models import init_lenet_params
        self.B, self.mode, self.k, self.lr = run.global_batch, run.mode, k, lr
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: use one of {MODES}")
        if self.B % k:
            raise ValueError(f"global batch {self.B} does not split evenly over {k} workers")
        if self.mode == "fast":
            self.flat, self.flat_grad, self.params = _flat_params(init_lenet_params(seed=seed))
        else:
            self.params = [p.requires_grad_() for p in init_lenet_params(seed=seed)]
            for p in self.params:
                p.grad = torch.zeros_like(p)
        self.g = torch.Generator().manual_seed(seed)

    def repeat(self, steps, rank, X, y, group):
        """`steps` SGD steps; seconds per step of the whole, compute, all-reduce, update and the
        compute's CPU time on this thread (on the CPU: gloo ranks, one core each), and each
        step's (arrival at the all-reduce, its end) on the clock the processes share."""
        import torch.distributed as dist

        from ..models import lenet, loss
        from .simulated import sgd
        comp = comm = upd = cpu = 0.0
        arrivals = []
        t_start = synced_now()
        for _ in range(steps):
            idx = torch.randint(0, X.shape[0], (self.B,), generator=self.g)
            idx = idx.tensor_split(self.k)[rank]
            t0, c0 = synced_now(), time.thread_time()
            loss(lenet(X[idx], self.params), y[idx]).sum().backward()
            t1, c1 = synced_now(), time.thread_time()
            if self.k > 1:
                if self.mode == "fast":
                    dist.all_reduce(self.flat_grad, group=group)    # one message
                else:
                    for p in self.params:                           # one message per tensor
                        dist.all_reduce(p.grad, group=group)
            t2 = synced_now()
            if self.mode == "fast":
                with torch.no_grad():
                    self.flat.sub_(self.flat_grad, alpha=self.lr / self.B)
                    self.flat_grad.zero_()
            else:
                sgd(self.params, self.lr, self.B)
            t3 = synced_now()
            comp, comm, upd, cpu = comp + t1 - t0, comm + t2 - t1, upd + t3 - t2, cpu + c1 - c0
            arrivals.append((t1, t2))
        total = synced_now() - t_start
        return [v / steps for v in (total, comp, comm, upd, cpu)], arrivals


def _waits(arrivals, k):
    """Per repeat, seconds per step that rank 0 waited in the all-reduce for the last of the k
    ranks to arrive, and that passed from that arrival to rank 0's end of the all-reduce, from
    every rank's `arrivals` (lists of repeats of (arrival, end) per step; time.perf_counter is
    CLOCK_MONOTONIC on Linux, one clock for the machine's processes)."""
    wait, after = [], []
    for r, steps in enumerate(arrivals[0]):
        last = [max(arrivals[q][r][j][0] for q in range(k)) for j in range(len(steps))]
        wait.append(statistics.mean(t - a for (a, _), t in zip(steps, last, strict=True)))
        after.append(statistics.mean(e - t for (_, e), t in zip(steps, last, strict=True)))
    return wait, after


def dp_timing_worker(rank, world, cfg):
    """Launch target (gloo): time every run of cfg['runs'] for every worker count of cfg['ks'],
    the runs and counts taking turns in one set of processes; rank 0 returns them, a
    results.WorkerSweep."""
    # cfg: ks (worker counts, at most world), runs (dicts: name, global_batch, steps, reps,
    #   mode 'fast' or 'reference', return_params), subset (training images), lr, seed.
    # The runs take turns in every repeat (the order reversed every other repeat), and so do the
    # counts within each run, so that they share the same conditions (a machine's load drifts):
    # sample i of every run and count comes from repeat i, and their ratios can be paired (hence
    # its own list of runs, not run_ranks', which runs each experiment once, in turn). For k
    # workers, ranks 0..k-1 train (a process group of their own) while the others wait at a
    # barrier. Repeat 0 warms up and is not kept. Besides step_s, compute_s, comm_s and update_s
    # (rank 0's), compute_cpu_s is rank 0's CPU time of compute, and wait_s and after_s split its
    # comm_s: waiting for the last rank to arrive, and the rest (see _waits). Every k trains on
    # the same global batches: `torch.randint(0, n, (B,))` from a generator seeded with `seed`,
    # rank r taking its `tensor_split` slice.
    import torch.distributed as dist

    from ..data import load_tensors
    core = pin_to_core(rank)
    ks, runs, subset, lr, seed = take(cfg, "ks", "runs", subset=4096, lr=0.2, seed=0)
    runs = [_read_run(run) for run in runs]
    groups = {k: dist.new_group(list(range(k))) if 1 < k < world else None
              for k in ks}                       # every rank must call new_group
    X, y = load_tensors(True, subset)
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"run names must differ: {names}")
    trainers = {run.name: {k: _Trainer(run, k, lr, seed) if rank < k else None for k in ks}
                for run in runs}
    keys = ("step_s", "compute_s", "comm_s", "update_s", "compute_cpu_s")
    out = {name: {k: {key: [] for key in keys} for k in ks} for name in names}
    arrive = {name: {k: [] for k in ks} for name in names}
    done, total = 0, sum(run.reps + 1 for run in runs)
    for r in range(max(run.reps for run in runs) + 1):   # the runs take turns too
        for run in turn_order(runs, r):
            if r > run.reps:
                continue
            done += 1
            report_progress(done, total, "timed repeat")
            for k in ks:
                if world > 1:
                    dist.barrier()
                if rank < k:
                    times, steps = trainers[run.name][k].repeat(run.steps, rank, X, y, groups[k])
                    if r > 0:
                        for key, v in zip(keys, times, strict=True):
                            out[run.name][k][key].append(v)
                        arrive[run.name][k].append(steps)
    every = [arrive]
    if world > 1:
        every = [None] * world
        dist.all_gather_object(every, arrive)
    for name in names:
        for k in ks:
            wait, after = (_waits([a[name][k] for a in every[:k]], k) if k > 1 else
                           ([0.0] * len(out[name][k]["comm_s"]),
                            list(out[name][k]["comm_s"])))   # one worker: no one to wait for
            out[name][k]["wait_s"], out[name][k]["after_s"] = wait, after
    times = {k: {} for k in ks}
    for run in runs:
        for k in ks:
            params = ([p.detach().tolist() for p in trainers[run.name][k].params]
                      if run.return_params and rank < k else None)
            times[k][run.name] = WorkerTimes(**out[run.name][k], params=params)
    cores = [core]
    if world > 1:
        cores = [None] * world
        dist.all_gather_object(cores, core)
    if rank == 0:
        return WorkerSweep(times=times, cores=cores, threads=torch.get_num_threads())


def time_data_parallel(ks, runs, subset=4096, lr=0.2, seed=0, quiet=False, timeout=300.0):
    """Time the data-parallel `runs` (see dp_timing_worker) for each worker count in `ks` (an int
    or a list), on max(ks) gloo worker processes with one thread each, pinned to cores; the
    counts take turns in the same processes. Returns a results.WorkerSweep: .times[k][name]
    a results.WorkerTimes (seconds per step, one per repeat), .cores (the core of each rank).
    `timeout`: seconds the whole run may take (helpers.launch's; a busy
    machine needs more)."""
    ks = [ks] if isinstance(ks, int) else sorted(set(ks))
    if not ks or ks[0] < 1:
        raise ValueError(f"worker counts must be at least 1, got {ks}")
    for run in map(_read_run, runs):
        if run.reps < 1 or run.steps < 1:
            raise ValueError(f"run {run.name!r}: reps and steps must be at least 1")
        bad = [k for k in ks if run.global_batch % k]
        if bad:
            raise ValueError(f"run {run.name!r}: global batch {run.global_batch} does not "
                             f"split evenly over {bad} workers")
    cfg = {"ks": ks, "runs": list(runs), "subset": subset, "lr": lr, "seed": seed}
    return launch(dp_timing_worker, ks[-1], cfg, backend="gloo", quiet=quiet,
                  timeout=timeout)[0]


# --- correctness across processes (tests): the course's allreduces against torch's --------------

def allreduce_compare_worker(rank, world, cfg):
    """Launch target: all_reduce (sum) rank-seeded tensors of cfg['shapes'] with
    torch.distributed, on the rank's device (cfg['device']: NCCL needs CUDA tensors); rank 0
    returns the inputs of every rank and the results, on the CPU, for comparison in one
    process: a results.RankSums."""
    import torch.distributed as dist
    shapes, seed, device = take(cfg, "shapes", "seed", "device")
    g = torch.Generator().manual_seed(seed + rank)
    mine = [torch.randn(s, generator=g) for s in shapes]
    inputs = [None] * world
    dist.all_gather_object(inputs, mine)      # CPU copies: nothing pickled from a GPU
    sums = [t.to(device) for t in mine]
    for t in sums:
        dist.all_reduce(t)
    if rank == 0:
        return RankSums(inputs=inputs, sums=[t.cpu() for t in sums])


def compare_with_dist_all_reduce(shapes, world_size=2, seed=0):
    """Inputs of each rank and torch.distributed.all_reduce's sums, as tensors:
    (inputs[rank][i], sums[i])."""
    got = launch(allreduce_compare_worker, world_size, dict(shapes=shapes, seed=seed),
                 backend="gloo", quiet=True)[0]
    return got.inputs, got.sums


# --- the benchmark's library rows: torch DDP and DDPFromScratch on real ranks (scripts/bench.py) --

def lenet_module_from(params):
    """helpers.lenet_module() holding the functional LeNet's `params` (the same initialisation as
    the from-scratch trainers; the dense weights are stored transposed in nn.Linear)."""
    from ..models import lenet_module
    net = lenet_module()
    convs = [m for m in net if isinstance(m, torch.nn.Conv2d)]
    dense = [m for m in net if isinstance(m, torch.nn.Linear)]
    W1, b1, W2, b2, W3, b3, W4, b4 = params
    with torch.no_grad():
        for m, (w, b) in zip(convs + dense, [(W1, b1), (W2, b2), (W3.T, b3), (W4.T, b4)],
                             strict=True):
            m.weight.copy_(w)
            m.bias.copy_(b)
    return net


def bench_worker(rank, world, cfg):
    """Launch target for scripts/bench.py: train LeNet with each wrapper in cfg['wrappers']
    ('ddp': torch's DistributedDataParallel, 'scratch': helpers.DDPFromScratch) from the same
    initialisation, batch cfg['batch_size'] split over the ranks, SGD at cfg['lr'], on the
    resident data in ResidentLoader's order. Rank 0 returns per wrapper a results.EpochRun:
    epoch_times, test_acc, param_sum, peak_mem_mib. NCCL with one GPU per rank, or gloo on CPUs
    with one thread per rank, pinned."""
    import torch.distributed as dist
    from torch.nn import functional as F

    from ..data import load_tensors
    from ..models import init_lenet_params
    from .fast import ResidentLoader
    from .scratch import DDPFromScratch
    device, wrappers, batch_size, lr, num_epochs, subset, seed = take(
        cfg, "device", "wrappers", "batch_size", "lr", "num_epochs", "subset", "seed")
    nccl = device.type == "cuda"
    if not nccl:
        pin_to_core(rank)
    X, y = load_tensors(True, subset, device)
    X_test, y_test = load_tensors(False, subset, device)
    results = {}
    for wrapper in wrappers:
        net = lenet_module_from(init_lenet_params(seed=seed)).to(device)
        if wrapper == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(
                net, device_ids=[device.index] if nccl else None)
        else:
            model = DDPFromScratch(net)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        loader = ResidentLoader(X, y, batch_size, seed=seed)
        if nccl:
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for epoch in range(num_epochs):
            report_progress(epoch + 1, num_epochs, f"{wrapper} epoch")
            dist.barrier()
            t0 = synced_now(device)
            for idx in loader.index_batches():
                idx = idx.tensor_split(world)[rank]
                loss = F.cross_entropy(model(X[idx]), y[idx])   # mean; ranks average
                opt.zero_grad(set_to_none=False)
                loss.backward()
                if wrapper == "scratch":
                    model.finish_gradient_synchronization()
                opt.step()
            synchronize(device)
            dist.barrier()
            times.append(synced_now(device) - t0)
        with torch.no_grad():
            correct = sum(int((net(Xc).argmax(1) == yc).sum())
                          for Xc, yc in zip(X_test.split(2048), y_test.split(2048), strict=True))
        results[wrapper] = EpochRun(
            epoch_times=times, test_acc=correct / len(y_test),
            param_sum=float(sum(p.detach().double().abs().sum() for p in net.parameters())),
            peak_mem_mib=torch.cuda.max_memory_allocated(device) / 2**20 if nccl else None)
    if rank == 0:
        return results


def bench_ranks(world_size, wrappers, batch_size=256, lr=0.2, num_epochs=3, subset=None, seed=0,
                timeout=3600.0):
    """Run bench_worker on `world_size` ranks (NCCL, one per GPU, when there are enough GPUs;
    else gloo processes on the CPU, one thread each) and return rank 0's results and backend.
    `timeout`: seconds the ranks may take (a busy machine's full-size run takes minutes)."""
    if batch_size % world_size:
        raise ValueError(f"batch {batch_size} does not split evenly over {world_size} ranks")
    backend = choose_backend(world_size)
    cfg = dict(wrappers=list(wrappers), batch_size=batch_size, lr=lr, num_epochs=num_epochs,
               subset=subset, seed=seed)
    return launch(bench_worker, world_size, cfg, backend=backend, quiet=True,
                  timeout=timeout)[0], backend


# --- one all-reduce, timed across processes (scaling.ipynb's alpha-beta fit) --------------------
def gloo_allreduce_worker(rank, world, cfg):
    """Launch target: time all_reduce of float32 tensors of cfg['sizes'] elements (the fastest
    of cfg['reps'] calls: other processes' noise only adds time; every call's seconds with
    cfg['keep'] 'all'); rank 0 returns {size: seconds}. On NCCL each rank uses its own GPU
    (cfg['device'])."""
    import torch.distributed as dist
    device, sizes, reps, keep = take(cfg, "device", "sizes", "reps", keep="min")
    results = {}
    warm = torch.ones(1024, device=device)
    for _ in range(10):                # connection set-up, first-call costs
        dist.all_reduce(warm)
    for i, n in enumerate(sizes):
        report_progress(i + 1, len(sizes), "message size")
        x = torch.ones(n, device=device)
        times = []
        for r in range(reps + 2):      # two warm-up calls
            dist.barrier()
            t0 = synced_now(device)
            dist.all_reduce(x)
            if r >= 2:
                times.append(synced_now(device) - t0)
        results[n] = min(times) if keep == "min" else times
        if x[0].item() != world ** (reps + 2):
            raise RuntimeError(f"all_reduce gave {x[0].item()}, expected "
                               f"{world ** (reps + 2)}")
    if rank == 0:
        return results


def time_gloo_allreduce(sizes, world_size=2, reps=5, backend="gloo", quiet=False, keep="min"):
    """Start `world_size` ranks and return {elements: seconds} of one all_reduce: the fastest of
    `reps` calls, or with keep='all' the list of every call's seconds (a barrier before each)."""
    if keep not in ("min", "all"):
        raise ValueError(f"keep={keep!r}: 'min' (the fastest call) or 'all' (every call)")
    cfg = dict(sizes=list(sizes), reps=reps, keep=keep)
    return launch(gloo_allreduce_worker, world_size, cfg, backend=backend, quiet=quiet)[0]
