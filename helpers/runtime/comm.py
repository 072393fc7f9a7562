"""One small interface for what ranks say to each other, counted.

`DistComm` wraps torch.distributed (point-to-point sends, batched sends and receives with
isendrecv, all-reduce, all-gather and reduce-scatter along a dimension, all-to-all with uneven
splits) and counts the bytes each rank sends; `ThreadComm` gives the same calls to the thread
ranks of a ThreadWorld (runtime.thread_world: `launch(..., threads=True)` and the exercise
checks, which run a function defined in a notebook that a spawned rank could not import).
Code written against a comm runs on real gloo/NCCL ranks and in a check alike.
"""
from collections.abc import Sequence
from typing import Protocol

import torch
import torch.distributed as dist

from .traffic import ByteLog, CountsSent, all_to_all_wire, tensor_bytes

__all__ = ["Comm", "DistComm", "ThreadComm", "Exchange"]


class Exchange:
    """What `isendrecv` returns: `wait()` finishes every send and receive it posted and returns
    the received tensors, in the order of the receives; the sent tensors are let go then.
    `received()` returns them as soon as they arrive, the sends possibly still on their way."""

    def __init__(self, works: Sequence, got: Sequence, sent: Sequence = (),
                 finish: Sequence = ()) -> None:
        # works: one per posted op, the receives' first, or one for the whole batch (NCCL);
        # each is waited for once (gloo's receive would wait for a second message);
        # finish: what wait() calls last (a ThreadComm's sends: their waits recorded)
        works, self._got, self._sent = list(works), list(got), list(sent)
        split = len(works) == len(got) + len(sent)
        self._recv_works = works[:len(got)] if split else works
        self._works = works[len(got):] if split else []
        self._finish = list(finish)

    def received(self) -> list[torch.Tensor]:
        """The received tensors, in the order of the receives, once they have arrived."""
        for w in self._recv_works:
            w.wait()
        self._recv_works = []
        self._got = [g() if callable(g) else g for g in self._got]
        return list(self._got)

    def wait(self) -> list[torch.Tensor]:
        got = self.received()
        for w in self._works:
            w.wait()
        for done in self._finish:
            done()
        self._works, self._sent, self._finish = [], [], []
        return got


class Comm(Protocol):
    """What code written against a comm may call: DistComm (processes) and ThreadComm (thread
    ranks) both give it (tests/test_runtime_types.py holds them to it). `rank` and `world` are
    within the comm's group; sends return at once, `wait()` finishes them; `isendrecv` posts
    several sends and receives together and returns an Exchange to wait on."""
    rank: int
    world: int
    device: torch.device

    def send(self, t: torch.Tensor, dst: int, tag: int = 0) -> None: ...

    def recv(self, src: int, shape: Sequence[int], tag: int = 0,
             dtype: torch.dtype = torch.float32) -> torch.Tensor: ...

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor: ...

    def all_gather(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor: ...

    def reduce_scatter(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor: ...

    def sendrecv(self, send: tuple | None = None, recv: tuple | None = None
                 ) -> torch.Tensor | None: ...

    def isendrecv(self, sends: Sequence[tuple], recvs: Sequence[tuple]) -> Exchange: ...

    def all_to_all(self, x: torch.Tensor, in_splits: Sequence[int],
                   out_splits: Sequence[int], tag: int = 300, op: str = "all_to_all"
                   ) -> torch.Tensor: ...

    def wait(self) -> None: ...

    @property
    def traffic(self) -> ByteLog: ...

    def reset_counts(self) -> None: ...


_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def wire(t: torch.Tensor) -> torch.Tensor:
    """What travels of tensor `t` between thread ranks: its values, shape and dtype, laid out
    afresh (a real network carries bytes: the sender's strides, even those of a size-1 or empty
    dimension, stay home)."""
    return t.detach().clone(memory_format=torch.contiguous_format)


def _reduce_op(op: str) -> dist.ReduceOp:
    """The ReduceOp of `op`, the same ops on both comms; any other: ValueError naming them."""
    if op not in _OPS:
        raise ValueError(f"all_reduce(op={op!r}): the comms reduce with "
                         f"{' or '.join(map(repr, _OPS))} (an average: the sum over comm.world)")
    return _OPS[op]


def _splits(sizes):
    """Split sizes as ints (a tensor's `.tolist()` or numpy integers alike); an int of a subclass
    is kept as it is (a grader's tagged count keeps its tag: int() would drop it)."""
    return [s if isinstance(s, int) and not isinstance(s, bool) else int(s) for s in sizes]



def _validate_split(t, dim, world):
    if t.shape[dim] % world:
        raise ValueError(f"size {t.shape[dim]} along dim {dim} does not split into {world} "
                         "equal pieces: make it a multiple of the number of ranks")


class _Exchanges(CountsSent):
    """sendrecv and wait for both comms, through their isendrecv: one code path exchanges."""
    _pending: list

    def sendrecv(self, send: tuple | None = None, recv: tuple | None = None
                 ) -> torch.Tensor | None:
        """Post the send (t, dst) and the receive (src, shape[, dtype]) together (isendrecv);
        wait for the receive (on a GPU: the stream waits; the host goes on) and return it
        (None without one). The send stays outstanding until `wait()`: waiting for it here
        could wait for a receive the peer posts only later."""
        sends = [] if send is None else [(send[0], send[1], 0)]
        recvs = [] if recv is None else [(recv[0], recv[1], *(recv[2:] or [torch.float32]), 0)]
        if not (sends or recvs):
            return None
        exchange = self.isendrecv(sends, recvs)
        if sends:
            self._pending.append((exchange, None))
        return exchange.received()[0] if recvs else None

    def wait(self) -> None:
        """Finish the sends still outstanding."""
        for handle, _ in self._pending:
            handle.wait()
        self._pending = []


class DistComm(_Exchanges):
    """torch.distributed behind send/recv/all_reduce, counting bytes. Sends are isend (they never
    block the host); `wait()` finishes the outstanding ones. Messages between two ranks match in
    the order they were posted (NCCL ignores tags): a schedule receives in the order its peer
    sends. `sendrecv` posts a send and a receive together (batch_isend_irecv), as a pipeline
    step must: NCCL runs one pair's messages on one stream, and a large send posted before a
    receive waits for the peer's matching receive, which may sit behind its own send."""

    def __init__(self, group: dist.ProcessGroup | None = None,
                 device: torch.device | None = None) -> None:
        self.group, self._pending = group, []
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.device = device or torch.device("cpu")

    def _global(self, r: int) -> int:
        return r if self.group is None else dist.get_global_rank(self.group, r)

    def send(self, t: torch.Tensor, dst: int, tag: int = 0) -> None:
        t = t.detach().contiguous()
        self._count("send", t, dst)
        self._pending.append((dist.isend(t, self._global(dst), group=self.group, tag=tag), t))

    def recv(self, src: int, shape: Sequence[int], tag: int = 0,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        dist.recv(buf, self._global(src), group=self.group, tag=tag)
        return buf

    def isendrecv(self, sends: Sequence[tuple], recvs: Sequence[tuple]) -> Exchange:
        """Post several sends (t, dst, tag) and receives (src, shape, dtype, tag) at once, in one
        batch_isend_irecv, without waiting: the returned Exchange's wait() finishes them (on a
        GPU: the stream waits) and returns the received tensors. Each send is counted as
        `send` would count it."""
        ops, got, sent = [], [], []
        for src, shape, dtype, tag in recvs:
            got.append(torch.empty(shape, dtype=dtype, device=self.device))
            ops.append(dist.P2POp(dist.irecv, got[-1], self._global(src), self.group, tag))
        for t, dst, tag in sends:
            sent.append(t.detach().contiguous())
            self._count("send", sent[-1], dst)
            ops.append(dist.P2POp(dist.isend, sent[-1], self._global(dst), self.group, tag))
        return Exchange(dist.batch_isend_irecv(ops) if ops else [], got, sent)

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Sum `t` over the ranks, in place (op="max": the largest value)."""
        reduce_op = _reduce_op(op)
        self._count("all_reduce", t)
        dist.all_reduce(t, op=reduce_op, group=self.group)
        return t

    def all_gather(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Every rank's `t`, concatenated along `dim` in rank order (a new tensor)."""
        t = t.detach().contiguous()
        self._count("all_gather", t)
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t, group=self.group)
        return torch.cat(parts, dim)

    def reduce_scatter(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """This rank's piece along `dim` (k equal pieces) of the sum of every rank's `t`."""
        _validate_split(t, dim, self.world)
        pieces = [p.contiguous() for p in t.detach().chunk(self.world, dim)]
        self._count("reduce_scatter", t)
        out = torch.empty_like(pieces[self.rank])
        dist.reduce_scatter(out, pieces, group=self.group)
        return out

    def all_to_all(self, x: torch.Tensor, in_splits: Sequence[int],
                   out_splits: Sequence[int], tag: int = 300, op: str = "all_to_all"
                   ) -> torch.Tensor:
        """Rows in_splits[j] of x (in order) go to rank j; returns the rows received,
        out_splits[j] from rank j, in rank order: one all_to_all_single (gloo and NCCL both have
        it). Counted under `op`: x as payload, the bytes sent to other ranks as wire; `tag` is
        unused."""
        in_splits, out_splits = _splits(in_splits), _splits(out_splits)
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=self.group)
        self.traffic.record(op, tensor_bytes(x), self.rank,
                            wire=all_to_all_wire(x, in_splits, self.world, self.rank),
                            itemsize=x.element_size())
        return out


def _network(world):
    """A ThreadComm's way to its world's network: closures, so the comm (which a check hands an
    answer) holds no attribute that leads to the world and its records."""
    def send(t, dst, tag):
        world.send(t, dst, tag)

    def post(t, dst, tag, call):
        """Send `t` as comm call `call` ("send", "isendrecv") posts it, outstanding until the
        rank's wait: what that wait calls, which returns once the peer received it (as on
        gloo and NCCL: a wait that no receive can meet is a Deadlock) and records it."""
        m = world.send(t, dst, tag)
        world.on_send(m.rank, m, t, call)

        def waited():
            if m.waited is None:
                world.wait_received(m, _WAITS[call])
                m.waited = world.event(m.rank, "wait", m)
        return waited

    def post_unrecorded(t, dst, tag, call):
        """`post` in a world that keeps no records (launch): the wait only blocks."""
        m = world.send(t, dst, tag)
        return lambda: world.wait_received(m, _WAITS[call])

    def recv(src, tag, shape, dtype, posted=False):
        return world.recv(src, tag, shape=shape, dtype=dtype, posted=posted)

    def post_recv(src, tag):
        world.post_recv(src, tag)

    def collective(op, ranks, t, payload, combine, deliver):
        return world.collective(op, ranks, t, payload, combine, deliver)
    return send, post if world.record else post_unrecorded, recv, post_recv, collective


_WAITS = {"send": "comm.wait()",
          "isendrecv": "the wait() of its isendrecv's Exchange (comm.wait() after a sendrecv)"}


class _Posted:
    """A ThreadComm send that `comm.wait()` finishes: its wait recorded (runtime.work's way),
    where a DistComm's isend is waited for."""
    __slots__ = ("wait",)

    def __init__(self, waited):
        self.wait = waited


class ThreadComm(_Exchanges):
    """The DistComm calls for one rank of a ThreadWorld (runtime.thread_world), whose network
    records every message. A rank that waits longer than the world's timeout for a message or
    a collective raises TimeoutError (instead of hanging a check). The comm holds no reference
    to its world (only `_network`'s closures): a check's world keeps the records it judges.
    A send is copied as it is posted, yet stays outstanding, as DistComm's isend, until
    `wait()` (isendrecv's: the Exchange's wait()); a recording world sees it then
    (`ThreadWorld.on_send`, the wait in its timeline), one without records keeps nothing."""

    def __init__(self, world, rank: int) -> None:   # world: a ThreadWorld
        self.rank, self.world, self._pending = rank, world.size, []
        self.device = torch.device("cpu")
        self._group = range(world.size)          # the world ranks of this comm's ranks
        (self._send, self._post, self._recv, self._post_recv,
         self._collective_call) = _network(world)

    def subgroup(self, ranks: Sequence[int]) -> "ThreadComm":
        """This rank's comm over the world ranks `ranks` (this rank among them), as
        DistComm(dist.new_group(ranks)) is: its rank, world and peers are within the group,
        and its collectives meet those ranks only (a sub-group of a mesh)."""
        me, ranks = self._group[self.rank], [int(r) for r in ranks]
        comm = object.__new__(type(self))
        comm.__dict__.update({k: v for k, v in vars(self).items() if k != "_traffic"})
        comm.rank, comm.world, comm._group = ranks.index(me), len(ranks), ranks
        comm._pending = []
        return comm

    def send(self, t: torch.Tensor, dst: int, tag: int = 0) -> None:
        t = t.detach()
        waited = self._post(t, self._group[dst], tag, "send")
        self._count("send", t, dst)
        self._pending.append((_Posted(waited), None))

    def recv(self, src: int, shape: Sequence[int], tag: int = 0,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._recv(self._group[src], tag, shape=tuple(shape), dtype=dtype)

    def isendrecv(self, sends: Sequence[tuple], recvs: Sequence[tuple]) -> Exchange:
        """DistComm.isendrecv: the receives are posted and the sends go at once (a
        ThreadWorld's send never blocks), each send outstanding until the Exchange's wait(),
        which returns once the peer received it; the receives are taken as they are asked
        for; counted as DistComm counts it."""
        for src, _, _, tag in recvs:
            self._post_recv(self._group[src], tag)
        finish = []
        for t, dst, tag in sends:
            t = t.detach()
            finish.append(self._post(t, self._group[dst], tag, "isendrecv"))
            self._count("send", t, dst)
        return Exchange([], [lambda src=src, shape=shape, dtype=dtype, tag=tag:
                             self._recv(self._group[src], tag, tuple(shape), dtype, posted=True)
                             for src, shape, dtype, tag in recvs], finish=finish)

    def _collective(self, op, t, combine, finish):
        """Every rank's copy of `t` (in rank order) -> combine -> finish(mine) in this rank."""
        got = []
        self._collective_call(op, self._group, t, wire(t), combine,
                              lambda mine: got.append(finish(mine)))
        return got[0]

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Sum `t` over the ranks, in place (op="max": the largest value)."""
        _reduce_op(op)
        self._count("all_reduce", t)

        def combine(ps):
            total = torch.stack(ps).amax(0) if op == "max" else sum(ps[1:], ps[0].clone())
            return [total] * len(ps)
        return self._collective("all_reduce", t, combine, lambda total: t.copy_(total))

    def all_gather(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Every rank's `t`, concatenated along `dim` in rank order (a new tensor)."""
        self._count("all_gather", t)
        return self._collective("all_gather", t, lambda ps: [ps] * len(ps),
                                lambda ps: torch.cat(ps, dim))

    def reduce_scatter(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """This rank's piece along `dim` (k equal pieces) of the sum of every rank's `t`."""
        _validate_split(t, dim, self.world)
        self._count("reduce_scatter", t)

        def combine(ps):
            return [sum(ps[1:], ps[0].clone()).chunk(len(ps), dim)] * len(ps)
        return self._collective("reduce_scatter", t, combine,
                                lambda pieces: pieces[self.rank].clone())

    def all_to_all(self, x: torch.Tensor, in_splits: Sequence[int],
                   out_splits: Sequence[int], tag: int = 300, op: str = "all_to_all"
                   ) -> torch.Tensor:
        """DistComm.all_to_all as messages: a send to every other rank and a receive from each
        (the world records each one); counted as DistComm counts it, one call under `op`, x as
        payload, the bytes that left this rank as wire."""
        in_splits, out_splits = _splits(in_splits), _splits(out_splits)
        pieces = list(x.split(in_splits))
        for j in range(self.world):
            if j != self.rank:
                self._send(pieces[j].detach(), self._group[j], tag)
        self.traffic.record(op, tensor_bytes(x), self.rank,
                            wire=all_to_all_wire(x, in_splits, self.world, self.rank),
                            itemsize=x.element_size())
        return torch.cat([pieces[j].clone() if j == self.rank else
                          self.recv(j, (out_splits[j], *x.shape[1:]), tag=tag, dtype=x.dtype)
                          for j in range(self.world)])
