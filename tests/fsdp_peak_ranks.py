"""Rank function for tests/test_fsdp_scratch_peak.py (a spawned rank imports it by name): the
gathered-weight peaks of FSDPFromScratch on the deep MLP under conditions that move when Python
drops objects (garbage collection off, collected after every op, a communication backend
holding the gathered buffers after the all-gather returned), and PeakBytes over one step."""
import collections
import contextlib
import gc

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import helpers
from helpers.one_process import flat_cross_entropy, local_batch
from helpers.sharding import fsdp_scratch
from helpers.tiny_models import make_batches, make_model


class _CollectEveryOp(TorchDispatchMode):
    """A collection of the youngest generation after every operation (backward's included);
    a full one before every all-gather, when the peak is counted. The objects alive before the
    condition are frozen (gc.freeze): a full collection then walks only what the steps made
    (ms, not the 87 ms of the rank's whole heap), and collects all of that."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        gc.collect(0)
        return out


@contextlib.contextmanager
def _condition(name):
    """Run the body under one condition; everything is restored after."""
    old = gc.get_threshold()
    real = fsdp_scratch.all_gather_flat
    held = collections.deque(maxlen=3)

    def holding(shard, world, async_op=False):   # as gloo's worker thread or NCCL's work does
        full, work = real(shard, world, async_op=async_op)
        held.append(full)
        return full, work

    def collecting(shard, world, async_op=False):
        gc.collect()
        return real(shard, world, async_op=async_op)
    try:
        if name == "gc off":
            gc.disable()
        elif name == "gc threshold 1":
            gc.set_threshold(1)
        elif name == "backend holds buffers":
            fsdp_scratch.all_gather_flat = holding
        elif name == "gc after every op":
            fsdp_scratch.all_gather_flat = collecting
            gc.collect()   # earlier garbage, then the survivors out of every collection's walk
            gc.freeze()
        with _CollectEveryOp() if name == "gc after every op" else contextlib.nullcontext():
            yield
    finally:
        fsdp_scratch.all_gather_flat = real
        held.clear()
        gc.unfreeze()
        gc.enable()
        gc.set_threshold(*old)


def gathered_peaks(rank, world, cfg):
    """{(condition, reshard, prefetch): (peak of gathered bytes, gathered bytes still counted
    after each step, PeakBytes' peak over the last step)}."""
    device = cfg["device"]
    out = {}
    for name in cfg["conditions"]:
        for reshard, prefetch in cfg["knobs"]:
            model = helpers.FSDPFromScratch(make_model("mlp").to(device),
                                            reshard_after_forward=reshard, prefetch=prefetch)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            left, batches = [], make_batches("mlp", cfg["steps"], 8)
            with _condition(name):
                for i, batch in enumerate(batches):
                    X, y = local_batch(batch, rank, world, device)
                    last = i == len(batches) - 1
                    with helpers.PeakBytes().skip(list(model.parameters())) \
                            if last else contextlib.nullcontext() as peak:
                        flat_cross_entropy(model(X), y).backward()
                        model.finish_gradient_synchronization()
                    opt.step()
                    opt.zero_grad()
                    left.append(model.live_bytes)
            out[(name, reshard, prefetch)] = (model.peak_live_bytes, left, peak.peak)
    return out


class _Latents(torch.nn.Module):
    """Learned queries handed out as they are: a view of the unit's weights."""

    def __init__(self):
        super().__init__()
        self.latents = torch.nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        return self.latents.expand(len(x), 3, 4)


def returns_its_weights(rank, world, cfg):
    """The refusal of a unit whose output is a view of its gathered weights (freed after its
    forward), for each reshard_after_forward; None where it ran."""
    out = {}
    for reshard in (True, False):
        model = helpers.FSDPFromScratch(_Latents(), reshard_after_forward=reshard)
        try:
            model(torch.zeros(2)).sum().backward()
            out[reshard] = None
        except ValueError as e:
            out[reshard] = str(e)
    return out
