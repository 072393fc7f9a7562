"""Part V: bytes each rank sends, counted around torch.distributed's collectives.

`count_traffic()` wraps dist.all_reduce, reduce_scatter_tensor, all_gather_into_tensor /
all_gather_single and broadcast while it is active, and adds up, for this rank, the bytes the
bandwidth-optimal (ring) algorithm of each collective sends: all-reduce 2(k-1)/k of the tensor,
reduce-scatter and all-gather (k-1)/k of the full tensor, broadcast (k-1)/k (pipelined ring,
averaged over the ranks). gloo does not report what it really sent; this is the volume the cost
model of Part I counts, taken from the tensors the code really passed.
"""
import contextlib
from collections import Counter

import torch.distributed as dist

__all__ = ["count_traffic", "TrafficLog"]

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
