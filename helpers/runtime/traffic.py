"""Bytes sent, counted on ONE log and read ONE way: a `ByteLog` of Transfer records.

Every counter of the course writes there:
- `send(t, src, dst, devices, log)` moves a tensor between simulated devices (Part I) and adds
  its bytes to a `ByteLog` (src, dst: device indices; op: what was sent, e.g. "activation");
- the comms (runtime.comm: DistComm, ThreadComm) add one record per message or collective a
  rank sends (`comm.traffic`);
- `count_traffic()` wraps dist.all_reduce, reduce_scatter_tensor, all_gather_into_tensor /
  all_gather_single and broadcast while it is active (runtime.intercept; gloo does not report
  what it really sent: this is the volume the cost model of Part I counts, from the tensors
  really passed);
- `FuncolBytes` adds the functional collectives DTensor dispatches;
- the exercise checks' World (helpers/checks/_core/world.py) reads one Transfer per message
  its network carried (`World.traffic`).

A Transfer's `dst` is the peer rank of a message (None for a collective); `group` is a
collective's ranks (None for a message, or when unknown). Every reader reads a ByteLog's
methods: `wire_bytes`, `payload_bytes`, `gathered_bytes`, `numbers`, `calls`, `ops`,
`by_group`, `mark` / `since` / `until`. Three sizes, one name each:
- payload: the bytes of the tensor the caller handed over (a message's tensor, a
  collective's input as passed);
- wire: the bytes this rank puts on the network for it. A message's is its payload; a
  collective's is its share in the bandwidth-optimal ring (costs.ring_bytes_per_device: an
  all-reduce 2(k-1)/k of the tensor, a reduce-scatter (k-1)/k of its input, an all-gather
  k-1 times its input, a broadcast (k-1)/k of the tensor: a pipelined chain in which every
  rank but the last forwards it whole, averaged over the k ranks); an all-to-all's, the rows
  that leave the rank (`all_to_all_wire`, on the comms and on DTensor's functional
  all-to-all alike);
- gathered: what a call brings together, the payload, except an all-gather's, counted once
  per rank of its group (the whole gathered tensor every rank ends up with): the checks cap
  it, so that an answer cannot gather a tensor it must not build in small shards.
`numbers` reads payload or gathered in elements instead of bytes (a record's `itemsize`).
"""
import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ..costs import ring_bytes_per_device
from .intercept import intercept

__all__ = ["Transfer", "ByteLog", "CountsSent", "send", "count_traffic", "TrafficLog",
           "FuncolBytes", "wire_share", "all_to_all_wire", "tensor_bytes"]


class Transfer(NamedTuple):
    """One message or collective: what (op), from whom, to whom (a message's peer; None for a
    collective), its payload and its wire bytes, a collective's group of ranks (None: a message,
    or not known) and the bytes of one element (1: not known, `numbers` counts bytes) (module
    docstring)."""
    op: str
    src: int | None
    dst: int | None
    payload: float
    wire: float
    group: tuple[int, ...] | None = None
    itemsize: int = 1

    @property
    def gathered(self) -> float:
        """The payload; an all-gather's once per rank of its group (no group: once)."""
        if self.op.startswith("all_gather"):
            return self.payload * (len(self.group or ()) or 1)
        return self.payload


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes of tensor `t`'s elements (every count of the module starts from it)."""
    return t.numel() * t.element_size()


def wire_share(op: str, payload: float, k: int) -> float:
    """Wire bytes of one collective `op` on k ranks whose caller handed `payload` bytes (an
    all-gather its shard, a reduce-scatter, an all-reduce and a broadcast the full tensor)."""
    if k <= 1:
        return 0
    if op.startswith("all_reduce"):
        return ring_bytes_per_device(payload, k)
    if op.startswith("all_gather"):
        return (k - 1) * payload
    if op.startswith(("reduce_scatter", "broadcast", "all_to_all")):
        return (k - 1) / k * payload    # an all-to-all's: equal splits (all_to_all_wire: others)
    return payload


def _match(r: Transfer, op: str | None, src: int | None, dst: int | None) -> bool:
    return (op is None or r.op == op) and (src is None or r.src == src) and \
        (dst is None or r.dst == dst)


class ByteLog:
    """The one log of bytes sent, and the one way to read it."""

    def __init__(self, records: Iterable[Transfer] = ()) -> None:
        self._records = list(records)

    def record(self, op: str, payload: float, src: int | None = None, dst: int | None = None,
               wire: float | None = None, group: Iterable[int] | None = None,
               itemsize: int = 1) -> None:
        """Add one Transfer; `wire` defaults to the payload (a message)."""
        self._records.append(Transfer(op, src, dst, payload, payload if wire is None else wire,
                                      None if group is None else tuple(group), itemsize))

    @property
    def records(self) -> list[Transfer]:
        """The Transfer records, in order (a copy: appending to it records nothing)."""
        return list(self._records)

    def wire_bytes(self, op: str | None = None, src: int | None = None,
                   dst: int | None = None) -> float:
        """Bytes put on the network, in all or only by those records (of `op`, from `src`,
        to `dst`)."""
        return sum(r.wire for r in self._records if _match(r, op, src, dst))

    def payload_bytes(self, op: str | None = None, src: int | None = None,
                      dst: int | None = None) -> float:
        """Bytes of the tensors handed over, in all or only by those records."""
        return sum(r.payload for r in self._records if _match(r, op, src, dst))

    def gathered_bytes(self, op: str | None = None, src: int | None = None,
                       dst: int | None = None) -> float:
        """Bytes the calls bring together (Transfer.gathered), in all or only by those
        records."""
        return sum(r.gathered for r in self._records if _match(r, op, src, dst))

    def numbers(self, op: str | None = None, src: int | None = None, dst: int | None = None,
                gathered: bool = False) -> float:
        """Elements handed over (gathered=True: brought together), in all or only by those
        records: a float64 number counts as one, as a float32 one does."""
        return sum((r.gathered if gathered else r.payload) // r.itemsize
                   for r in self._records if _match(r, op, src, dst))

    def calls(self, op: str | None = None, src: int | None = None,
              dst: int | None = None) -> int:
        """How many records (of `op`, from `src`, to `dst`)."""
        return sum(1 for r in self._records if _match(r, op, src, dst))

    def ops(self) -> dict[str, int]:
        """{op: calls}, in the order each op first appeared."""
        out = {}
        for r in self._records:
            out[r.op] = out.get(r.op, 0) + 1
        return out

    def by_group(self) -> "dict[tuple[int, ...], ByteLog]":
        """{a collective's group (its ranks; () for a message or an unknown group): a ByteLog of
        its records}."""
        out = {}
        for r in self._records:
            out.setdefault(r.group or (), ByteLog())._records.append(r)
        return out

    def mark(self) -> int:
        """A place in the log, for `since` and `until` (e.g. where forward ends and backward
        begins)."""
        return len(self._records)

    def since(self, mark: int = 0) -> "ByteLog":
        """A ByteLog of the records after `mark`."""
        return ByteLog(self._records[mark:])

    def until(self, mark: int) -> "ByteLog":
        """A ByteLog of the records before `mark`."""
        return ByteLog(self._records[:mark])

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.ops()}, wire_bytes={self.wire_bytes():.0f})"


class CountsSent:
    """A rank's counts: `traffic`, a ByteLog (read it with its methods); `reset_counts()`
    starts afresh."""

    def reset_counts(self) -> None:
        """Forget what was counted so far (e.g. after warm-up steps)."""
        self._traffic = ByteLog()

    @property
    def traffic(self) -> ByteLog:
        if "_traffic" not in self.__dict__:
            self._traffic = ByteLog()
        return self._traffic

    def _count(self, op: str, t: torch.Tensor, peer: int | None = None) -> None:
        """Record a message to `peer` (its wire bytes: its payload) or, without a peer, a
        collective over this comm's ranks (its wire bytes: wire_share)."""
        payload = tensor_bytes(t)
        wire = payload if peer is not None else wire_share(op, payload, self.world)
        self.traffic.record(op, payload, getattr(self, "rank", None), peer, wire,
                            itemsize=t.element_size())


def send(t: torch.Tensor, src: int, dst: int, devices: Sequence[torch.device | str],
         log: ByteLog | None = None, what: str = "") -> torch.Tensor:
    """Move tensor `t` from devices[src] to devices[dst], logging its bytes when src != dst."""
    if log is not None and src != dst:
        log.record(what, tensor_bytes(t), src, dst, itemsize=t.element_size())
    return t.to(devices[dst])


class TrafficLog(ByteLog):
    """What this rank sent through dist collectives; each record's group is its group's global
    ranks (a mesh dimension's: `by_group`)."""

    def add(self, name: str, full_bytes: int, world: int,
            ranks: Iterable[int] | None = None) -> None:
        """One collective `name` on `world` ranks of a `full_bytes` tensor (an all-gather's
        output, whose input is a 1/world shard)."""
        payload = full_bytes // world if name.startswith("all_gather") else full_bytes
        self.record(name, payload, wire=wire_share(name, payload, world),
                    group=tuple(ranks) if ranks else None)


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
def count_traffic() -> Iterator[TrafficLog]:
    """Count what this rank sends through dist collectives inside the block (yields a
    TrafficLog): each collective as a ring over the ranks of ITS group. It rebinds
    torch.distributed's functions for the whole process (runtime.intercept), so it refuses a
    thread rank (ranks nesting it would restore each other's wrappers): there, read the rank's
    `comm.traffic` (a property)."""
    log = TrafficLog()

    def count(name, args, kwargs):
        group = _group(name, args, kwargs)     # a subgroup's ring has its own size
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        log.add(name, tensor_bytes(_full_tensor(name, args, kwargs)), len(ranks), ranks)
    with intercept(_GROUP_AT, count, who="count_traffic"):
        yield log


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
            payload = sum(tensor_bytes(t) for t in tensors if isinstance(t, torch.Tensor))
            group = _funcol_group(args, kwargs)
            if name == "all_to_all_single":     # (input, output_splits, input_splits, group)
                splits = kwargs.get("input_split_sizes", args[2] if len(args) > 2 else None)
                wire = all_to_all_wire(first, splits, group.size(), group.rank())
            else:
                wire = wire_share(name, payload, group.size())
            self.traffic.record(name, payload, wire=wire)
        return func(*args, **kwargs)


def all_to_all_wire(x: torch.Tensor, in_splits, k: int, rank: int) -> float:
    """Wire bytes of an all-to-all of x on k ranks: the rows that leave `rank` (every split but
    its own; no splits: equal ones), as the comms count it."""
    if not in_splits:
        return wire_share("all_to_all", tensor_bytes(x), k)
    row = tensor_bytes(x[0]) if len(x) else 0
    return sum(int(s) for j, s in enumerate(in_splits) if j != rank) * row


def _funcol_group(args, kwargs):
    """The process group a functional collective names (its group_name: the last string)."""
    from torch.distributed.distributed_c10d import _resolve_process_group
    name = kwargs.get("group_name") or [a for a in args if isinstance(a, str)][-1]
    return _resolve_process_group(name)
