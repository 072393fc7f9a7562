"""Part III: DistributedDataParallel built from scratch, one process per rank.

What torch's DDP does, in a page: broadcast the weights from rank 0 once, then, during backward,
all-reduce each gradient (or bucket of gradients) asynchronously as soon as autograd has produced
it, so communication overlaps the rest of the backward pass. Buckets fill in reverse parameter
order, the order in which backward produces gradients.
"""
import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DDPFromScratch", "make_buckets"]


def make_buckets(params, bucket_mb=None):
    """Trainable parameters grouped into buckets of about `bucket_mb` MB, filled in reverse order
    (None: one parameter per bucket). Frozen parameters are left out, a shared one appears once."""
    seen, buckets, current, size = set(), [], [], 0
    limit = None if bucket_mb is None else bucket_mb * 2**20
    for p in reversed(list(params)):
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        current.append(p)
        size += p.numel() * p.element_size()
        if limit is None or size >= limit:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class DDPFromScratch(nn.Module):
    """Data parallelism across processes: same weights everywhere, gradients averaged by
    asynchronous all-reduces launched from gradient hooks while backward still runs.

    After `loss.backward()` call `finish_gradient_synchronization()`, then `optimizer.step()`.
    `timeline` records (seconds, "grad" or "launch", bucket index) for the current step.
    `group`: the data-parallel ranks (default: all); inside `no_sync()` gradients accumulate
    (several micro-batches) and finish_gradient_synchronization reduces them all at the end.
    """

    def __init__(self, module, bucket_mb=None, group=None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("DDPFromScratch needs a process group: call helpers.setup() or "
                               "dist.init_process_group(...) first")
        self.module, self.group, self.sync = module, group, True
        self.world = dist.get_world_size(group)
        src = 0 if group is None else dist.get_global_rank(group, 0)
        with torch.no_grad():   # every rank starts from rank 0's weights and buffers
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=src, group=group)
        self.buckets = make_buckets(module.parameters(), bucket_mb)
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        for p in (p for b in self.buckets for p in b):
            p.register_post_accumulate_grad_hook(self._grad_ready)
        self._ready = [0] * len(self.buckets)
        self._pending = {}   # bucket index -> (work handle, flat buffer or None)
        self.timeline = []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate .grad (what torch's DDP.no_sync does)."""
        self.sync = False
        try:
            yield
        finally:
            self.sync = True

    def _grad_ready(self, param):
        """Autograd has accumulated param.grad: launch its bucket's all-reduce once it is full."""
        if not self.sync:
            return
        if not self._pending and not any(self._ready):   # first gradient of a new step
            self.timeline = []
        i = self._bucket_of[id(param)]
        self.timeline.append((time.perf_counter(), "grad", i))
        self._ready[i] += 1
        if self._ready[i] == len(self.buckets[i]):
            self._launch(i)

    def _launch(self, i):
        self.timeline.append((time.perf_counter(), "launch", i))
        bucket = self.buckets[i]
        for p in bucket:   # a parameter that took no part in this forward contributes zeros
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if len(bucket) == 1:
            flat = None
            work = dist.all_reduce(bucket[0].grad, async_op=True, group=self.group)
        else:
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            work = dist.all_reduce(flat, async_op=True, group=self.group)
        self._pending[i] = (work, flat)

    def finish_gradient_synchronization(self):
        """Wait for every all-reduce and leave the averaged gradient in each p.grad."""
        for i in range(len(self.buckets)):   # buckets no hook launched (unused parameters)
            if i not in self._pending:
                self._launch(i)
        for i, (work, flat) in self._pending.items():
            work.wait()
            bucket = self.buckets[i]
            if flat is None:
                bucket[0].grad.div_(self.world)
                continue
            offset = 0
            for p in bucket:
                n = p.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad)).div_(self.world)
                offset += n
        self._ready = [0] * len(self.buckets)
        self._pending = {}
