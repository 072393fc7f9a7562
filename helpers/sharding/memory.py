"""Peak memory on any device, measured: the bytes of every tensor storage created while a step
runs (activations, gradients, gathered weights, communication buffers, copies), counted from
its creation until it is freed, and the highest total reached. On a GPU
torch.cuda.max_memory_allocated says the same of the allocator; on a CPU nothing does, so this
watches every operation through a TorchDispatchMode (backward's operations included). A storage
counts the bytes it holds: one resized to 0 (torch's FSDP and FSDPFromScratch free gathered
weights so, while tensors may still refer to it) counts nothing from then on.
"""
import collections
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["PeakBytes"]


class PeakBytes(TorchDispatchMode):
    """with PeakBytes() as m: step()  ->  m.peak: the most bytes of storages created inside the
    block alive at once; m.now: those still alive at the end (e.g. gradients kept).
    Storages that existed before (parameters, optimizer state) are not counted: add them."""

    def __init__(self):
        super().__init__()
        self._now = self.peak = 0
        self._live = {}        # storage (its C++ address) -> [bytes, tensors referring, weakref]
        self._known = set()
        self._dropped = collections.deque()   # tensors gone since: any thread may drop one

    @property
    def now(self):
        self._recount()
        return self._now

    def _see(self, t):
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter) or \
                t.device.type == "meta":   # a tensor subclass (DTensor) wraps a plain one
            return
        self._settle()   # first: a new storage may have taken a freed one's address
        st = t.untyped_storage()
        key = st._cdata
        if st.nbytes() == 0:
            return
        entry = self._live.get(key)
        if entry is None:
            if key in self._known:     # an older storage (a parameter's view, say)
                return
            entry = self._live[key] = [st.nbytes(), 0, weakref.ref(st)]
            self._now += entry[0]
            if self._now > self.peak:   # a new peak, unless a storage was resized since
                self._recount()
                self.peak = max(self.peak, self._now)
        entry[1] += 1
        weakref.finalize(t, self._dropped.append, key)

    def _settle(self):
        while self._dropped:
            key = self._dropped.popleft()
            entry = self._live.get(key)
            if entry is not None:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._live[key]
                    self._now -= entry[0]

    def _recount(self):
        self._settle()
        for entry in self._live.values():
            st = entry[2]()
            n = 0 if st is None else st.nbytes()
            self._now += n - entry[0]
            entry[0] = n

    def skip(self, tensors):
        """Storages of these tensors (parameters, optimizer state) are never counted."""
        for t in tensors:
            t = t.to_local() if hasattr(t, "to_local") else t   # a DTensor: its local shard
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._known.add(t.untyped_storage()._cdata)
        return self

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and id(t) not in inputs:   # in-place: not new
                self._see(t)
        return out
