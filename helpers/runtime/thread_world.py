"""Ranks as threads of this process, joined by a network that records every message: the one
thread world. `launch(fn, world, threads=True)` runs on it, and the exercise
checks build their recording world on it (helpers/checks/_core/world.py adds torch.distributed,
a per-rank Recorder, allowed calls and data provenance through the hooks below).

    w = ThreadWorld(3, timeout=5.0)
    results = w.run(fn, X)               # fn(comm, X) on each rank, comm = w.comm(rank)
    comms = [w.comm(r) for r in range(3)]   # each rank's ThreadComm, its counts
    w.messages                           # every send, recv and collective call, in order

Each Message records op, caller, source and destination, the storage and shape of the tensor
handed over, bytes, when it was launched and when (if ever) it was waited for. Collectives meet
like real ones (every rank of the group, in the same order); an async one is complete when its
launch returns (every rank of the group launched it), its wait recorded where the rank first
observes that (work.py: wait(), is_completed(), its future); a comm's send is outstanding
until the rank's `comm.wait()` (isendrecv's: the Exchange's wait()), as DistComm's isend is,
and its wait is recorded there (`on_send`). A recv into a
buffer of another shape raises ValueError naming both shapes, and the message stays unreceived
(`takes`, `mismatch`: hooks the checks' World makes stricter). What travels is the tensor's
values, shape and dtype (`comm.wire`), not its strides. A rank that
waits longer than `timeout` raises TimeoutError naming what it waited for; when one rank fails,
the ranks waiting on it stop quietly, so the first cause is reported (a Deadlock is raised in
each blocked rank's call: found as the last other rank returns, it is still theirs).
A run has one deadline: then the ranks blocked in a comm call wake and stop, and a rank still
computing stops at its next comm call (a thread cannot be killed: one that never calls the
comm again runs on, a daemon thread).
"""
import collections
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from .comm import ThreadComm, wire
from .errors import Deadlock, LaunchTimeout
from .intercept import RANK_THREAD
from .thread_waits import SendWaits
from .work import Work

__all__ = ["ThreadWorld"]


class _Aborted(BaseException):
    """Another rank failed first: this one stops quietly."""


class Message:
    """One send, receive or collective call, as the network saw it."""

    __slots__ = ("op", "rank", "src", "dst", "ranks", "tag", "key", "shape", "dtype", "nbytes",
                 "seq", "async_op", "waited", "tensor", "index")

    def __init__(self, op: str, rank: int | None, t: torch.Tensor | None, seq: int,
                 src: int | None = None, dst: int | None = None, ranks: tuple | None = None,
                 tag: int = 0, async_op: bool = False) -> None:
        self.op, self.rank, self.src, self.dst = op, rank, src, dst
        self.ranks, self.tag = ranks, tag
        self.key = t.untyped_storage()._cdata if t is not None else None
        self.shape = tuple(t.shape) if t is not None else ()
        self.dtype = t.dtype if t is not None else None
        self.nbytes = t.numel() * t.element_size() if t is not None else 0
        self.seq, self.async_op, self.waited = seq, async_op, None
        self.index = None       # a send's place among its (src, dst, tag) messages
        self.tensor = wire(t) if t is not None else None     # what was handed over

    @property
    def collective(self) -> bool:
        return self.op not in ("send", "recv")

    def __repr__(self) -> str:
        peer = f" {self.src}->{self.dst}" if not self.collective else f" by rank {self.rank}"
        return f"{self.op}{peer} {list(self.shape)} ({self.nbytes} B) #{self.seq}"


class ThreadWorld(SendWaits):
    """`size` ranks as threads (see the module's docstring). Subclasses hook in with
    `run_context()` (around a whole run), `rank_context(rank)` (around each rank's thread),
    `comm_context()` (around the network's own work in a rank), `landed_context(message)` (around
    a callback of an async Work's future), `on_enter()` (first in every
    comm call), `allowed(op)`, `takes(got, shape, dtype)` and `mismatch(src, tag, want, got)`
    (what a recv accepts), `on_message(rank, kind, m)` (each recorded Message) and
    `on_send(rank, m, t, call)` (a comm's send, outstanding until the rank's wait); they may
    override `start`, `event`, `send`, `recv` and `collective` calling super(), and use
    `locked()` (the world's one re-entrant lock) and `fail(rank, error)` (wake and stop the
    ranks waiting). Nothing else is the contract (tests/test_thread_world.py holds a subclass
    to these names): the grader's World (helpers/checks/_core/world.py) uses only these."""

    def __init__(self, size: int, timeout: float = 10.0, deadline: float | None = None,
                 record: bool = True) -> None:
        """timeout: how long a rank waits for a message or a collective; deadline: how long a
        run waits for its ranks (default: three timeouts and 5 s per rank, since the ranks share
        one interpreter, so a run takes longer the more ranks it has); record: keep every Message
        (and a copy of its tensor) in `messages` and `timeline` (off for long runs: launch)."""
        if size < 1:
            raise ValueError(f"a world needs at least one rank, got {size}: pass size >= 1")
        self.size, self.timeout, self.record = size, timeout, record
        self.messages, self.timeline = [], [[] for _ in range(size)]
        self._seq = itertools.count()
        self._cond = threading.Condition(threading.RLock())
        self._local = threading.local()
        self._boxes = collections.defaultdict(collections.deque)
        self._sent = collections.Counter()      # per (src, dst, tag): messages sent
        self._claimed = collections.Counter()   # per (src, dst, tag): receives posted
        self._blocked = {}                      # rank -> (ready, words, kind, peers): _wait
        self._live = set(range(size))           # ranks that have not returned
        self._slots, self._done = {}, {}
        self._taken = collections.Counter()     # per call: ranks that took their result
        self._calls = collections.Counter()
        self._failed = None
        self._ended = False                     # the deadline passed: every comm call stops
        self._comms = {}
        self.deadline = (timeout * 3 + 5) * size if deadline is None else deadline

    # --- hooks (no-ops here) ---------------------------------------------------------------------
    def run_context(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def rank_context(self, rank: int) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def comm_context(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def landed_context(self, message: Message) -> AbstractContextManager[Any]:
        """Around a `then()` or `add_done_callback()` callback of the future of `message`'s
        async Work (work.py): the work has completed there."""
        return contextlib.nullcontext()

    def on_enter(self) -> None:
        """Called first in every send, recv and collective, in the calling rank: raise to stop
        the call (a subclass that has already failed the run refuses every later call)."""

    def allowed(self, op: str) -> None:
        """Raise (in the calling rank) to refuse a call; here every call is allowed."""

    def on_message(self, rank: int, kind: str, m: Message) -> None:
        """Called, under the lock, after Message `m` was recorded (record=True) in `messages`
        and in `rank`'s timeline as `kind` ("send", "recv", "launch" or the collective)."""

    def on_send(self, rank: int, m: Message, t: torch.Tensor, call: str) -> None:
        """Called in `rank` (record=True) after its ThreadComm posted `t` as Message `m` with
        comm call `call` ("send"; "isendrecv", which sendrecv posts through): `t` stays
        outstanding, as a DistComm's isend on processes, until the rank's wait (`comm.wait()`,
        the Exchange's wait()) records `m.waited` with a "wait" in its timeline."""

    # --- the world's lock and its failure, for subclasses -------------------------------------
    def locked(self) -> threading.Condition:
        """The world's one lock (re-entrant), as a context manager: hold it to read or change
        the records (messages, timeline) while ranks run, or to wait with the network."""
        return self._cond

    def fail(self, rank: int | None, error: BaseException | None) -> None:
        """Record the run's first failure (`rank`, `error`) and wake every rank waiting on a
        message or a collective: they stop quietly, so the first cause is the one reported."""
        with self._cond:
            if self._failed is None:
                self._failed = (rank, error)
            self._cond.notify_all()

    # --- who is calling ------------------------------------------------------------------------
    @property
    def rank(self) -> int | None:
        """The rank of the calling thread (None outside the world's threads)."""
        return getattr(self._local, "rank", None)

    def comm(self, rank: int) -> ThreadComm:
        """Rank `rank`'s ThreadComm (the same object every time: it counts what it sent)."""
        with self._cond:
            if rank not in self._comms:
                self._comms[rank] = ThreadComm(self, rank)
            return self._comms[rank]

    def event(self, rank: int, kind: str, detail: Any = None) -> int:
        """Append to `rank`'s timeline; returns the event's global sequence number."""
        with self._cond:
            seq = next(self._seq)
            self.timeline[rank].append((seq, kind, detail))
            return seq

    def mark(self, label: str) -> int:
        """A caller's own marker in the calling rank's timeline ("backward done")."""
        return self.event(self.rank, "mark", label)

    def sent(self, op: str | None = None, rank: int | None = None) -> list[Message]:
        """The messages (of kind `op`, by `rank`) in the order they happened."""
        return [m for m in self.messages if op in (None, m.op) and rank in (None, m.rank)]

    # --- running ranks -------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """fn(comm, *args) on every rank; their results in rank order. The first cause of a
        failure is raised as it was raised (a rank's TimeoutError comes after other errors);
        ranks still running at the deadline: LaunchTimeout (a TimeoutError too)."""
        return self._raise(*self.start(lambda r: fn(self.comm(r), *args)))

    def rank_body(self, fn: Callable[[int, int, dict[str, Any]], Any],
                  cfg: Mapping[str, Any] | None = None) -> Callable[[int], Any]:
        """The one way a thread rank calls a launch target (helpers.launch(..., threads=True)
        starts it): fn(rank, size, cfg), cfg with what a process rank's has (its device, the
        CPU) and the rank's ThreadComm ("comm")."""
        def one(r):
            return fn(r, self.size, dict(cfg or {}, comm=self.comm(r),
                                         device=torch.device("cpu")))
        return one

    def start(self, body: Callable[[int], Any]
              ) -> tuple[list[Any], list[tuple[int | None, BaseException]], list[int]]:
        """body(rank) on one thread per rank, for at most the world's deadline. Returns
        (results, errors, stuck): errors as (rank, exception), the first cause first; stuck:
        the ranks still running."""
        results, errors = [None] * self.size, []
        self._live = set(range(self.size))

        def target(r):
            self._local.rank = RANK_THREAD.rank = r
            try:
                with self.rank_context(r):
                    results[r] = body(r)
            except _Aborted:
                pass
            except BaseException as e:   # handed to the caller
                with self._cond:
                    errors.append((r, e))   # words: the caller's (no __str__ runs here)
                self.fail(r, e)
            finally:
                with self._cond:
                    self._live.discard(r)
                    self._deadlocked()          # the ranks left may wait for this one
                    self._cond.notify_all()

        with self.run_context():
            threads = [threading.Thread(target=target, args=(r,), daemon=True,
                                        name=f"rank {r}") for r in range(self.size)]
            for t in threads:
                t.start()
            end = time.monotonic() + self.deadline        # one deadline for the whole run
            for t in threads:
                t.join(max(0.0, end - time.monotonic()))
        with self._cond:
            failed = self._failed
        if not errors and failed is not None and isinstance(failed[1], Deadlock):
            errors.append(failed)      # each blocked rank raised it in its call, and caught it
        errors.sort(key=lambda e: isinstance(e[1], TimeoutError))   # stable: order of occurrence
        stuck = [r for r, t in enumerate(threads) if t.is_alive()]
        if stuck:
            self._end()
        return results, errors, stuck

    def _end(self):
        """The deadline passed: wake the blocked ranks; a later comm call stops its rank."""
        self._ended = True
        self.fail(None, None)

    def _enter(self):
        if self._ended:
            raise _Aborted()
        self.on_enter()

    def _raise(self, results, errors, stuck):
        if errors:
            raise errors[0][1]
        if stuck:
            raise LaunchTimeout(stuck, self.deadline, threads=True)
        return results

    def _log(self, rank, kind, m):
        if self.record:
            self.messages.append(m)
            self.timeline[rank].append((m.seq, kind, m))
            self.on_message(rank, kind, m)

    def _wait(self, ready, what, blocked=None, kind="recv", peers=list):
        """Block until ready() (under the lock), another rank failed, or the timeout; when every
        rank still running waits with nothing deliverable: a Deadlock, raised in each blocked
        rank's call (`blocked`, `kind`, `peers()`: its words, "send" "recv" or "collective",
        whom it waits for)."""
        rank = self.rank
        if not ready() and rank is not None:
            self._blocked[rank] = (ready, blocked or f"waits for {what}", kind, peers)
            try:
                error = self._deadlocked()
                if error is not None:
                    raise error
                ok = self._cond.wait_for(lambda: ready() or self._failed is not None,
                                         self.timeout)
            finally:
                self._blocked.pop(rank, None)
        else:
            ok = self._cond.wait_for(lambda: ready() or self._failed is not None, self.timeout)
        if not ok:
            raise TimeoutError(f"rank {self.rank} waited {self.timeout:g} s for {what}")
        if not ready():
            raise self._woken(rank) or _Aborted()

    # --- point to point ------------------------------------------------------------------------
    def send(self, t: torch.Tensor, dst: int, tag: int = 0,
             async_op: bool = False) -> Message:
        self._enter()
        rank = self.rank
        self.allowed("send")
        if not 0 <= dst < self.size or dst == rank:
            raise ValueError(f"rank {rank} cannot send to rank {dst} (a world of {self.size})")
        with self.comm_context(), self._cond:
            m = Message("send", rank, t, next(self._seq), src=rank, dst=dst, tag=tag,
                        async_op=async_op)
            m.index = self._sent[(rank, dst, tag)]
            self._sent[(rank, dst, tag)] += 1
            self._log(rank, "send", m)
            self._boxes[(rank, dst, tag)].append(m)
            self._cond.notify_all()
        return m

    def recv(self, src: int, tag: int = 0, out: torch.Tensor | None = None,
             shape: Sequence[int] | None = None, dtype: torch.dtype | None = None,
             posted: bool = False) -> torch.Tensor:
        """The next message from `src` with `tag`, copied into `out` (or a new tensor);
        `posted`: the receive was posted before (post_recv)."""
        self._enter()
        rank = self.rank
        box = self._boxes[(src, rank, tag)]
        with self.comm_context():
            with self._cond:
                self._wait(lambda: bool(box),
                           f"a message from rank {src} (tag {tag}) that was never sent",
                           f"waits in recv for a message from rank {src} (tag {tag}) that "
                           "was never sent", "recv", lambda: [src])
                got = box[0].tensor
                want = tuple(out.shape) if out is not None else shape
                if not self.takes(got, want, out.dtype if out is not None else dtype):
                    self.mismatch(src, tag, want, got)
                box.popleft()
                if not posted:          # a blocking receive meets its message as it takes it
                    self._claimed[(src, rank, tag)] += 1
                    self._cond.notify_all()
                if self.record:
                    self._log(rank, "recv", Message("recv", rank, got, next(self._seq),
                                                    src=src, dst=rank, tag=tag))
            if out is None:
                return got.to(dtype or got.dtype).clone()
            with torch.no_grad():
                out.copy_(got)
            return out

    def takes(self, got: torch.Tensor, shape: Sequence[int] | None,
              dtype: torch.dtype | None) -> bool:
        """Whether a recv of `shape` (None: any) and `dtype` takes message tensor `got`; here
        the shape must be the same, and the values are converted to the receiver's dtype."""
        return shape is None or tuple(shape) == tuple(got.shape)

    def mismatch(self, src: int, tag: int, want: Sequence[int],
                 got: torch.Tensor) -> None:
        """A recv whose buffer's shape `want` is not the shape of the message `got` it would
        take: raised in the receiving rank, and the message stays unreceived."""
        raise ValueError(f"rank {self.rank} expected shape {tuple(want)} from rank {src} "
                         f"(tag {tag}), got {tuple(got.shape)}")

    # --- collectives ---------------------------------------------------------------------------
    def collective(self, op: str, ranks: Sequence[int], t: torch.Tensor | None, payload: Any,
                   combine: Callable[[list[Any]], Sequence[Any]], deliver: Callable[[Any], Any],
                   async_op: bool = False, value: Callable[[], Any] | None = None) -> Work | None:
        """Meet the other ranks of `ranks` at this rank's next collective call: `payload` is what
        this rank contributes, `combine(payloads)` (in group order) what each rank gets back,
        `deliver(mine)` writes it into the caller's tensors as the call returns, async or not
        (the last rank of the group has launched it: gloo and NCCL complete it then);
        `value()`: what the async Work's future and `result()` give (torch's, e.g. [tensor])."""
        self._enter()
        rank = self.rank
        self.allowed(op)
        ranks = list(ranks)
        call = (tuple(ranks), self._calls[(tuple(ranks), rank)])
        self._calls[(tuple(ranks), rank)] += 1
        with self.comm_context(), self._cond:
            m = Message(op, rank, t if self.record else None, next(self._seq),
                        ranks=tuple(ranks), async_op=async_op)
            self._log(rank, "launch" if async_op else op, m)
            slot = self._slots.setdefault(call, {})
            slot[rank] = (op, payload)
            self._cond.notify_all()
            self._wait(lambda: len(slot) == len(ranks),
                       f"the other ranks of {ranks} to call {op} (call {call[1]})",
                       f"waits in {op} for the other ranks of {ranks} to call it",
                       "collective", lambda: [r for r in ranks if r not in slot])
            ops = {r: slot[r][0] for r in ranks}
            if len(set(ops.values())) > 1:
                raise ValueError("ranks called different collectives at the same point: " +
                                 ", ".join(f"rank {r} {o}" for r, o in ops.items()))
            if call not in self._done:
                self._done[call] = combine([slot[r][1] for r in ranks])
            mine = self._done[call][ranks.index(rank)]
            self._taken[call] += 1
            if self._taken[call] == len(ranks):     # the last rank took its result: free them
                del self._slots[call], self._done[call], self._taken[call]

        with self.comm_context(), torch.no_grad():   # every rank launched it: complete
            deliver(mine)
        return Work(self, m, value=value) if async_op else None
