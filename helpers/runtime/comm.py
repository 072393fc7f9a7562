"""One small interface for what ranks say to each other, counted.

`DistComm` wraps torch.distributed (point-to-point sends, all-reduce, all-gather and
reduce-scatter along a dimension) and counts the bytes each
rank sends; `ThreadComm` gives the same calls to threads of one process (the exercise checks run
students' functions that way: a function defined in a notebook cannot be imported by a spawned
rank). Code written against a comm runs on real gloo/NCCL ranks and in a check alike.
"""
import queue
import threading
import time
import traceback
from collections import defaultdict

import torch
import torch.distributed as dist

from .traffic import CountsSent

__all__ = ["DistComm", "ThreadWorld", "ThreadComm", "run_threads", "run_thread_ranks"]


_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def _check_split(t, dim, world):
    if t.shape[dim] % world:
        raise ValueError(f"size {t.shape[dim]} along dim {dim} does not split into {world} "
                         "equal pieces: make it a multiple of the number of ranks")


class DistComm(CountsSent):
    """torch.distributed behind send/recv/all_reduce, counting bytes. Sends are isend (they never
    block the host); `wait()` finishes the outstanding ones. Messages between two ranks match in
    the order they were posted (NCCL ignores tags): a schedule receives in the order its peer
    sends. `sendrecv` posts a send and a receive together (batch_isend_irecv), as a pipeline
    step must: NCCL runs one pair's messages on one stream, and a large send posted before a
    receive waits for the peer's matching receive, which may sit behind its own send."""

    def __init__(self, group=None, device=None):
        self.group, self._pending = group, []
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.device = device or torch.device("cpu")

    def _global(self, r):
        return r if self.group is None else dist.get_global_rank(self.group, r)

    def send(self, t, dst, tag=0):
        t = t.detach().contiguous()
        self._count("send", t, dst)
        self._pending.append((dist.isend(t, self._global(dst), group=self.group, tag=tag), t))

    def recv(self, src, shape, tag=0, dtype=torch.float32):
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        dist.recv(buf, self._global(src), group=self.group, tag=tag)
        return buf

    def sendrecv(self, send=None, recv=None):
        """Post the send (t, dst) and the receive (src, shape[, dtype]) in one
        batch_isend_irecv; wait for the receive (on a GPU: the stream waits; the host goes on)
        and return it. The send stays outstanding until `wait()`."""
        ops, buf = [], None
        if send is not None:
            t, dst = send[0].detach().contiguous(), send[1]
            self._count("send", t, dst)
            ops.append(dist.P2POp(dist.isend, t, self._global(dst), group=self.group))
        if recv is not None:
            src, shape, *dtype = recv
            buf = torch.empty(shape, dtype=dtype[0] if dtype else torch.float32,
                              device=self.device)
            ops.append(dist.P2POp(dist.irecv, buf, self._global(src), group=self.group))
        if not ops:
            return None
        works = dist.batch_isend_irecv(ops)
        if len(works) != len(ops):         # NCCL: one work for the batch (waiting on it makes
            works = works * len(ops)       # the stream wait, not the host)
        if send is not None:
            self._pending.append((works[0], t))
        if recv is not None:
            works[-1].wait()
        return buf

    def all_reduce(self, t, op="sum"):
        """Sum `t` over the ranks, in place (op="max": the largest value)."""
        self._count("all_reduce", t)
        dist.all_reduce(t, op=_OPS[op], group=self.group)
        return t

    def all_gather(self, t, dim=0):
        """Every rank's `t`, concatenated along `dim` in rank order (a new tensor)."""
        t = t.detach().contiguous()
        self._count("all_gather", t)
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t, group=self.group)
        return torch.cat(parts, dim)

    def reduce_scatter(self, t, dim=0):
        """This rank's piece along `dim` (k equal pieces) of the sum of every rank's `t`."""
        _check_split(t, dim, self.world)
        pieces = [p.contiguous() for p in t.detach().chunk(self.world, dim)]
        self._count("reduce_scatter", t)
        out = torch.empty_like(pieces[self.rank])
        dist.reduce_scatter(out, pieces, group=self.group)
        return out

    def wait(self):
        for handle, _ in self._pending:
            handle.wait()
        self._pending = []


class ThreadWorld:
    """The shared state of `world` threads playing ranks: mailboxes and an all-reduce."""

    def __init__(self, world, timeout=5.0):
        self.world, self.timeout = world, timeout
        self.boxes = defaultdict(queue.Queue)
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(world, timeout=timeout)
        self.slots = [None] * world

    def box(self, key):
        with self.lock:
            return self.boxes[key]


class ThreadComm(CountsSent):
    """The DistComm calls for one thread of a ThreadWorld. A rank that waits longer than the
    world's timeout for a message or a collective raises (instead of hanging a check)."""

    def __init__(self, world, rank):
        self.w, self.rank, self.world = world, rank, world.world
        self.device = torch.device("cpu")

    def send(self, t, dst, tag=0):
        if not 0 <= dst < self.world or dst == self.rank:
            raise ValueError(f"rank {self.rank} cannot send to rank {dst}")
        t = t.detach().clone()
        self._count("send", t, dst)
        self.w.box((self.rank, dst, tag)).put(t)

    def recv(self, src, shape, tag=0, dtype=torch.float32):
        try:
            t = self.w.box((src, self.rank, tag)).get(timeout=self.w.timeout)
        except queue.Empty:
            raise TimeoutError(f"rank {self.rank} waited for a message from rank {src} "
                               f"(tag {tag}) that was never sent") from None
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"rank {self.rank} expected shape {tuple(shape)} from rank {src}, "
                             f"got {tuple(t.shape)}")
        return t

    def _exchange(self, t, what):
        """Every rank's copy of `t`, in rank order (a barrier on each side)."""
        w = self.w
        try:
            w.slots[self.rank] = t.detach().clone()
            w.barrier.wait()
            got = list(w.slots)
            w.barrier.wait()
        except threading.BrokenBarrierError:
            raise TimeoutError(f"rank {self.rank} called {what} but not every rank "
                               "did") from None
        return got

    def all_reduce(self, t, op="sum"):
        self._count("all_reduce", t)
        got = self._exchange(t, "all_reduce")
        total = torch.stack(got).amax(0) if op == "max" else sum(got[1:], got[0].clone())
        with torch.no_grad():
            t.copy_(total)
        return t

    def all_gather(self, t, dim=0):
        self._count("all_gather", t)
        return torch.cat(self._exchange(t, "all_gather"), dim)

    def reduce_scatter(self, t, dim=0):
        _check_split(t, dim, self.world)
        self._count("reduce_scatter", t)
        got = self._exchange(t, "reduce_scatter")
        return sum(got[1:], got[0].clone()).chunk(self.world, dim)[self.rank].clone()

    def wait(self):
        pass


def run_thread_ranks(call, w, deadline_s):
    """call(rank) on one thread per rank of the ThreadWorld `w`, for at most `deadline_s` seconds.
    Returns (results, errors, alive): errors as (rank, exception, traceback text), the first
    cause first (a rank's TimeoutError usually follows another rank's failure); alive: the
    ranks still running at the deadline."""
    results, errors = [None] * w.world, []

    def target(r):
        try:
            results[r] = call(r)
        except BaseException as e:   # noqa: BLE001 - handed to the caller
            errors.append((r, e, traceback.format_exc()))
            w.barrier.abort()        # the other ranks stop waiting for this one

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(w.world)]
    for t in threads:
        t.start()
    end = time.monotonic() + deadline_s
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    errors.sort(key=lambda e: isinstance(e[1], TimeoutError))   # stable: order of occurrence
    return results, errors, [r for r, t in enumerate(threads) if t.is_alive()]


def run_threads(fn, world, *args, timeout=5.0):
    """Run fn(comm, *args) on `world` threads, one per rank; returns (results, comms) in rank
    order. The first exception any rank raised is raised again here."""
    w = ThreadWorld(world, timeout)
    comms = [ThreadComm(w, r) for r in range(world)]
    results, errors, _ = run_thread_ranks(lambda r: fn(comms[r], *args), w, timeout * 4 + 30)
    if errors:
        raise errors[0][1]
    return results, comms
