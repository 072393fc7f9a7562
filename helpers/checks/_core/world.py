"""The harness's own world of ranks: threads of this process joined by a network that records
every message, so a check sees what travelled between whom instead of trusting what the answer
reports about itself.

    world = World(3, record_ops=True)
    results = world.run(fn, X)            # fn(comm, X) on each rank, comm = world.comm(rank)
    results = world.launch(fn, cfg)       # fn(rank, world_size, cfg), cfg["comm"]: the
                                          # launcher's threads mode (helpers.launch(..., threads))
    world.messages                        # every send, recv and collective call, in order
    World(3, allow={"all_reduce"})        # any other call (send, all_gather ...) fails the
                                          # answer (CheckFailed); barriers are always allowed

While `run`/`launch` runs, `torch.distributed` is this world too (dist.py): `dist.all_reduce`,
`dist.reduce_scatter` (list or tensor form), `dist.all_gather`, `isend`/`irecv`, groups, async
handles. Collectives meet like real ones (every rank of the group, in the same order) and an
async one delivers its result when `wait()` is called, so an answer that never waits sees its
old values. Each Message records op, caller, source and destination, the storage and shape of
the tensor handed over, bytes, when it was launched and when (if ever) it was waited for.
With `record_ops`, each rank's aten operations are recorded too (`world.recorders[rank]`).
"""
import collections
import contextlib
import itertools
import threading

import torch

from .observe import Recorder, storage_key
from .run import CheckFailed

__all__ = ["World", "Message", "RankComm", "RankFailed"]


class RankFailed(RuntimeError):
    """A rank could not go on (it waited past the timeout, or another rank failed)."""


class _Aborted(BaseException):
    """Another rank failed first: this one stops quietly."""


class Message:
    """One send, receive or collective call, as the network saw it."""

    __slots__ = ("op", "rank", "src", "dst", "ranks", "tag", "key", "shape", "dtype", "nbytes",
                 "seq", "async_op", "waited", "tensor")

    def __init__(self, op, rank, t, seq, src=None, dst=None, ranks=None, tag=0, async_op=False):
        self.op, self.rank, self.src, self.dst = op, rank, src, dst
        self.ranks, self.tag = ranks, tag
        self.key = storage_key(t) if t is not None else None
        self.shape = tuple(t.shape) if t is not None else ()
        self.dtype = t.dtype if t is not None else None
        self.nbytes = t.numel() * t.element_size() if t is not None else 0
        self.seq, self.async_op, self.waited = seq, async_op, None
        self.tensor = t.detach().clone() if t is not None else None     # what was handed over

    @property
    def collective(self):
        return self.op not in ("send", "recv")

    def __repr__(self):
        peer = f" {self.src}->{self.dst}" if not self.collective else f" by rank {self.rank}"
        return f"{self.op}{peer} {list(self.shape)} ({self.nbytes} B) #{self.seq}"


class Work:
    """What an async call returns: `wait()` delivers the result (once) and is recorded."""

    def __init__(self, world, message, deliver):
        self.world, self.message, self._deliver = world, message, deliver

    def wait(self, timeout=None):
        if self._deliver is not None:
            deliver, self._deliver = self._deliver, None
            deliver()
            self.message.waited = self.world.event(self.message.rank, "wait", self.message)
        return True

    def is_completed(self):
        return self._deliver is None

    def get_future(self):
        fut = torch.futures.Future()
        self.wait()
        fut.set_result(None)
        return fut


class World:
    """`size` ranks as threads (see the module's docstring)."""

    def __init__(self, size, timeout=10.0, record_ops=False, allow=None):
        if size < 1:
            raise ValueError(f"a world needs at least one rank, got {size}")
        self.size, self.timeout, self.record_ops = size, timeout, record_ops
        self.allow = None if allow is None else frozenset(allow) | {"barrier", "recv"}
        self.messages, self.timeline = [], [[] for _ in range(size)]
        self.recorders = [None] * size
        self._seq = itertools.count()
        self._cond = threading.Condition(threading.RLock())
        self._local = threading.local()
        self._boxes = collections.defaultdict(collections.deque)
        self._slots, self._done = {}, {}
        self._calls = collections.Counter()
        self._failed = None

    # --- who is calling ------------------------------------------------------------------------
    @property
    def rank(self):
        """The rank of the calling thread (None outside the world's threads)."""
        return getattr(self._local, "rank", None)

    def comm(self, rank):
        return RankComm(self, rank)

    def event(self, rank, kind, detail=None):
        """Append to `rank`'s timeline; returns the event's global sequence number."""
        with self._cond:
            seq = next(self._seq)
            self.timeline[rank].append((seq, kind, detail))
            return seq

    def mark(self, label):
        """A check's own marker in the calling rank's timeline ("backward done")."""
        return self.event(self.rank, "mark", label)

    def sent(self, op=None, rank=None):
        """The messages (of kind `op`, by `rank`) in the order they happened."""
        return [m for m in self.messages if (op is None or m.op == op)
                and (rank is None or m.rank == rank)]

    # --- running ranks -------------------------------------------------------------------------
    def run(self, fn, *args):
        """fn(comm, *args) on every rank; their results in rank order."""
        return self._start(lambda r: fn(self.comm(r), *args))

    def launch(self, fn, cfg=None):
        """fn(rank, size, cfg) on every rank, as helpers.launch(..., threads=True) calls it."""
        def one(r):
            return fn(r, self.size, dict(cfg or {}, comm=self.comm(r), rank=r,
                                         device=torch.device("cpu")))
        return self._start(one)

    def _start(self, body):
        from .dist import torch_distributed
        results, errors = [None] * self.size, [None] * self.size

        def target(r):
            self._local.rank = r
            try:
                with contextlib.ExitStack() as stack:
                    if self.record_ops:
                        self.recorders[r] = stack.enter_context(Recorder())
                    results[r] = body(r)
            except _Aborted:
                pass
            except BaseException as e:   # noqa: BLE001 - handed to the caller
                errors[r] = e
                self._fail(r, e)

        with torch_distributed(self):
            threads = [threading.Thread(target=target, args=(r,), daemon=True,
                                        name=f"rank {r}") for r in range(self.size)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(self.timeout * 3 + 5)
        stuck = [r for r, t in enumerate(threads) if t.is_alive()]
        firsts = [e for e in errors if e is not None and not isinstance(e, RankFailed)]
        firsts += [e for e in errors if isinstance(e, RankFailed)]
        if firsts:
            raise firsts[0]
        if stuck:
            raise RankFailed(f"rank {stuck[0]} did not finish within {self.timeout * 3 + 5:.0f} s "
                             "(an endless loop, or a wait for a message nobody sends)")
        return results

    def _fail(self, rank, error):
        with self._cond:
            if self._failed is None:
                self._failed = (rank, error)
            self._cond.notify_all()

    def _wait(self, ready, what):
        """Block until ready() (under the lock), another rank failed, or the timeout."""
        rank = self.rank
        if not self._cond.wait_for(lambda: ready() or self._failed is not None, self.timeout):
            raise RankFailed(f"rank {rank} waited {self.timeout:g} s for {what}")
        if not ready():
            raise _Aborted()

    def _allowed(self, op):
        """Refuse, in the calling rank, a call the exercise does not allow: a substitute for the
        collective it is about (an all_gather beside a decoy all_reduce) moves the data the
        exercise asks for in another way."""
        if self.allow is not None and op not in self.allow:
            raise CheckFailed(f"rank {self.rank} called {op}: this exercise allows only "
                              f"{', '.join(sorted(self.allow - {'barrier', 'recv'}))} to move "
                              "data between the ranks")

    # --- point to point ------------------------------------------------------------------------
    def send(self, t, dst, tag=0, async_op=False):
        rank = self.rank
        self._allowed("send")
        if not 0 <= dst < self.size or dst == rank:
            raise ValueError(f"rank {rank} cannot send to rank {dst} (a world of {self.size})")
        with self._cond:
            m = Message("send", rank, t, next(self._seq), src=rank, dst=dst, tag=tag,
                        async_op=async_op)
            self.messages.append(m)
            self.timeline[rank].append((m.seq, "send", m))
            self._boxes[(rank, dst, tag)].append(m)
            self._cond.notify_all()
        return m

    def recv(self, src, tag=0, out=None, shape=None, dtype=None):
        """The next message from `src` with `tag`, copied into `out` (or a new tensor)."""
        rank = self.rank
        box = self._boxes[(src, rank, tag)]
        with self._cond:
            self._wait(lambda: bool(box), f"a message from rank {src} (tag {tag})")
            sent = box.popleft()
            got = sent.tensor
            want = tuple(out.shape) if out is not None else shape
            if want is not None and tuple(want) != tuple(got.shape):
                raise ValueError(f"rank {rank} expected shape {tuple(want)} from rank {src}, "
                                 f"got {tuple(got.shape)}")
            m = Message("recv", rank, got, next(self._seq), src=src, dst=rank, tag=tag)
            self.messages.append(m)
            self.timeline[rank].append((m.seq, "recv", m))
        if out is None:
            return got.to(dtype or got.dtype).clone()
        with torch.no_grad():
            out.copy_(got)
        return out

    # --- collectives ---------------------------------------------------------------------------
    def collective(self, op, ranks, t, payload, combine, deliver, async_op=False):
        """Meet the other ranks of `ranks` at this rank's next collective call: `payload` is what
        this rank contributes, `combine(payloads)` (in group order) what each rank gets back,
        `deliver(mine)` writes it into the caller's tensors (at wait() when async)."""
        rank = self.rank
        self._allowed(op)
        call = (tuple(ranks), self._calls[(tuple(ranks), rank)])
        self._calls[(tuple(ranks), rank)] += 1
        with self._cond:
            m = Message(op, rank, t, next(self._seq), ranks=tuple(ranks), async_op=async_op)
            self.messages.append(m)
            self.timeline[rank].append((m.seq, "launch" if async_op else op, m))
            slot = self._slots.setdefault(call, {})
            slot[rank] = (op, payload)
            self._cond.notify_all()
            self._wait(lambda: len(slot) == len(ranks),
                       f"the other ranks of {list(ranks)} to call {op} (call {call[1]})")
            ops = {r: slot[r][0] for r in ranks}
            if len(set(ops.values())) > 1:
                raise ValueError("ranks called different collectives at the same point: " +
                                 ", ".join(f"rank {r} {o}" for r, o in ops.items()))
            if call not in self._done:
                self._done[call] = combine([slot[r][1] for r in ranks])
            mine = self._done[call][ranks.index(rank)]

        def finish():
            with torch.no_grad():
                deliver(mine)
        if async_op:
            return Work(self, m, finish)
        finish()
        return None


class RankComm:
    """One rank's view of a World, with the calls of helpers' DistComm and ThreadComm:
    send(t, dst, tag), recv(src, shape, tag, dtype), all_reduce(t), wait()."""

    def __init__(self, world, rank):
        self.w, self.rank, self.world = world, rank, world.size
        self.device = torch.device("cpu")

    def send(self, t, dst, tag=0):
        self.w.send(t, dst, tag)

    def recv(self, src, shape, tag=0, dtype=torch.float32):
        return self.w.recv(src, tag, shape=tuple(shape), dtype=dtype)

    def all_reduce(self, t):
        from .dist import all_reduce
        all_reduce(t)
        return t

    def wait(self):
        pass

    @property
    def log(self):
        """(op, peer, bytes) of what this rank sent, as DistComm counts it."""
        return [(m.op, m.dst, m.nbytes) for m in self.w.messages
                if m.rank == self.rank and m.op != "recv"]

    def bytes_sent(self, op=None):
        return sum(b for o, _, b in self.log if op is None or o == op)

    def calls(self, op):
        return sum(1 for o, _, _ in self.log if o == op)
