"""The syncbn chapter's runs across processes: what SyncBatchNorm's collectives cost a step,
apart from how it is implemented (`syncbn_cost_times`), and what they send (`syncbn_traffic`,
which schematics/syncbn_schematics.py draws).

On the CPU the synchronised BatchNorm is CPUSyncBatchNorm, a Python autograd function, while
per-device BatchNorm is ATen's fused kernel: their ratio measures the implementation as much as
the communication. The control runs the same Python function on a group of ONE rank (each rank
alone: the same arithmetic, nothing to wait for), so syncbn / control is the collectives' share
and control / bn the implementation's. On GPUs nn.SyncBatchNorm on a group of one falls back to
the plain kernel, so there the control is per-device BatchNorm again.
"""
import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ..data import load_tensors
from ..devices import synced_now
from ..runtime.intercept import intercept
from ..runtime.launch import take
from .results import Collective, SyncBnCost, SyncBnTraffic
from .torch_api import CPUSyncBatchNorm, bn_net, convert_sync_batchnorm, global_batches

__all__ = ["AloneSyncBatchNorm", "syncbn_cost_times", "syncbn_traffic"]

VARIANTS = ("bn", "control", "syncbn")


class AloneSyncBatchNorm(CPUSyncBatchNorm):
    """CPUSyncBatchNorm that takes its Python path even on a group of one rank: the control that
    costs what the implementation costs, without waiting for another rank."""

    def _synchronises(self):
        return self.training


def _alone(model, group):
    """Every CPUSyncBatchNorm of `model` replaced by an AloneSyncBatchNorm on `group`."""
    for name, child in model.named_children():
        if isinstance(child, CPUSyncBatchNorm):
            new = AloneSyncBatchNorm(child.num_features, child.eps, child.momentum,
                                     child.affine, child.track_running_stats, group)
            new.load_state_dict(child.state_dict())
            setattr(model, name, new)
        else:
            _alone(child, group)
    return model


def syncbn_cost_times(rank, world, cfg):
    """Seconds of `steps` training steps of bn_net under DDP with per-device BatchNorm ("bn"),
    the synchronised BatchNorm on a group of this rank alone ("control") and across all ranks
    ("syncbn"), timed in turns (the order rotated every round, the ranks meeting in a barrier
    before each sample) after `warmup` rounds. Returns a SyncBnCost: {variant: [seconds, ...]},
    one sample per round, and the synchronised layers' collectives per step."""
    device, subset, batch_size, rounds, warmup, steps, channels = take(
        cfg, "device", subset=2048, batch_size=32, rounds=9, warmup=2, steps=5, channels=16)
    X, y = load_tensors(True, subset)
    idx = global_batches(len(y), batch_size, 1, 0)[0].tensor_split(world)[rank]
    Xb, yb = X[idx].to(device), y[idx].to(device)
    alone = [dist.new_group([r]) for r in range(world)][rank]   # every rank makes every group
    models = {}
    for variant in VARIANTS:
        torch.manual_seed(0)
        net = bn_net(channels).to(device)
        if variant != "bn":
            net = convert_sync_batchnorm(net, device, alone if variant == "control" else None)
            if variant == "control" and device.type == "cpu":
                net = _alone(net, alone)
        model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
        models[variant] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
    times = {v: [] for v in VARIANTS}
    for r in range(warmup + rounds):
        k = r % len(VARIANTS)
        for variant in VARIANTS[k:] + VARIANTS[:k]:
            model, opt = models[variant]
            dist.barrier()
            t0 = synced_now([device])
            for _ in range(steps):
                nn.functional.cross_entropy(model(Xb), yb).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            if r >= warmup:
                times[variant].append(synced_now([device]) - t0)
    layers = sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in models["bn"][0].modules())
    return SyncBnCost(times=times, collectives=2 * layers, steps=steps)


@contextlib.contextmanager
def _recording(calls):
    """dist.all_gather and dist.all_reduce, each call appended to `calls` as a Collective: the
    tensor this rank handed over and what it holds afterwards."""
    def record(name, args, kwargs):
        if name == "all_gather":
            out, t = args[:2]
            return lambda _: calls.append(Collective(
                op=name, sent=t.detach().clone(),
                got=torch.stack([o.detach().clone() for o in out])))
        t = args[0]
        sent = t.detach().clone()
        return lambda _: calls.append(Collective(op=name, sent=sent, got=t.detach().clone()))
    with intercept(("all_gather", "all_reduce"), record, who="syncbn_traffic"):
        yield calls


def syncbn_traffic(rank, world, cfg):
    """Launch target: one forward and backward of a BatchNorm2d and of its synchronised
    version on this rank's shard of one seeded global batch (cfg: batch, channels, size, seed).
    Returns a SyncBnTraffic: values per channel in the shard, the recorded collectives of each
    kind, the shard's own statistics."""
    batch, channels, size, seed = take(cfg, "batch", "channels", "size", seed=0)
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(batch, channels, size, size, generator=g) * 2 + 1
    dY = torch.randn(X.shape, generator=g)
    x, dy = X.chunk(world)[rank], dY.chunk(world)[rank]
    calls = {}
    for name, bn in (("bn", nn.BatchNorm2d(channels)),
                     ("sync", convert_sync_batchnorm(nn.BatchNorm2d(channels), "cpu"))):
        shard = x.clone().requires_grad_()
        with _recording([]) as recorded:
            (bn(shard) * dy).sum().backward()
        calls[name] = recorded
    return SyncBnTraffic(count=x.numel() // channels, bn_calls=calls["bn"],
                         sync_calls=calls["sync"], shard_mean=x.mean((0, 2, 3)),
                         shard_var=x.var((0, 2, 3), unbiased=False))
