"""Part III's data-parallel experiments across processes, each a launch target
fn(rank, world, cfg): DDPFromScratch and torch's DDP against one process, when gradients are
ready and all-reduced, BatchNorm per device against synchronised BatchNorm, uneven inputs with
and without Join. Each compares with one process on the combined batch and returns numbers.
"""
import time

import torch
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ..data import load_tensors
from ..models import unwrap
from ..compare import max_diff
from ..one_process import flat_cross_entropy, local_batch, make_optimizer, params_of, \
    train_one_process
from ..runtime.launch import take
from ..runtime.progress import report_progress
from ..runtime.traffic import count_traffic
from ..tiny_models import make_batches, make_model
from .scratch import DDPFromScratch
from .torch_api import bn_net, bn_stats, convert_sync_batchnorm, evaluate_exact, global_batches, \
    train_bn_steps

__all__ = ["ddp_vs_one_process", "gradient_timeline", "bn_vs_syncbn", "uneven_inputs_join"]


def ddp_vs_one_process(rank, world, cfg):
    """DDPFromScratch and torch's DDP against one process, for each (model kind, bucket_mb)."""
    device, cases, num_steps, batch_size = take(cfg, "device", "cases", num_steps=3, batch_size=8)
    out = []
    for kind, bucket_mb in cases:
        batches = make_batches(kind, num_steps, batch_size)
        ref = train_one_process(kind, batches, device, num_steps, optim="sgd")
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
                X, y = local_batch(batch, rank, world, device)
                with count_traffic() as log:
                    flat_cross_entropy(model(X), y).backward()
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


def gradient_timeline(rank, world, cfg):
    """When each gradient is ready and each all-reduce is launched, relative to backward's start
    and end (seconds); the last of `repeats` steps (the first ones warm up)."""
    device, bucket_mb, sizes, repeats = take(cfg, "device", bucket_mb=None, sizes=None, repeats=3)
    model = DDPFromScratch(make_model("mlp", **(sizes or {})).to(device), bucket_mb=bucket_mb)
    batch = make_batches("mlp", 1, 64, d_in=(sizes or {}).get("d_in", 32))[0]
    X, y = local_batch(batch, rank, world, device)
    for _ in range(repeats):
        loss = flat_cross_entropy(model(X), y)
        t0 = time.perf_counter()
        loss.backward()
        t1 = time.perf_counter()
        model.finish_gradient_synchronization()
        t2 = time.perf_counter()
        model.zero_grad()
    return dict(events=[(t - t0, what, i) for t, what, i in model.timeline],
                backward_s=t1 - t0, finish_s=t2 - t0, num_buckets=len(model.buckets))


def bn_vs_syncbn(rank, world, cfg):
    """Train bn_net under DDP with per-device BatchNorm, then with synchronised BatchNorm, from
    the same start on the same global batches (cfg: subset, batch_size, num_steps, lr, seed,
    channels). Returns per variant: BN running statistics, weights, test accuracy."""
    device, subset, batch_size, num_steps, lr, seed, channels = take(
        cfg, "device", "subset", "batch_size", "num_steps", "lr", "seed", channels=16)
    X, y = load_tensors(True, subset)
    X_test, y_test = load_tensors(False, subset)
    batches = global_batches(len(y), batch_size, num_steps, seed)
    results = {}
    for i, variant in enumerate(("bn", "syncbn")):
        report_progress(i + 1, 2, "BatchNorm variant")
        torch.manual_seed(seed)
        net = bn_net(channels).to(device)
        if variant == "syncbn":
            net = convert_sync_batchnorm(net, device)
        model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
        train_bn_steps(model, X, y, batches, lr, device, rank, world)
        correct, total = evaluate_exact(model, X_test, y_test, device)
        results[variant] = dict(
            stats=bn_stats(model), acc=correct / total, total=total,
            state={k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()})
    return results


def uneven_inputs_join(rank, world, cfg):
    """Uneven inputs: rank r trains on 3 + 2r batches. Under `Join`, a rank that runs out of data
    shadows the others' gradient all-reduces (with zeros) until all are done, so nobody waits
    forever. Launch it with backend="gloo" (a lesson about collectives, not speed). Returns
    {steps, weight, finished}."""
    (use_join,) = take(cfg, use_join=True)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps, g = 3 + 2 * rank, torch.Generator().manual_seed(rank)
    finished = True
    try:
        with Join([model], enable=use_join):
            for _ in range(steps):
                loss = model(torch.randn(8, 4, generator=g)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    except RuntimeError:   # without Join: the rank with more batches times out waiting
        finished = False
    return dict(steps=steps, finished=finished, weight=model.module.weight.detach().clone())
