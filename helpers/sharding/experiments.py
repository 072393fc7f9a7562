"""Part III and V: experiments that run on several processes, started from a notebook or a test.

`run_ranks(world, [("ddp", {...}), ...])` starts `world` processes once (mp.spawn) and runs the
named experiments in order on every rank; it returns, per rank, {experiment name: result}.
Workers live here because mp.spawn cannot pickle a function defined in a notebook.
Each experiment compares the distributed run with one process trained on the combined batch
(computed on every rank, from the same seeds) and returns numbers, never booleans.
"""
import copy
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F

from ..compare import max_diff, rel_diff
from ..data_parallel.scratch import DDPFromScratch
from ..runtime.group import free_port, setup, teardown
from ..runtime.traffic import count_traffic
from ..tiny_models import make_batches, make_model
from .fsdp_scratch import FSDPFromScratch
from .torch_api import fsdp2_model, full_params
from .zero import ShardedOptimizer, Zero2, optimizer_state_bytes

__all__ = ["run_ranks", "EXPERIMENTS"]


def loss_fn(out, y):
    return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))


def params_of(module):
    return {n: p.detach().clone().cpu() for n, p in module.named_parameters()}


def local(batch, rank, world, device):
    X, y = batch
    return X.tensor_split(world)[rank].to(device), y.tensor_split(world)[rank].to(device)


def adamw_groups(module, lr=1e-3, weight_decay=0.1):
    """Two param groups, as in practice: weight decay on matrices, none on biases and norms."""
    ps = [p for p in module.parameters() if p.requires_grad]
    return [dict(params=[p for p in ps if p.dim() >= 2], weight_decay=weight_decay),
            dict(params=[p for p in ps if p.dim() < 2], weight_decay=0.0)], dict(lr=lr)


def train_reference(kind, batches, device, num_steps, optim="adamw", compute_dtype=None,
                    sizes=None):
    """One process, the combined batch, the same init: what every distributed run must equal."""
    model = make_model(kind, **(sizes or {})).to(device)
    opt = make_optimizer(model, optim)
    for X, y in batches[:num_steps]:
        X, y = X.to(device), y.to(device)
        if compute_dtype is None:
            loss = loss_fn(model(X), y)
            loss.backward()
        else:   # low-precision copy for the compute, fp32 master weights and gradients
            low = copy.deepcopy(model).to(compute_dtype)
            Xl = X.to(compute_dtype) if X.is_floating_point() else X
            loss_fn(low(Xl).float(), y).backward()
            for p, q in zip(model.parameters(), low.parameters()):
                p.grad = q.grad.float()
        opt.step()
        opt.zero_grad()
    return params_of(model)


def make_optimizer(module, optim):
    """"sgd": SGD with momentum; "adamw" or "adamw_groups": AdamW with two param groups;
    "sgd_groups": SGD with momentum and the same two groups (weight decay on matrices)."""
    if optim == "sgd":
        return torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    groups, kw = adamw_groups(module)
    if optim == "sgd_groups":
        return torch.optim.SGD(groups, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(groups, **kw)


def exp_ddp(rank, world, device, cases, num_steps=3, batch_size=8):
    """DDPFromScratch and torch's DDP against one process, for each (model kind, bucket_mb)."""
    out = []
    for kind, bucket_mb in cases:
        batches = make_batches(kind, num_steps, batch_size)
        ref = train_reference(kind, batches, device, num_steps, optim="sgd")
        diffs = {}
        for impl in ("scratch", "torch"):
            # different init per rank: broadcast fixes it
            net = make_model(kind, seed=rank).to(device)
            if impl == "scratch":
                model = DDPFromScratch(net, bucket_mb=bucket_mb)
            else:
                model = nn.parallel.DistributedDataParallel(
                    net, bucket_cap_mb=bucket_mb if bucket_mb is not None else 25)
            opt = make_optimizer(model.module, "sgd")
            for batch in batches:
                X, y = local(batch, rank, world, device)
                with count_traffic() as log:
                    loss_fn(model(X), y).backward()
                    if impl == "scratch":
                        model.finish_gradient_synchronization()
                opt.step()
                opt.zero_grad()
            diffs[impl] = max_diff(params_of(model.module), ref)
            if impl == "scratch":
                diffs["calls"] = log.calls["all_reduce"]   # all-reduces in the last step
                diffs["num_buckets"] = len(model.buckets)
                diffs["sizes"] = [len(b) for b in model.buckets]
        out.append(dict(kind=kind, bucket_mb=bucket_mb, **diffs,
                        num_trainable=sum(1 for p in net.parameters() if p.requires_grad)))
    return out


def exp_timeline(rank, world, device, bucket_mb=None, sizes=None, repeats=3):
    """When each gradient is ready and each all-reduce is launched, relative to backward's start
    and end (seconds); the last of `repeats` steps (the first ones warm up)."""
    model = DDPFromScratch(make_model("mlp", **(sizes or {})).to(device), bucket_mb=bucket_mb)
    X, y = local(make_batches("mlp", 1, 64, d_in=(sizes or {}).get("d_in", 32))[0], rank, world,
                 device)
    for _ in range(repeats):
        loss = loss_fn(model(X), y)
        t0 = time.perf_counter()
        loss.backward()
        t1 = time.perf_counter()
        model.finish_gradient_synchronization()
        t2 = time.perf_counter()
        model.zero_grad()
    return dict(events=[(t - t0, what, i) for t, what, i in model.timeline],
                backward_s=t1 - t0, finish_s=t2 - t0, num_buckets=len(model.buckets))


def exp_zero1(rank, world, device, num_steps=5, batch_size=8, sizes=None, optim="adamw"):
    """ShardedOptimizer(AdamW or SGD with momentum, two param groups) and torch's
    ZeroRedundancyOptimizer against the unsharded optimizer; and the state each rank holds."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    batches = make_batches("mlp", num_steps, batch_size)
    ref = train_reference("mlp", batches, device, num_steps, sizes=sizes, optim=optim + "_groups")
    cls = torch.optim.AdamW if optim == "adamw" else torch.optim.SGD
    res = {}
    for impl in ("scratch", "torch"):
        model = DDPFromScratch(make_model("mlp", **(sizes or {})).to(device))
        groups, kw = adamw_groups(model.module)
        if optim == "sgd":
            kw = dict(lr=0.05, momentum=0.9)
        if impl == "scratch":
            opt = ShardedOptimizer(groups, cls, **kw)
        else:
            opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=cls,
                                          weight_decay=groups[0]["weight_decay"], **kw)
            opt.add_param_group(groups[1])
        for batch in batches:
            X, y = local(batch, rank, world, device)
            loss_fn(model(X), y).backward()
            model.finish_gradient_synchronization()
            opt.step()
            opt.zero_grad()
        state = optimizer_state_bytes(opt.local) if impl == "scratch" and opt.local else \
            optimizer_state_bytes(opt.optim) if impl == "torch" else 0
        res[impl] = dict(diff=max_diff(params_of(model.module), ref), state_bytes=state,
                         params=params_of(model.module))
    between = max_diff(res["scratch"].pop("params"), res["torch"].pop("params"))
    return dict(res, scratch_vs_torch=between,
                param_bytes=sum(p.numel() * 4 for p in model.module.parameters()),
                largest=max(p.numel() for p in model.module.parameters()))


def exp_zero2(rank, world, device, num_steps=5, batch_size=8, bucket_mb=None, sizes=None):
    """Zero2 (AdamW, weight decay on every parameter) against one process."""
    batches = make_batches("mlp", num_steps, batch_size)
    ref_model = make_model("mlp", **(sizes or {})).to(device)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-3, weight_decay=0.1)
    for X, y in batches:
        loss_fn(ref_model(X.to(device)), y.to(device)).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    model = Zero2(make_model("mlp", **(sizes or {})).to(device), torch.optim.AdamW,
                  bucket_mb=bucket_mb, lr=1e-3, weight_decay=0.1)
    for batch in batches:
        X, y = local(batch, rank, world, device)
        loss_fn(model(X), y).backward()
        model.finish_gradient_synchronization()
        grad_bytes = sum(s.grad.numel() * 4 for s in model.shards) + sum(
            p.grad.numel() * 4 for p in model.module.parameters() if p.grad is not None)
        model.step()
        model.zero_grad()
    return dict(diff=max_diff(params_of(model.module), params_of(ref_model)),
                grad_bytes=grad_bytes, state_bytes=optimizer_state_bytes(model.optimizer))


def exp_fsdp(rank, world, device, kind="lm", compute_dtype=None, num_steps=4, batch_size=8,
             sizes=None, optim="adamw"):
    """FSDPFromScratch against one process (fp32, or low precision against a one-process run
    with the same low-precision compute); also the fp32 run, to size the precision's own effect."""
    dtype = getattr(torch, compute_dtype) if compute_dtype else None
    batches = make_batches(kind, num_steps, batch_size)
    model = FSDPFromScratch(make_model(kind, seed=rank, **(sizes or {})).to(device),
                            compute_dtype=dtype)
    opt = plain_optimizer(model.parameters(), optim)
    losses = []
    for batch in batches:
        X, y = local(batch, rank, world, device)
        loss = loss_fn(model(X), y)
        loss.backward()
        model.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    full = model.gather_full_params()
    ref = ref_nodecay(kind, batches, device, num_steps, dtype, sizes, optim)
    start = params_of(make_model(kind, **(sizes or {})))
    res = dict(diff=max_diff(full, ref), rel_diff=rel_diff(full, ref, start),
               shard_bytes=sum(p.numel() * 4 for p in model.parameters()),
               full_bytes=sum(t.numel() * 4 for t in full.values()),
               state_bytes=optimizer_state_bytes(opt), peak_gathered_bytes=model.peak_live_bytes,
               losses=losses)
    if dtype is not None:
        fp32 = ref_nodecay(kind, batches, device, num_steps, None, sizes, optim)
        res["precision_gap"] = max_diff(fp32, ref)
        res["rel_precision_gap"] = rel_diff(fp32, ref, start)
    return res


def plain_optimizer(params, optim):
    """One param group: AdamW (lr 1e-3, no weight decay) or SGD (lr 0.05, momentum 0.9)."""
    if optim == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)


def ref_nodecay(kind, batches, device, num_steps, dtype, sizes, optim="adamw"):
    """One process on the combined batch, one param group (the FSDP runs step all shards alike);
    with `dtype`, a low-precision copy computes and the fp32 weights take its gradients."""
    model = make_model(kind, **(sizes or {})).to(device)
    opt = plain_optimizer(model.parameters(), optim)
    for X, y in batches[:num_steps]:
        X, y = X.to(device), y.to(device)
        if dtype is None:
            loss_fn(model(X), y).backward()
        else:
            low = copy.deepcopy(model).to(dtype)
            loss_fn(low(X.to(dtype) if X.is_floating_point() else X).float(), y).backward()
            for p, q in zip(model.parameters(), low.parameters()):
                p.grad = q.grad.float()
        opt.step()
        opt.zero_grad()
    return params_of(model)


def exp_fsdp2(rank, world, device, kind="mlp", compute_dtype=None, num_steps=4, batch_size=8,
              sizes=None):
    """fully_shard per layer against one process and against FSDPFromScratch (same dtype)."""
    dtype = getattr(torch, compute_dtype) if compute_dtype else None
    batches = make_batches(kind, num_steps, batch_size)
    runs = {}
    for impl in ("fsdp2", "scratch"):
        if impl == "fsdp2":
            model = fsdp2_model(kind, world, device, dtype, sizes=sizes)
        else:
            model = FSDPFromScratch(make_model(kind, **(sizes or {})).to(device),
                                    compute_dtype=dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        with count_traffic() as log:
            for batch in batches:
                X, y = local(batch, rank, world, device)
                loss_fn(model(X), y).backward()
                if impl == "scratch":
                    model.finish_gradient_synchronization()
                opt.step()
                opt.zero_grad()
        if impl == "fsdp2":
            local_bytes = sum(p.to_local().numel() * 4 for p in model.parameters())
            runs[impl] = full_params(model)
        else:
            runs[impl] = model.gather_full_params()
        runs[impl + "_sent"] = log.sent_bytes / num_steps
    ref = ref_nodecay(kind, batches, device, num_steps, dtype, sizes)
    return dict(diff=max_diff(runs["fsdp2"], ref),
                diff_scratch=max_diff(runs["fsdp2"], runs["scratch"]),
                local_bytes=local_bytes, full_bytes=sum(t.numel() * 4 for t in ref.values()),
                sent_fsdp2=runs["fsdp2_sent"], sent_scratch=runs["scratch_sent"])


def exp_dcp_save(rank, world, device, path, kind="mlp", num_steps=2, batch_size=8, sizes=None):
    """Train a fully_shard model a little and save it with torch.distributed.checkpoint: each rank
    writes only its shards. Returns the full parameters (to compare after loading)."""
    import torch.distributed.checkpoint as dcp
    model = fsdp2_model(kind, world, device, sizes=sizes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for batch in make_batches(kind, num_steps, batch_size):
        X, y = local(batch, rank, world, device)
        loss_fn(model(X), y).backward()
        opt.step()
        opt.zero_grad()
    dcp.save({"model": model.state_dict()}, checkpoint_id=path)
    return dict(full=full_params(model),
                local_bytes=sum(p.to_local().numel() * 4 for p in model.parameters()))


def exp_dcp_load(rank, world, device, path, kind="mlp", sizes=None):
    """A fresh fully_shard model on `world` ranks (any number) loads the sharded checkpoint."""
    import torch.distributed.checkpoint as dcp
    model = fsdp2_model(kind, world, device, seed=123, sizes=sizes)   # other init: load must win
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["model"])
    return dict(full=full_params(model),
                local_bytes=sum(p.to_local().numel() * 4 for p in model.parameters()))


def held_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def exp_memory(rank, world, device, sizes=None, stages=("dp", "zero1", "zero2", "zero3"),
               batch_size=16):
    """Per stage: bytes of parameters, gradients and optimizer state this rank holds after a
    step (read from its tensors), the bytes it sent during that step, and on a GPU the peak of
    torch.cuda.max_memory_allocated."""
    X, y = local(make_batches("mlp", 1, batch_size, d_in=(sizes or {}).get("d_in", 32))[0],
                 rank, world, device)
    out = {}
    for stage in stages:
        net = make_model("mlp", **(sizes or {})).to(device)
        n_params = sum(p.numel() for p in net.parameters())
        if stage in ("dp", "zero1"):
            model = DDPFromScratch(net)
            opt = (torch.optim.AdamW(net.parameters(), lr=1e-3) if stage == "dp" else
                   ShardedOptimizer(net.parameters(), torch.optim.AdamW, lr=1e-3))
        elif stage == "zero2":
            model = Zero2(net, torch.optim.AdamW, lr=1e-3)
            opt = model
        else:
            model = FSDPFromScratch(net)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(2):   # the first step creates the optimizer state
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
            with count_traffic() as log:
                loss_fn(model(X), y).backward()
                model.finish_gradient_synchronization()
                if stage in ("zero2", "zero3"):
                    grads = held_bytes(p.grad for p in model.parameters()) if stage == "zero3" \
                        else held_bytes(s.grad for s in model.shards)
                else:
                    grads = held_bytes(p.grad for p in net.parameters())
                opt.step()
            peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
            opt.zero_grad()
        local_opt = opt.local if stage == "zero1" else opt.optimizer if stage == "zero2" else opt
        params = (held_bytes(model.parameters()) if stage == "zero3"
                  else held_bytes(net.parameters()))
        out[stage] = dict(n_params=n_params, params_bytes=params, grads_bytes=grads,
                          optim_bytes=optimizer_state_bytes(local_opt) if local_opt else 0,
                          sent_bytes=log.sent_bytes, calls=dict(log.calls), cuda_peak=peak)
    return out


EXPERIMENTS = {"ddp": exp_ddp, "timeline": exp_timeline, "zero1": exp_zero1, "zero2": exp_zero2,
               "fsdp": exp_fsdp, "fsdp2": exp_fsdp2, "dcp_save": exp_dcp_save,
               "dcp_load": exp_dcp_load, "memory": exp_memory}


def _worker(rank, world, port, experiments, out_dir, backend):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    rank, world, device = setup(rank, world, backend=backend, master_port=port)
    if backend == "gloo":
        device = torch.device("cpu")
    results = {}
    try:
        for name, kwargs in experiments:   # "fsdp:bf16" runs "fsdp", stored under its label
            results[name] = EXPERIMENTS[name.split(":")[0]](rank, world, device, **kwargs)
            dist.barrier()
    finally:
        teardown()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


def run_ranks(world, experiments, backend=None):
    """Run the experiments [(name, kwargs), ...] on `world` processes; returns a list with each
    rank's {name: result}. A name may carry a label ("fsdp:bf16") to run one experiment twice.
    NCCL with one GPU per rank when there are enough GPUs, gloo on the CPU otherwise (it says
    so)."""
    unknown = [name for name, _ in experiments if name.split(":")[0] not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"unknown experiments {unknown}: choose from {sorted(EXPERIMENTS)}")
    if backend is None:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        backend = "nccl" if 0 < world <= n else "gloo"
        if n and backend == "gloo":
            print(f"{world} ranks but {n} GPU(s): running them on the CPU with gloo "
                  "(NCCL needs one GPU per rank)")
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(world, free_port(), experiments, out_dir, backend), nprocs=world)
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
                for r in range(world)]
