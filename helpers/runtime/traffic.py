"""Bytes sent, counted on ONE log: a `ByteLog` of Transfer(op, src, dst, nbytes) records.

Every counter of the course writes there and answers from it:
- `send(t, src, dst, devices, log)` moves a tensor between simulated devices (Part I) and adds
  its bytes to a `CommLog` (src, dst: device indices; op: what was sent, e.g. "activation");
- the comms (runtime.comm: DistComm, ThreadComm) add one record per message a rank sends;
- `count_traffic()` wraps dist.all_reduce, reduce_scatter_tensor, all_gather_into_tensor /
  all_gather_single and broadcast while it is active, and adds, for this rank, the bytes the
  bandwidth-optimal (ring) algorithm of each collective sends (costs.ring_bytes_per_device: an
  all-reduce 2(k-1)/k of the tensor, reduce-scatter, all-gather and broadcast half of that).
  gloo does not report what it really sent; this is the volume the cost model of Part I
  counts, taken from the tensors the code really passed;
- `FuncolBytes` adds the functional collectives DTensor dispatches.
"""
import contextlib
from collections import Counter
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ..costs import ring_bytes_per_device

__all__ = ["Transfer", "ByteLog", "CountsSent", "CommLog", "send", "count_traffic",
           "TrafficLog", "FuncolBytes"]


class Transfer(NamedTuple):
    """One message or collective: what (op), from whom, to whom (None: a collective), bytes."""
    op: str
    src: object
    dst: object
    nbytes: float


class ByteLog:
    """The one log of bytes sent: Transfer records, and the sums every counter answers with."""

    def __init__(self):
        self.records = []

    def record(self, op, nbytes, src=None, dst=None):
        self.records.append(Transfer(op, src, dst, nbytes))

    def total(self, op=None):
        """Bytes in all (or only those of `op`)."""
        return sum(r.nbytes for r in self.records if op is None or r.op == op)

    def count(self, op=None):
        """How many records (of `op`)."""
        return sum(1 for r in self.records if op is None or r.op == op)

    def sent_by(self, src):
        """Bytes that `src` sent."""
        return sum(r.nbytes for r in self.records if r.src == src)


class CountsSent:
    """A rank's counts on a ByteLog (`traffic`): `log` lists (op, peer, bytes) per message,
    `bytes_sent(op)` and `calls(op)` sum them; `reset_counts()` starts afresh."""

    def reset_counts(self):
        """Forget what was counted so far (e.g. after warm-up steps)."""
        self._traffic = ByteLog()

    @property
    def traffic(self):
        if "_traffic" not in self.__dict__:
            self._traffic = ByteLog()
        return self._traffic

    @property
    def log(self):
        """A copy (appending to it records nothing): record through `traffic`; start afresh with
        `reset_counts()`."""
        return [(r.op, r.dst, r.nbytes) for r in self.traffic.records]

    def _count(self, op, t, peer=None):
        self.traffic.record(op, t.numel() * t.element_size(), getattr(self, "rank", None), peer)

    def bytes_sent(self, op=None):
        """Bytes this rank handed to the network (an all-reduce counts its payload once)."""
        return self.traffic.total(op)

    def calls(self, op):
        return self.traffic.count(op)

    def sendrecv(self, send=None, recv=None):
        """Post a send (t, dst) and a receive (src, shape[, dtype]) together; returns the
        received tensor (None without one). Here one after the other; DistComm posts both at
        once (torch.distributed.batch_isend_irecv)."""
        if send is not None:
            self.send(*send)
        return self.recv(*recv) if recv is not None else None


class CommLog(ByteLog):
    """The transfers between simulated devices: `transfers` lists (from index, to index, bytes,
    what)."""

    def add(self, src, dst, nbytes, what=""):
        self.record(what, nbytes, src, dst)

    @property
    def transfers(self):
        return [(r.src, r.dst, r.nbytes, r.op) for r in self.records]

    def total(self, what=None):
        """Bytes moved in all (or only those labelled `what`)."""
        return super().total(what)


def send(t, src, dst, devices, log=None, what=""):
    """Move tensor `t` from devices[src] to devices[dst], logging its bytes when src != dst."""
    if log is not None and src != dst:
        log.add(src, dst, t.numel() * t.element_size(), what)
    return t.to(devices[dst])


# an all-reduce is a reduce-scatter then an all-gather: each of those sends half its volume
_SHARE = {"all_reduce": 1.0, "reduce_scatter_tensor": 0.5, "all_gather_into_tensor": 0.5,
          "all_gather_single": 0.5, "reduce_scatter_single": 0.5, "broadcast": 0.5}


def tensor_bytes(t):
    return t.numel() * t.element_size()


class TrafficLog(ByteLog):
    """What this rank sent through dist collectives: `calls` and `bytes` per collective name,
    `sent_bytes` in all; `by_group`: the same per process group, keyed by the group's global
    ranks (a mesh dimension's), which each record keeps as its dst."""

    def add(self, name, full_bytes, world, ranks=None):
        self.record(name, _SHARE[name] * ring_bytes_per_device(full_bytes, world),
                    dst=tuple(ranks) if ranks else None)

    @property
    def calls(self):
        return Counter(r.op for r in self.records)

    @property
    def bytes(self):
        out = Counter()
        for r in self.records:
            out[r.op] += r.nbytes
        return out

    @property
    def sent_bytes(self):
        return self.total()

    @property
    def by_group(self):
        out = {}
        for r in self.records:
            calls, nbytes = out.setdefault(r.dst or (), (Counter(), Counter()))
            calls[r.op] += 1
            nbytes[r.op] += r.nbytes
        return out

    def __repr__(self):
        return f"TrafficLog({dict(self.calls)}, sent_bytes={self.sent_bytes:.0f})"


def _full_tensor(name, args, kwargs):
    """The tensor whose size the collective's volume is counted on (the full, unsharded one)."""
    if name in ("all_gather_into_tensor", "all_gather_single"):
        return kwargs.get("output_tensor", args[0] if args else None)
    if name in ("reduce_scatter_tensor", "reduce_scatter_single"):
        return kwargs.get("input", args[1] if len(args) > 1 else None)
    return kwargs.get("tensor", args[0] if args else None)


_GROUP_AT = {"all_reduce": 2, "reduce_scatter_tensor": 3, "all_gather_into_tensor": 2,
             "all_gather_single": 2, "reduce_scatter_single": 3, "broadcast": 2}


def _group(name, args, kwargs):
    """The process group a collective call names (None: the default group)."""
    if "group" in kwargs:
        return kwargs["group"]
    i = _GROUP_AT[name]
    return args[i] if len(args) > i else None


@contextlib.contextmanager
def count_traffic():
    """Count what this rank sends through dist collectives inside the block (yields a
    TrafficLog): each collective as a ring over the ranks of ITS group."""
    log, saved = TrafficLog(), {}
    for name in _SHARE:
        fn = getattr(dist, name, None)
        if fn is None:
            continue
        saved[name] = fn

        def wrapper(*args, _name=name, _fn=fn, **kwargs):
            group = _group(_name, args, kwargs)     # a subgroup's ring has its own size
            ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
            log.add(_name, tensor_bytes(_full_tensor(_name, args, kwargs)), len(ranks), ranks)
            return _fn(*args, **kwargs)
        setattr(dist, name, wrapper)
    try:
        yield log
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


# --- DTensor's collectives -----------------------------------------------------------------
class FuncolBytes(CountsSent, TorchDispatchMode):
    """Counts the collectives DTensor runs, and the bytes of each (its input tensor), by watching
    the functional collective ops (torch.ops._c10d_functional) as they are dispatched."""

    OPS = ("all_reduce", "all_reduce_", "reduce_scatter_tensor", "all_gather_into_tensor",
           "all_to_all_single", "broadcast", "broadcast_")

    def __init__(self):
        super().__init__()
        self.reset_counts()

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
            self.traffic.record(name, nbytes)
        return func(*args, **kwargs)

    def bytes_sent(self, op=None):
        """Bytes of the collectives whose name contains `op` ("all_reduce": also all_reduce_)."""
        return sum(r.nbytes for r in self.traffic.records if op is None or op in r.op)

    def calls(self, op):
        return sum(1 for r in self.traffic.records if op in r.op)
