"""One small interface for what ranks say to each other, counted.

`DistComm` wraps torch.distributed (point-to-point sends, all-reduce) and counts the bytes each
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

__all__ = ["DistComm", "ThreadWorld", "ThreadComm", "run_threads", "run_thread_ranks"]


class _Counting:
    """Shared by both comms: `log` holds (op, peer, bytes) for every message this rank sent."""

    def _count(self, op, t, peer=None):
        self.log.append((op, peer, t.numel() * t.element_size()))

    def bytes_sent(self, op=None):
        """Bytes this rank handed to the network (an all-reduce counts its payload once)."""
        return sum(b for o, _, b in self.log if op is None or o == op)

    def calls(self, op):
        return sum(1 for o, _, _ in self.log if o == op)


class DistComm(_Counting):
    """torch.distributed behind send/recv/all_reduce, counting bytes. Sends are isend (they never
    block, so a schedule cannot deadlock on them); `wait()` finishes the outstanding ones."""

    def __init__(self, group=None, device=None):
        self.group, self.log, self._pending = group, [], []
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

    def all_reduce(self, t):
        """Sum `t` over the ranks, in place."""
        self._count("all_reduce", t)
        dist.all_reduce(t, group=self.group)
        return t

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


class ThreadComm(_Counting):
    """The DistComm calls for one thread of a ThreadWorld. A rank that waits longer than the
    world's timeout for a message or a collective raises (instead of hanging a check)."""

    def __init__(self, world, rank):
        self.w, self.rank, self.world, self.log = world, rank, world.world, []
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

    def all_reduce(self, t):
        self._count("all_reduce", t)
        w = self.w
        try:
            w.slots[self.rank] = t.detach().clone()
            w.barrier.wait()
            total = sum(w.slots[1:], w.slots[0].clone())
            w.barrier.wait()
        except threading.BrokenBarrierError:
            raise TimeoutError(f"rank {self.rank} called all_reduce but not every rank "
                               "did") from None
        with torch.no_grad():
            t.copy_(total)
        return t

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
