"""Launch targets on the fake GPUs of tests/fake_cuda.py: one that runs other targets there, the
canaries (a small step done right, or with one mistake each) and a fake GPU whose collectives
take time."""
import dataclasses
import os
import time
import traceback

import torch
import torch.distributed as dist
from fake_cuda import _REAL_CLOCK, FakeGPU, NotOnItsGPU, index_of, where_raised
from torch.utils._pytree import tree_leaves


# ---- a launch target that runs another on the fake GPUs -----------------------------------------
def on_fake_gpus(rank, world, cfg):
    """Launch target: each of cfg["runs"] [(label, fn, kwargs)] on this rank's fake GPU
    (cuda:rank, NCCL rules), in turn. Returns {label: dict(problems, error, result_on_gpu,
    seconds)}. A rank that fails leaves the process group at once (a peer waiting in a
    collective then fails too, instead of hanging) and every rank joins a fresh group before
    the next target."""
    import datetime
    store = dist.distributed_c10d._get_default_store()
    timeout = datetime.timedelta(seconds=cfg.get("timeout", 30))
    report = {}
    for k, (label, fn, kwargs) in enumerate(cfg["runs"]):
        gpu = FakeGPU(rank, world)
        error, on_gpu, t0 = None, [], _REAL_CLOCK()
        try:
            with gpu.active():
                got = fn(rank, world, dict(kwargs, device=torch.device("cuda", rank)))
                on_gpu = sorted({str(tuple(t.shape)) for t in tree_leaves(_opened(got))
                                 if isinstance(t, torch.Tensor) and index_of(t) is not None})
        except (Exception, BaseException) as e:   # reported per target
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            if not isinstance(e, NotOnItsGPU):
                gpu.note("crashed", error + ("\n" + traceback.format_exc()[-3000:]
                                             if os.environ.get("FAKE_CUDA_TRACEBACK") else ""),
                         where_raised(e.__traceback__))
            if os.environ.get("FAKE_CUDA_TRACEBACK"):
                error += "\n" + "".join(traceback.format_exc().splitlines(True)[-12:])
            dist.destroy_process_group()
        report[label] = dict(problems=gpu.problems, error=error, result_on_gpu=on_gpu,
                             seconds=_REAL_CLOCK() - t0)
        store.set(f"fake/{k}/{rank}", "fail" if error else "ok")
        states = [store.get(f"fake/{k}/{r}").decode() for r in range(world)]
        if "fail" in states:
            if dist.is_initialized():
                dist.destroy_process_group()
            dist.init_process_group("gloo", store=dist.PrefixStore(f"fake/{k}/group", store),
                                    rank=rank, world_size=world, timeout=timeout)
    return report


def _opened(obj):
    """obj with every dataclass (a launch target's result) as a dict of its fields, so that
    tree_leaves finds the tensors inside."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _opened(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _opened(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_opened(v) for v in obj]
    return obj


def describe(problems):
    """Problems [(kind, where, what)] as lines for an assertion message."""
    return [f"{kind} at {at}: {what}" for kind, at, what in problems]


# ---- canaries: launch targets that make one mistake each, on purpose ----------------------------
CANARIES = {"cpu_collective": "a CPU tensor in an NCCL collective",
            "cpu_model": "mixes devices", "cpu_compute": "computes on the CPU",
            "timer": "a timer that does not synchronise",
            "cpu_profiler": "profiles a GPU without its kernels", "none": None}


def canary(rank, world, cfg):
    """Launch target: a small step done right (bug="none") or with one mistake (cfg["bug"])."""
    device, bug = cfg["device"], cfg["bug"]
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 4)
    if bug != "cpu_model":
        net = net.to(device)
    X = torch.randn(16, 8, device=None if bug == "cpu_compute" else device)
    if bug == "cpu_compute":
        net = net.cpu()
    from helpers.devices import synced_now
    start = time.perf_counter() if bug == "timer" else synced_now(device)
    loss = net(X).square().mean()
    loss.backward()
    flag = torch.ones(1, device=None if bug == "cpu_collective" else device)
    dist.all_reduce(flag)
    if bug == "cpu_profiler":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            net(X).sum()
    seconds = (time.perf_counter() if bug == "timer" else synced_now(device)) - start
    return dict(loss=float(loss), seconds=seconds, weight=net.weight.detach().cpu())


# ---- a fake GPU whose all-reduces take time: what a host clock would miss ------------------------
def slow_comm(rank, world, cfg):
    """Launch target: each of cfg["runs"] [(label, fn, kwargs)] on this rank's fake GPU, whose
    collectives (those named in cfg["comm_ops"] if given) take cfg["comm"] seconds each on the
    GPU (a dict: {label: seconds}) while their futures complete at once (as NCCL's do at
    launch). Returns {label: dict(result, problems)}."""
    out = {}
    for label, fn, kwargs in cfg["runs"]:
        comm = cfg["comm"]
        gpu = FakeGPU(rank, world, comm_ops=cfg.get("comm_ops"),
                      comm_seconds=comm[label] if isinstance(comm, dict) else comm)
        with gpu.active():
            got = fn(rank, world, dict(kwargs, device=torch.device("cuda", rank)))
        out[label] = dict(result=got, problems=gpu.problems)
    return out


# ---- a sharded clip on a rank that holds no shard ------------------------------------------------
def clip_without_a_shard(rank, world, cfg):
    """Launch target: a sharded clip where the last rank holds no shard (a world bigger than the
    model): the notebook's clip_sharded (cfg["source"], its solution cell) or the course's
    clip_sharded_grad_norm_. Each other rank's shard holds 4 gradients of 3: a norm other than
    the whole gradient's raises (on_fake_gpus reports the error)."""
    if cfg.get("source"):
        space = {"torch": torch}
        exec(compile(cfg["source"], "fsdp_scratch.ipynb:clip_sharded", "exec"), space)
        clip = space["clip_sharded"]
    else:
        from helpers import clip_sharded_grad_norm_ as clip
    shards = []
    if rank < world - 1:
        shards = [torch.nn.Parameter(torch.ones(4, device=cfg["device"]))]
        shards[0].grad = torch.full((4,), 3.0, device=cfg["device"])
    norm, want = float(clip(shards, 1.0)), 3.0 * (4 * (world - 1)) ** 0.5
    if abs(norm - want) > 1e-4 * want:
        raise AssertionError(f"rank {rank}: norm {norm}, the whole gradient's is {want}")
    return norm
