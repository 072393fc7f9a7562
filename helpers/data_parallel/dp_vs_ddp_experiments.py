"""Part III: a training step of nn.DataParallel against one of DDP on the same GPUs.

DataParallel is one process that replicates LeNet onto every GPU, scatters the batch and gathers
the outputs on every step; DDP is one process per GPU with the weights replicated once. Both
train LeNet with SGD on the same global batch, timed in turns (a DataParallel round, then a DDP
round, each synchronised with CUDA). Needs 2 GPUs: on fewer, DataParallel would run one replica
and there is nothing to compare (the chapter then cites the GPU reference run, or predicts).
"""
import torch
from torch import nn

from ..devices import synced_now
from ..runtime.launch import take
from ..timing import Measurement, ratio
from .results import DpVsDdp

__all__ = ["time_dp_vs_ddp", "ddp_step_seconds"]


def _lenet_step(net, opt, X, y):
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(net(X), y).backward()
    opt.step()


def _seconds_per_step(step, steps, devices):
    """Seconds per call of `step`, after a warm-up, timed on the synced clock of `devices`."""
    step()                                        # warm-up: kernels, allocator, buckets
    t0 = synced_now(devices)
    for _ in range(steps):
        step()
    return (synced_now(devices) - t0) / steps


def ddp_step_seconds(rank, world, cfg):
    """One DDP rank (helpers.launch): seconds per LeNet step on its slice of the global batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..models import lenet_module
    device, batch, steps = take(cfg, "device", "batch", "steps")
    device = torch.device(device)
    torch.manual_seed(0)
    net = DDP(lenet_module().to(device),
              device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    n = batch // world
    X, y = torch.randn(n, 1, 28, 28, device=device), torch.randint(0, 10, (n,), device=device)
    return _seconds_per_step(lambda: _lenet_step(net, opt, X, y), steps, device)


def time_dp_vs_ddp(batch=256, steps=50, rounds=3):
    """DpVsDdp: DataParallel's and DDP's seconds a step (one sample a round) on 2 GPUs, and
    DataParallel's time / DDP's, round by round (above 1: DDP faster)."""
    from ..devices import num_gpus
    from ..models import lenet_module
    from ..runtime.launch import launch
    if num_gpus() < 2:
        raise RuntimeError("time_dp_vs_ddp needs 2 GPUs (DataParallel on fewer runs one "
                           "replica): run it on a machine with two, or read the GPU reference run")
    devices = [torch.device("cuda", i) for i in range(2)]
    torch.manual_seed(0)
    net = nn.DataParallel(lenet_module().to(devices[0]), device_ids=[0, 1])
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    X = torch.randn(batch, 1, 28, 28, device=devices[0])
    y = torch.randint(0, 10, (batch,), device=devices[0])
    dp, ddp = [], []
    for _ in range(rounds):                     # in turns
        dp.append(_seconds_per_step(lambda: _lenet_step(net, opt, X, y), steps, devices))
        ddp.append(launch(ddp_step_seconds, 2, dict(batch=batch, steps=steps),
                          backend="nccl", quiet=True)[0])
    dp, ddp = Measurement(dp), Measurement(ddp)
    return DpVsDdp(dp=dp, ddp=ddp, ratio=ratio(dp, ddp), batch=batch, steps=steps)
