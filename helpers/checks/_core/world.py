"""The harness's world of ranks: the runtime's ThreadWorld (helpers/runtime/thread_world.py, the
one thread world `launch(..., threads=True)` runs on), whose network records every message, so
a check sees what travelled between whom instead of trusting what the answer reports.

    world = World(3, record_ops=True)
    results = world.run(fn, X)            # fn(comm, X) on each rank, comm = world.comm(rank),
                                          # a runtime ThreadComm
    world.messages                        # every send, recv and collective call, in order
    world.traffic(rank=1)                 # what rank 1 sent, as a ByteLog (runtime/traffic.py):
                                          # one Transfer per message or collective call
    World(3, allow={"all_reduce"})        # any other call (send, all_gather ...) fails the
                                          # answer (CheckFailed); barriers and new_group
                                          # are always allowed
                                          # (why={"all_gather": ...}: the lesson it skips)
    world.expect_from_messages(r, t, "its output")   # with record_ops: rank r's tensor(s) t
                                          # must be computed from what rank r received

What the checks' World adds to the ThreadWorld, through its hooks:
- while `run`/`launch` runs, `torch.distributed` is this world too (dist.py): `dist.all_reduce`,
  `dist.reduce_scatter` (list or tensor form), `dist.all_gather`, `isend`/`irecv`,
  `batch_isend_irecv`, groups, async handles, each of which its rank must wait for before it
  returns (waits.py: a rank that ends with an async call never waited for fails), as it must
  call comm.wait() for its comm's sends, whose tensors it may not write until then (inflight.py);
- with `record_ops`, each rank's aten operations are recorded (`world.recorders[rank]`), and
  so is what the network delivered to it (`world.received[rank]`: the storage versions a recv
  or a collective wrote in that rank), so `expect_from_messages` can refuse a result whose
  dataflow never reaches them: traffic of the right sizes and payloads beside a result computed
  from data the rank already had is decoration;
- `allow`: the calls an exercise permits;
- provenance (provenance.py): a rank that touches a tensor another rank made or wrote, or one the
  check handed to another rank, other than through the network, fails the answer: thread ranks
  share one process, so a module global or a closure list could otherwise carry data past the
  comm that a check judges (outside.py: so could one numpy array every rank wraps); and
  rank_numbers.py and rank_arrays.py: a rank that uses or returns Python numbers or numpy
  arrays another rank read out of its tensors (.item(), .tolist(), .numpy(), .shape) fails too,
  in torch, in numpy, math and statistics, and as the shape of a recv.
"""
import contextlib
import os
import sys

import torch

from ...runtime.thread_world import Message, ThreadWorld, Work
from ...runtime.traffic import ByteLog, Transfer, wire_share
from . import addresses
from .carried import ranks_carried
from .dist import not_simulated, torch_distributed
from .dist_bound import bound_routed, unplayed
from .early_threads import world_ranks
from .exits import watch_exits, watched_here
from .inflight import InFlight, posted
from .ledger import ledger, tampered
from .meshes import meshes_played
from .observe import Recorder
from .provenance import Provenance
from .rank_numbers import TagWatch, foreign_in, foreign_message
from .run import CheckFailed, is_reader_code
from .waits import answers_deadlock, never_waited

__all__ = ["World", "Message", "Work"]


_ALWAYS = frozenset({"barrier", "recv", "new_group"})    # allowed whatever the exercise
_OURS = frozenset({__file__, sys.modules[ThreadWorld.__module__].__file__})


def _asked_by_reader():
    """True when the code that asked for a timeline event, past this module and the runtime's
    thread world (ThreadWorld.mark), is the reader's."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename in _OURS:
        frame = frame.f_back
    return frame is not None and is_reader_code(frame.f_code.co_filename)


def scaled_timeout(seconds):
    """`seconds` on an idle machine, scaled by the load per core on a busy one (its ranks then
    wait for a CPU, not for a message), at most 10 times, so a hung answer still ends the check:
    a right answer's rank once waited out 5 s on two cores under a load of 10."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        load = 1.0
    return seconds * min(max(1.0, load), 10.0)


def _no_run():
    """A rank context entered outside a run marks nothing."""


class World(ThreadWorld):
    """`size` thread ranks whose network the check reads (see the module's docstring). `timeout`
    is what a rank waits for a message that never comes on an idle machine (scaled_timeout)."""

    def __init__(self, size, timeout=10.0, record_ops=False, allow=None, why=None):
        super().__init__(size, scaled_timeout(timeout))
        self.record_ops = record_ops
        self.allow = None if allow is None else frozenset(allow) | _ALWAYS
        self.why = dict(why or {})        # op -> the sentence that names the lesson it skips
        self.recorders = [None] * size
        self.received = [set() for _ in range(size)]   # (storage key, version) delivered
        self.exits = [[] for _ in range(size)]   # (op index, ref): values read out of torch
        self.irecvs = [[] for _ in range(size)]  # each rank's irecvs (dist.py), for waits.py
        self.comm_sends = [[] for _ in range(size)]   # (Message, call): on_send, for waits.py
        self.waited_at = [{} for _ in range(size)]    # a comm send -> the op index of its wait
        self.provenance = Provenance(self)
        self.in_flight = InFlight(self._refuse)     # async calls' tensors until waited
        self.network_failure = None     # (rank, error): the first call the network refused
        self._note, self._verify, self._allow = ledger(self)   # the harness's own copy
        self._mark_rank = _no_run           # run_context's while a run goes on (world_ranks)

    def run_context(self):
        stack = contextlib.ExitStack()
        self._mark_rank = stack.enter_context(world_ranks())   # the ranks: the check's own
        stack.enter_context(torch_distributed(self))
        stack.enter_context(bound_routed(self))     # names bound before the check ran
        stack.enter_context(meshes_played(self))    # init_device_mesh (meshes.py)
        stack.enter_context(ranks_carried(self))    # threads a rank starts are that rank's
        stack.enter_context(self.provenance.python_exits())
        stack.enter_context(watch_exits(self._exit, self._entered))
        return stack

    def _exit(self, t, how):
        rank = self.provenance.rank_here()
        rec = self.recorders[rank] if rank is not None else None
        if rank is not None and not self.provenance.exempt():   # an async call's, unwaited?
            self.in_flight.exit(rank, t, how)
        if how in addresses.HOWS:       # provenance.py's: an address holds the values of no step
            return
        if rec is not None and not self.provenance.exempt():
            entry = (len(rec.ops), rec.latest(t))
            self.exits[rank].append(entry)
            self._note("exit", rank, entry)

    def _entered(self, t, how):
        """Memory written from outside torch (`storage._set_from_file`): inflight.py's."""
        rank = self.provenance.rank_here()
        if rank is not None and not self.provenance.exempt():
            self.in_flight.exit(rank, t, how, writes=True)

    def rank_context(self, rank):
        self._mark_rank()
        stack = contextlib.ExitStack()
        stack.enter_context(self.provenance.mode(rank))
        stack.enter_context(watched_here())       # the C base class's exits (exits.py)
        stack.enter_context(TagWatch(rank))
        if self.record_ops:
            self.recorders[rank] = stack.enter_context(Recorder())
            self._note("recorder", rank, self.recorders[rank])
        return stack

    def start(self, body):
        """As ThreadWorld.start; a rank whose result holds numbers that only other ranks read
        out of torch (rank_numbers.py) fails, so does a rank that ended with async work it never
        waited for (waits.py), a deadlock (a CheckFailed: waits.py), and a run whose records
        (messages, timeline, allow-list ...) differ from the harness's own copy (ledger.py)."""
        results, errors, stuck = super().start(body)
        errors = [(r, not_simulated(unplayed(e))) for r, e in errors]   # calls not played
        changed = self._verify()
        if changed:
            return results, [(None, tampered(changed))], stuck
        if not errors and self.network_failure is not None:    # the answer caught it
            errors = [tuple(self.network_failure)]
        errors = [(r, answers_deadlock(e)) for r, e in errors]     # the answer's, always
        if not errors and not stuck:
            for r, result in enumerate(results):
                others = foreign_in(result, r, self.provenance.exited_last)
                if others:
                    errors = [(r, CheckFailed(foreign_message(r, others, "returned")))]
                    break
        if not errors and not stuck:
            errors = never_waited(self)
        return results, errors, stuck

    def recv(self, src, tag=0, out=None, shape=None, dtype=None, posted=False):
        """As ThreadWorld.recv; a shape made of another rank's numbers (a count it read out and
        left in a shared object) fails: how much arrives is something the comm tells. A recv
        names the shape and dtype it takes (`mismatch`): what a message's shape or dtype could
        tell, beside the bytes the traffic counts, is nothing the receiver did not know."""
        rank = self.rank
        if rank is not None and shape is not None:
            others = foreign_in(list(shape), rank, {})
            if others:
                raise CheckFailed(foreign_message(rank, others, "sized a recv with"))
        want = (tuple(out.shape), out.dtype) if out is not None else (shape, dtype)
        if rank is not None and None in want:
            self._refuse(rank, f"rank {rank} received from rank {src} without naming the shape "
                         "and dtype it expects: a recv takes a buffer (or a shape and a dtype)")
        with self._delivering(self.provenance.rank_here()), self._refusing(rank, "recv"):
            return super().recv(src, tag, out=out, shape=shape, dtype=dtype, posted=posted)

    def takes(self, got, shape, dtype):
        return super().takes(got, shape, dtype) and got.dtype == dtype

    def mismatch(self, src, tag, want, got):
        """A recv of another shape (or dtype) than the message's fails the answer, even if it
        catches the error; the words name only the receiver's own buffer."""
        self._refuse(self.rank, f"rank {self.rank} received from rank {src} (tag {tag}) into "
                     f"a buffer of shape {tuple(want)}, which is not the shape and dtype of the "
                     "tensor sent: a recv takes exactly what its sender sends")

    def on_enter(self):
        """After the network refused a call the answer has failed: every later comm call fails
        at once (an answer that catches the refusal and goes on does not wait out timeouts)."""
        if self.network_failure is not None:
            raise CheckFailed(str(self.network_failure[1]))

    def _refuse(self, rank, words):
        error = CheckFailed(words)
        with self.locked():
            if self.network_failure is None:
                self.network_failure = (rank, error)
                self._note("failure", rank, self.network_failure)
        self.fail(rank, error)         # the ranks waiting on this call stop now
        raise error

    @contextlib.contextmanager
    def _refusing(self, rank, op):
        """Any error out of the network's work in a rank fails the answer (recorded: caught,
        it still fails), raised as a CheckFailed whose words hold nothing another rank sent
        (torch's and the runtime's errors name the other ranks' shapes, ops and sizes)."""
        failed = None
        try:
            yield
        except CheckFailed:
            raise
        except TimeoutError as e:
            with self.locked():
                if self.network_failure is None:
                    self.network_failure = (rank, e)
                    self._note("failure", rank, self.network_failure)
            raise
        except Exception:   # replaced by words of this rank's own call
            failed = True
        if failed:       # raised outside the handler: no __context__ to read the original from
            self._refuse(rank, f"rank {rank}'s {op} did not match the other ranks' calls: "
                         "every rank of a collective calls the same one at the same point, "
                         "with a tensor of the same shape and dtype (a recv: the sender's)")

    def collective(self, op, ranks, t, payload, combine, deliver, async_op=False, value=None):
        """As ThreadWorld.collective; what `deliver` writes in this rank is kept as received.
        Every rank hands a tensor of one shape and dtype (an all-to-all's pieces may differ),
        and an error in the meeting or the delivery fails the answer (`_refusing`)."""
        rank = self.provenance.rank_here()

        def delivered(mine):
            with self._delivering(rank), self._refusing(rank, op):
                deliver(mine)

        def same(payloads):
            kinds = {(tuple(p.shape), p.dtype) for p in payloads if isinstance(p, torch.Tensor)}
            if op != "all_to_all" and len(kinds) > 1:
                raise ValueError("the ranks' tensors differ")
            return combine(payloads)
        with self._refusing(rank, op):
            return super().collective(op, ranks, t, payload, same, delivered, async_op, value)

    @contextlib.contextmanager
    def _delivering(self, rank):
        """Keep, as `received[rank]`, the storage versions the operations run inside wrote
        (and as arrived for provenance: arrived.py, bytes the rank may reinterpret)."""
        rec = self.recorders[rank] if rank is not None else None
        start = len(rec.ops) if rec is not None else 0
        try:
            with self.provenance.arrived.delivering():
                yield
        finally:
            if rec is not None:
                got = {(r.key, r.version) for op in rec.ops[start:] for r in op.writes + op.outputs}
                self.received[rank].update(got)
                self._note("received", rank, got)

    def uses_received(self, rank, tensors):
        """True when what the network delivered to `rank` flowed into `tensors` (a tensor or a
        list of them; record_ops=True): through aten operations, or out of torch and back (the
        rank read values that depend on what it received out of torch, `.tolist()`, `.item()`,
        `.numpy()`, and afterwards made a tensor of `tensors`' dataflow from Python or numpy
        data, or ran an operation of it with a Python float: no Recorder follows values outside
        torch)."""
        if not self.record_ops:
            raise RuntimeError("uses_received needs World(..., record_ops=True)")
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
        rec, received = self.recorders[rank], self.received[rank]
        if not tensors or rec is None:
            return False
        seen = rec.flowed([rec.latest(t) for t in tensors])
        if seen & received:
            return True
        outs = self.exits[rank] + [(op.index, (r.key, r.version))     # `.item()`, float(t)
                                   for op in rec.named("_local_scalar_dense") for r in op.reads]
        first = min((i for i, ref in outs if rec.flowed([ref]) & received), default=None)
        if first is None:
            return False
        return any(rec.from_python.get(key, -1) >= first for key, _ in seen) or any(
            rec.producer.get(ref, -1) >= first and rec.ops[rec.producer[ref]].scalar
            for ref in seen)      # a Python float operand, after: `g *= max_norm / norm`

    def held_from_messages(self, rank, sends=True):
        """The most bytes `rank` held at once of what it received and what it made from that
        (record_ops=True; `Recorder.live_peak`): every storage whose dataflow reaches a received
        one, through any operation (`kv * 1.0`, `-kv`, `kv.double()` are the data still), and
        values of those read out of torch (`.tolist()`, `.item()`), held from there to the end
        since nothing follows them in Python; with `sends`, what its comm sent (`k * 1.0` too)
        held until the wait that finishes the send (`sent_until`)."""
        rec = self.recorders[rank]
        keys, refs = rec.reached_by(self.received[rank])
        size = {}
        for op in rec.ops:
            for r in op.reads + op.writes + op.outputs:
                size[r.key] = max(size.get(r.key, 0), r.nbytes)
        outs = self.exits[rank] + [(op.index, (r.key, r.version))
                                   for op in rec.named("_local_scalar_dense") for r in op.reads]
        kept = [(i, size.get(ref[0], 0)) for i, ref in outs if ref in refs]
        return rec.live_peak(keys, kept, until=self.sent_until(rank) if sends else None)

    def expect_from_messages(self, rank, tensors, what, world=None):
        """Fail unless rank `rank`'s `tensors` (`what`, in the reader's words) are computed from
        what it received: the exercise moves data between ranks so that the result is made of
        it, and a result the messages never reach makes them decoration."""
        if not self.uses_received(rank, tensors):
            on = f"on {world} ranks " if world else ""
            raise CheckFailed(
                f"{on}rank {rank}'s {what} does not depend on what it received: its messages "
                "are decoration. Compute the result from the data that arrives (the recv "
                "buffers, the collective's output), not from data the rank already had or "
                "got some other way")

    def transfer(self, m: Message) -> Transfer:
        """Message `m` (a send or a collective call) as the traffic log's Transfer: its payload,
        its wire bytes (a send's payload, a collective's wire_share over its group; an
        all-to-all's as if its splits were equal), its peer or its group, its element size."""
        itemsize = m.tensor.element_size() if m.tensor is not None else 1
        if not m.collective:
            return Transfer(m.op, m.rank, m.dst, m.nbytes, m.nbytes, None, itemsize)
        wire = wire_share(m.op, m.nbytes, len(m.ranks or ()))
        return Transfer(m.op, m.rank, None, m.nbytes, wire, m.ranks, itemsize)

    def traffic(self, rank: int | None = None, messages: list[Message] | None = None
                ) -> ByteLog:
        """What the network carried, read the one way (ByteLog): one Transfer per send and
        collective call of rank `rank` (all ranks: None), or of `messages` (a check's own
        selection, e.g. forward only); receives have none, their sender's send counts.
        Checks bound totals, not one message alone, since many small messages carry what one
        large one would."""
        messages = self.sent(rank=rank) if messages is None else messages
        return ByteLog(self.transfer(m) for m in messages if m.op != "recv")

    def comm_context(self):
        return self.provenance.network()

    def landed_context(self, message):
        return self.in_flight.landed(message)

    def on_send(self, rank, m, t, call):
        """A comm's send: owed a wait before the rank returns (waits.py), its tensor in flight
        until then (inflight.py)."""
        self.comm_sends[rank].append((m, call))
        posted(self.in_flight, rank, m, t, call)

    def on_message(self, rank, kind, m):
        """Each recorded message (under the lock): the ledger keeps its own copy."""
        self._note("message", rank, (kind, m))

    def event(self, rank, kind, detail=None):
        """As ThreadWorld.event; the ledger keeps its own copy. A mark is the check's observation
        (a stage call, "backward returned"): one the reader's code asked for would be forged."""
        if kind == "mark" and _asked_by_reader():
            raise CheckFailed(f"rank {self.rank} marked the check's timeline ({detail!r}) "
                              "itself: the check records what the answer does, the answer "
                              "does not report it")
        with self.locked():
            seq = super().event(rank, kind, detail)
            self._note("event", rank, (seq, kind, detail))
            if kind == "wait" and isinstance(detail, Message) and self.recorders[rank]:
                self.waited_at[rank][detail] = len(self.recorders[rank].ops) - 1
            return seq

    def sent_until(self, rank):
        """{storage key: op index} of each tensor `rank`'s comm sent: held until the wait that
        finishes the send (as a DistComm's isend holds it; to the end if none came)."""
        out, last = {}, len(self.recorders[rank].ops)
        for m, _ in self.comm_sends[rank]:
            out[m.key] = max(out.get(m.key, 0), self.waited_at[rank].get(m, last))
        return out

    def allowed(self, op):
        """Refuse, in the calling rank, a call the exercise does not allow: a substitute for the
        collective it is about (an all_gather beside a decoy all_reduce) moves the data the
        exercise asks for in another way. Caught, it still fails the answer."""
        allow = self._allow()      # the harness's copy: the attribute is only for reading
        if allow is not None and op not in allow:
            why = f" ({self.why[op]})" if op in self.why else ""
            self._refuse(self.rank, f"rank {self.rank} called {op}: this exercise allows only "
                         f"{', '.join(sorted(allow - _ALWAYS))} to move "
                         f"data between the ranks{why}")
