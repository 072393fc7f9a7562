"""Part III: DistributedDataParallel built from scratch, one process per rank.

What torch's DDP does, in a page: broadcast the weights from rank 0 once, then, during backward,
all-reduce each bucket of gradients asynchronously as soon as autograd has produced all of it,
so communication overlaps the rest of the backward pass. Buckets fill in reverse parameter order
(the order in which backward produces gradients) and are launched strictly in index order on
every rank, so the ranks' collectives pair up even when a rank skips some parameters.
"""
import contextlib
import functools
import itertools
import weakref

import torch
import torch.distributed as dist
from torch import nn

from ..devices import DeviceClock
from ..runtime.agree import SAME_MODEL, agree, fingerprint, where_are_the_others

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


_LIVE = weakref.WeakSet()     # wrappers whose gradients may be unsynchronised (optimizer guard)
_NUMBER = {}                  # group's ranks -> a count of its wrappers (the same on its ranks)
_GUARD = []                   # the one optimizer step pre-hook, registered once


def _grad_hook(me, param):
    model = me()
    if model is not None:
        model._grad_ready(param)


def _step_guard(optimizer, args, kwargs):
    """Refuse optimizer.step() on gradients a DDPFromScratch has not averaged yet."""
    for model in list(_LIVE):
        if model._open and model._owns(optimizer):
            raise RuntimeError(
                f"rank {model.rank}: optimizer.step() before finish_gradient_synchronization(): "
                "the gradients are still this rank's own, not the average over the ranks. Call "
                "model.finish_gradient_synchronization() after the last loss.backward() of the "
                "step, then optimizer.step()")


class DDPFromScratch(nn.Module):
    """Data parallelism across processes: same weights everywhere, gradients averaged by
    asynchronous all-reduces launched from gradient hooks while backward still runs.

    Per step: `loss.backward()`, then `finish_gradient_synchronization()`, then
    `optimizer.step()`. Gradient accumulation: run all but the last micro-batch (forward and
    backward) inside `with model.no_sync():`, as with torch's DDP; or all of them inside it and
    let finish synchronise the sum. Supported like torch's DDP with find_unused_parameters=True:
    parameters that some ranks (or all) skip in a step, tied and frozen parameters. Refused with
    an error naming the fix: two backward passes before finish outside no_sync, a forward or an
    optimizer step before finish, models that differ between ranks, a bucket mixing dtypes or
    devices. `group`: the data-parallel ranks to average over (all by default). `overlap=False`
    launches every all-reduce in finish (the baseline to time overlap against). `timeline`:
    this step's (seconds, "grad" | "launch" | "queued" | "done", bucket index), on the host
    clock ("launch" to "queued": the bucket's gradients copied into its buffer and its
    all-reduce queued); on a
    GPU the stamps are CUDA events (when the GPU got there, not when the host queued it), and
    an NCCL all-reduce's "done" is an event its completion fires (its future completes at
    launch).
    """

    wraps_module = True       # helpers.unwrap reaches the model as self.module

    def __init__(self, module, bucket_mb=None, overlap=True, group=None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("DDPFromScratch needs a process group: call helpers.setup() or "
                               "dist.init_process_group(...) first")
        self.module, self.overlap, self.group = module, overlap, group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        device = _device_of(module)
        self.clock = DeviceClock(device)
        # NCCL's futures complete when the all-reduce is queued: its completion is an event
        # recorded on a side stream that waits for it (the compute stream does not)
        self._watch = torch.cuda.Stream(device) if device.type == "cuda" and \
            "nccl" in str(dist.get_backend(group)) else None
        # refused on every rank alike (as torch's DDP does) before the broadcast, which
        # would abort on a size mismatch: ranks holding different models
        agree(fingerprint("a DDPFromScratch", module), group=group, fix=SAME_MODEL)
        ranks = tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
        self._tag = (f"ddp{next(_NUMBER.setdefault(ranks, itertools.count()))}@"
                     + "-".join(map(str, ranks)))
        self._finishes = 0
        src = 0 if group is None else dist.get_global_rank(group, 0)
        with torch.no_grad():   # every rank starts from the group's first rank's weights
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=src, group=group)
        self.buckets = make_buckets(module.parameters(), bucket_mb)
        for i, b in enumerate(self.buckets):
            kinds = sorted({f"{p.dtype} on {p.device}" for p in b})
            if len(kinds) > 1:
                raise ValueError(f"bucket {i} mixes {' and '.join(kinds)}: one all-reduce "
                                 "needs one dtype on one device; use bucket_mb=None (one "
                                 "parameter per bucket) or give the model one dtype")
        self._params = [p for b in self.buckets for p in b]
        self._index = {id(p): k for k, p in enumerate(self._params)}
        self._bucket_of = [i for i, b in enumerate(self.buckets) for _ in b]
        me = weakref.ref(self)   # hooks that hold no wrapper: no cycle through the params,
        for p in self._params:   # so a dropped wrapper is freed at once, not at exit
            p.register_post_accumulate_grad_hook(functools.partial(_grad_hook, me))
        self._require_sync = True     # False inside no_sync()
        self._sync_backward = True    # decided by the last forward, as torch's DDP does
        self._reset()
        self._log = []
        _LIVE.add(self)
        if not _GUARD:   # one global hook (torch >= 2.0) for every optimizer and wrapper
            from torch.optim.optimizer import register_optimizer_step_pre_hook
            _GUARD.append(register_optimizer_step_pre_hook(_step_guard))

    def _reset(self):
        self._open = False                          # a forward or backward since finish
        self._used = [False] * len(self._params)    # got a gradient since the last finish
        self._counted = [False] * len(self._params)  # ... in this synchronised backward
        self._ready = [0] * len(self.buckets)
        self._next = 0                              # the next bucket to launch, in order
        self._pending = []                          # (bucket index, work, flat buffer)

    @property
    def synchronized(self) -> bool:
        """True when no forward or backward ran since the last finish_gradient_synchronization()
        (every gradient this wrapper holds is the average over the ranks)."""
        return not self._open

    @property
    def timeline(self):
        """This step's [(seconds, "grad" | "launch" | "queued" | "done", bucket index)] on the
        host clock (on a GPU it waits for the device to reach the last stamp)."""
        log = list(self._log)
        seconds = self.clock.seconds([t for t, _, _ in log])
        return [(t, what, i) for t, (_, what, i) in zip(seconds, log, strict=True)]

    def completions(self):
        """How many of this step's all-reduces have a completion on the timeline (gloo's
        callbacks land on its own threads, a moment after the all-reduce finished)."""
        return sum(what == "done" for _, what, _ in list(self._log))

    def _owns(self, optimizer):
        ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
        return any(id(p) in ids for p in self._params)

    def _start(self):
        """The first forward or gradient since finish: a new step, a new timeline."""
        if not self._open:
            self._open, self._log = True, []

    @contextlib.contextmanager
    def no_sync(self):
        """Forward and backward inside accumulate gradients locally, without communication; the
        next synchronised backward (or finish) averages the accumulated sum."""
        old, self._require_sync = self._require_sync, False
        try:
            yield
        finally:
            self._require_sync = old

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled():
            if any(self._counted):
                raise RuntimeError(
                    f"rank {self.rank}: forward before finish_gradient_synchronization(): the "
                    "previous backward's all-reduces were never finished, so its gradients are "
                    "not averaged. Call model.finish_gradient_synchronization() after each "
                    "synchronised backward; to accumulate micro-batches, run all but the last "
                    "inside `with model.no_sync():`")
            self._start()
            self._sync_backward = self._require_sync
        return self.module(*args, **kwargs)

    def _grad_ready(self, param):
        """Autograd has accumulated param.grad: count it; launch every bucket, in index order,
        that is complete and has all earlier buckets launched."""
        k = self._index[id(param)]
        i = self._bucket_of[k]
        self._start()
        self._log.append((self.clock.stamp(), "grad", i))
        self._used[k] = True
        if not (self._sync_backward and self.overlap):
            return      # accumulating (no_sync), or all-reduces left to finish (overlap=False)
        if self._counted[k]:
            raise RuntimeError(
                f"rank {self.rank}: a second backward before finish_gradient_synchronization() "
                f"({self._name(param)} got its gradient twice). Its all-reduce is already in "
                "flight with the first gradient, so the second would be lost. To accumulate "
                "gradients, run all but the last micro-batch inside `with model.no_sync():`; "
                "otherwise call finish_gradient_synchronization() after every backward")
        self._counted[k] = True
        self._ready[i] += 1
        while self._next < len(self.buckets) and \
                self._ready[self._next] == len(self.buckets[self._next]):
            self._launch(self._next)

    def _name(self, param):
        return next((n for n, p in self.module.named_parameters() if p is param), "a parameter")

    def _launch(self, i):
        """All-reduce bucket i: each gradient divided by the world size first (as torch's DDP
        does), zeros for a parameter this rank did not use; the last bucket also carries which
        parameters this rank used, so every rank learns which ones nobody used."""
        self._log.append((self.clock.stamp(), "launch", i))
        start = sum(len(b) for b in self.buckets[:i])
        parts = [self._params[start + j].grad.reshape(-1) / self.world
                 if self._used[start + j] and self._params[start + j].grad is not None
                 else torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
                 for j, p in enumerate(self.buckets[i])]
        if i == len(self.buckets) - 1:
            p = self.buckets[i][0]
            parts.append(torch.tensor(self._used, dtype=p.dtype, device=p.device))
        flat = torch.cat(parts)
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        self._on_done(work, i)
        self._log.append((self.clock.stamp(), "queued", i))   # copied, and the all-reduce queued
        self._pending.append((i, work, flat))
        self._next = i + 1

    def _on_done(self, work, i):
        log = self._log             # this step's (a late completion never lands in the next)
        if self._watch is not None:     # NCCL: the side stream waits for the all-reduce, then
            with torch.cuda.stream(self._watch):    # an event there fires when it is done
                work.wait()
                log.append((self.clock.stamp(self._watch), "done", i))
            return
        try:
            fut = work.get_future()
        except (RuntimeError, AttributeError):   # a backend without futures
            return
        clock = self.clock      # gloo: the future completes when its threads are done
        fut.then(lambda _: log.append((clock.host(), "done", i)))

    def finish_gradient_synchronization(self):
        """Launch the buckets still waiting (in index order), wait for every all-reduce and
        leave the averaged gradient in each p.grad; a parameter no rank used keeps its .grad
        (None after zero_grad), as under torch's DDP. Without a forward or backward since the
        last finish there is nothing to do (no communication)."""
        self._validate_no_new_trainable()
        if not self._open or not self.buckets:
            self._reset()
            return
        self._finishes += 1
        while self._next < len(self.buckets):
            self._launch(self._next)
        results = []
        for i, work, flat in self._pending:
            try:
                work.wait()
            except RuntimeError as e:
                here = f"bucket {i} of step {self._finishes}"
                others = where_are_the_others(here, self._tag, self.group)
                raise RuntimeError(
                    f"rank {self.rank}: the all-reduce of {here} did not complete: "
                    f"{str(e).splitlines()[0]}. {others + '. ' if others else ''}Every rank "
                    "must run the same forward/backward passes and call "
                    "finish_gradient_synchronization() after the same ones; another rank "
                    "skipped one, took another path, or died") from e
            results.append((i, flat))
        used_by = results[-1][1][-len(self._params):]
        for i, flat in results:
            start, offset = sum(len(b) for b in self.buckets[:i]), 0
            for j, p in enumerate(self.buckets[i]):
                n = p.numel()
                if used_by[start + j] > 0:      # someone used it: the average (zeros included)
                    avg = flat[offset:offset + n].view_as(p)
                    if p.grad is None:
                        p.grad = avg.clone()
                    else:
                        p.grad.copy_(avg)
                offset += n
        self._reset()

    def _validate_no_new_trainable(self):
        extra = [n for n, p in self.module.named_parameters()
                 if p.requires_grad and id(p) not in self._index]
        if extra:
            raise RuntimeError(f"{extra[:3]} became trainable after DDPFromScratch was built, so "
                               "no bucket holds them and their gradients would never be "
                               "averaged: set requires_grad before wrapping the model")


def _device_of(module):
    """Where the module's parameters (else buffers) live; a module without any: the rank's
    current device (the GPU NCCL communicates on), else the CPU."""
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
