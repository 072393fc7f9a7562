"""Bytes moved, counted: between simulated devices, between ranks, through DTensor.

- `send(t, src, dst, devices, log)` moves a tensor between simulated devices (Part I) and adds
  its bytes to a `CommLog` of (from index, to index, bytes, what).
- `count_traffic()` wraps dist.all_reduce, reduce_scatter_tensor, all_gather_into_tensor /
  all_gather_single and broadcast while it is active, and adds up, for this rank, the bytes the
  bandwidth-optimal (ring) algorithm of each collective sends: all-reduce 2(k-1)/k of the tensor,
  reduce-scatter and all-gather (k-1)/k of the full tensor, broadcast (k-1)/k (pipelined ring,
  averaged over the ranks). gloo does not report what it really sent; this is the volume the
  cost model of Part I counts, taken from the tensors the code really passed.
- `FuncolBytes` counts the functional collectives DTensor dispatches.
"""
import contextlib
from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CommLog", "send", "count_traffic", "TrafficLog", "FuncolBytes"]


class CommLog:
    """The transfers between devices: (from index, to index, bytes, what)."""

    def __init__(self):
        self.transfers = []

    def add(self, src, dst, nbytes, what=""):
        self.transfers.append((src, dst, nbytes, what))

    def total(self, what=None):
        """Bytes moved in all (or only those labelled `what`)."""
        return sum(b for _, _, b, w in self.transfers if what is None or w == what)

    def sent_by(self, i):
        """Bytes that device index i sent."""
        return sum(b for s, _, b, _ in self.transfers if s == i)


def send(t, src, dst, devices, log=None, what=""):
    """Move tensor `t` from devices[src] to devices[dst], logging its bytes when src != dst."""
    if log is not None and src != dst:
        log.add(src, dst, t.numel() * t.element_size(), what)
    return t.to(devices[dst])


_FACTORS = {"all_reduce": 2.0, "reduce_scatter_tensor": 1.0, "all_gather_into_tensor": 1.0,
            "all_gather_single": 1.0, "reduce_scatter_single": 1.0, "broadcast": 1.0}


def tensor_bytes(t):
    return t.numel() * t.element_size()


class TrafficLog:
    """Per collective name: calls and bytes sent by this rank; `sent_bytes` in all."""

    def __init__(self):
        self.calls, self.bytes = Counter(), Counter()

    @property
    def sent_bytes(self):
        return sum(self.bytes.values())

    def add(self, name, full_bytes, world):
        self.calls[name] += 1
        self.bytes[name] += _FACTORS[name] * (world - 1) / world * full_bytes

    def __repr__(self):
        return f"TrafficLog({dict(self.calls)}, sent_bytes={self.sent_bytes:.0f})"


def _full_tensor(name, args, kwargs):
    """The tensor whose size the collective's volume is counted on (the full, unsharded one)."""
    if name in ("all_gather_into_tensor", "all_gather_single"):
        return kwargs.get("output_tensor", args[0] if args else None)
    if name in ("reduce_scatter_tensor", "reduce_scatter_single"):
        return kwargs.get("input", args[1] if len(args) > 1 else None)
    return kwargs.get("tensor", args[0] if args else None)


@contextlib.contextmanager
def count_traffic():
    """Count what this rank sends through dist collectives inside the block (yields a
    TrafficLog)."""
    log, saved = TrafficLog(), {}
    for name in _FACTORS:
        fn = getattr(dist, name, None)
        if fn is None:
            continue
        saved[name] = fn

        def wrapper(*args, _name=name, _fn=fn, **kwargs):
            group = kwargs.get("group")       # a subgroup's ring has its own size
            log.add(_name, tensor_bytes(_full_tensor(_name, args, kwargs)),
                    dist.get_world_size(group))
            return _fn(*args, **kwargs)
        setattr(dist, name, wrapper)
    try:
        yield log
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


# --- DTensor's collectives -----------------------------------------------------------------
class FuncolBytes(TorchDispatchMode):
    """Counts the collectives DTensor runs, and the bytes of each (its input tensor), by watching
    the functional collective ops (torch.ops._c10d_functional) as they are dispatched."""

    OPS = ("all_reduce", "all_reduce_", "reduce_scatter_tensor", "all_gather_into_tensor",
           "all_to_all_single", "broadcast", "broadcast_")

    def __init__(self):
        super().__init__()
        self.log = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        from torch.distributed.tensor import DTensor
        if any(t is DTensor for t in types):
            return NotImplemented               # let DTensor turn itself into plain ops first
        ns = getattr(func, "namespace", "")
        name = func._overloadpacket.__name__
        if ns in ("_c10d_functional", "c10d_functional", "c10d") and name in self.OPS:
            first = args[0] if args else None
            tensors = first if isinstance(first, (list, tuple)) else [first]
            nbytes = sum(t.numel() * t.element_size() for t in tensors
                         if isinstance(t, torch.Tensor))
            self.log.append((name, None, nbytes))
        return func(*args, **kwargs)

    def bytes_sent(self, op=None):
        return sum(b for o, _, b in self.log if op is None or op in o)

    def calls(self, op):
        return sum(1 for o, _, _ in self.log if op in o)
