"""The runtime's ThreadWorld frees what a collective carried once every rank of its group took
its result (a long threads-mode run holds no payload of earlier calls), and gives a run one
deadline, after which its stuck ranks stop at their next comm call."""
import gc
import threading
import time
import types

import pytest
import torch

import helpers
from helpers.runtime.errors import LaunchTimeout
from helpers.runtime.thread_world import ThreadWorld

_MB = 2 ** 18              # float32 elements in 1 MB


def _held_bytes(world):
    """Bytes of the tensors the world reaches (its dicts, lists and objects, not modules)."""
    seen, todo, total = set(), [world], 0
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            total += o.numel() * o.element_size()
        else:
            todo.extend(gc.get_referents(o))
    return total


def test_a_world_without_ranks_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="at least one rank, got 0: pass size >= 1"):
        ThreadWorld(0)


def test_collectives_leave_no_payload_behind():
    w = ThreadWorld(2, timeout=10.0, record=False)
    held = []

    def fn(comm):
        t = torch.ones(_MB)
        for _ in range(100):
            comm.all_reduce(t)
            held.append(len(w._slots) + len(w._done))
        return t[0].item()

    assert w.run(fn) == [2.0 ** 100] * 2
    assert not w._slots and not w._done and not w._taken
    assert max(held) <= 4                     # one call in flight per rank, at most
    assert _held_bytes(w) < _MB               # neither the ranks' copies nor the results remain


def test_a_recording_world_frees_the_slots_too():
    w = ThreadWorld(3, timeout=10.0)
    w.run(lambda comm: [comm.all_gather(torch.ones(4)) for _ in range(5)])
    assert not w._slots and not w._done and len(w.sent("all_gather")) == 15


def test_the_deadline_is_one_for_the_run_not_one_per_rank():
    stop = threading.Event()
    w = ThreadWorld(3, timeout=0.1, deadline=1.0)
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout, match="ranks 0, 1 and 2 still running after 1 s"):
        w.run(lambda comm: stop.wait(20))
    took = time.monotonic() - t0
    stop.set()
    assert took < 2.0, f"three stuck ranks held the run {took:.1f} s past a 1 s deadline"


def test_the_default_deadline_grows_with_the_ranks_that_share_the_interpreter():
    """One deadline for the run, by default three timeouts and 5 s per rank: thread ranks
    share one interpreter, so a run of more ranks takes longer."""
    assert ThreadWorld(1, timeout=1.0).deadline == 8.0
    assert ThreadWorld(3, timeout=1.0).deadline == 24.0


def test_stuck_ranks_stop_at_the_deadline_blocked_or_at_their_next_comm_call():
    go, left, after = threading.Event(), [threading.Event() for _ in range(3)], []

    def fn(comm):
        try:
            if comm.rank == 0:
                go.wait(20)                       # computing past the deadline
                comm.send(torch.ones(1), 1)
            elif comm.rank == 1:
                comm.recv(2, (1,))                # blocked, waiting for a message never sent
            else:
                comm.all_reduce(torch.ones(1))    # blocked in a collective the others miss
            after.append(comm.rank)
        finally:
            left[comm.rank].set()

    w = ThreadWorld(3, timeout=30.0, deadline=0.5)
    with pytest.raises(LaunchTimeout, match="each stops at its next comm call"):
        w.run(fn)
    assert left[1].wait(5) and left[2].wait(5), "a rank blocked in the comm did not wake"
    go.set()
    assert left[0].wait(5) and after == [], f"ranks {after} went on past the comm call"


def test_launch_on_threads_gives_the_same_one_deadline():
    stop = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout, match="next comm call"):
        helpers.launch(_spin, 3, dict(stop=stop), timeout=1.0, threads=True)
    stop.set()
    assert time.monotonic() - t0 < 2.0


def _spin(rank, world, cfg):
    cfg["stop"].wait(20)


# ---- the subclass contract: the hooks the grader's World (helpers/checks) builds on ------------
HOOKS = ("run_context", "rank_context", "comm_context", "on_enter", "allowed", "takes",
         "mismatch", "on_message", "on_send", "locked", "fail")


class _Hooked(ThreadWorld):
    """A ThreadWorld whose every declared hook notes that it was called."""

    def __init__(self, size, **kw):
        super().__init__(size, **kw)
        self.calls = []

    def _note(self, *what):
        with self.locked():
            self.calls.append(what)

    def run_context(self):
        self._note("run")
        return super().run_context()

    def rank_context(self, rank):
        self._note("rank", rank)
        return super().rank_context(rank)

    def comm_context(self):
        self._note("comm", self.rank)
        return super().comm_context()

    def on_enter(self):
        self._note("enter", self.rank)

    def allowed(self, op):
        self._note("allowed", self.rank, op)

    def takes(self, got, shape, dtype):
        self._note("takes", self.rank)
        return super().takes(got, shape, dtype)

    def mismatch(self, src, tag, want, got):
        self._note("mismatch", self.rank)
        super().mismatch(src, tag, want, got)

    def on_message(self, rank, kind, m):
        self._note("message", rank, kind, m.op)

    def on_send(self, rank, m, t, call):
        self._note("posted", rank, m.op, m.waited is None, tuple(t.tolist()), call)


def _send_recv_all_reduce(comm):
    if comm.rank == 0:
        comm.send(torch.ones(2), 1)
    else:
        comm.recv(0, (2,))
    comm.all_reduce(torch.ones(1))


def test_the_declared_hooks_are_named_in_the_docstring():
    for name in HOOKS:
        assert callable(getattr(ThreadWorld, name)), name
        assert f"`{name}(" in ThreadWorld.__doc__, f"{name} is not listed as a hook"


def test_a_subclass_is_called_through_every_hook():
    w = _Hooked(2)
    w.run(_send_recv_all_reduce)
    calls = set(w.calls)
    assert ("run",) in calls and {("rank", 0), ("rank", 1)} <= calls
    assert {("enter", 0), ("enter", 1), ("comm", 0), ("comm", 1)} <= calls
    assert {("allowed", 0, "send"), ("allowed", 0, "all_reduce"),
            ("allowed", 1, "all_reduce"), ("takes", 1)} <= calls
    messages = sorted(c[1:] for c in w.calls if c[0] == "message")
    assert messages == [(0, "all_reduce", "all_reduce"), (0, "send", "send"),
                        (1, "all_reduce", "all_reduce"), (1, "recv", "recv")]
    assert sum(c[0] == "enter" for c in w.calls) == 4      # once per comm call
    assert [c for c in w.calls if c[0] == "posted"] == [("posted", 0, "send", True, (1.0, 1.0),
                                                          "send")]

    w = _Hooked(2)
    with pytest.raises(ValueError, match="expected shape"):
        w.run(lambda comm: comm.send(torch.ones(2), 1) if comm.rank == 0
              else comm.recv(0, (3,)))
    assert ("mismatch", 1) in w.calls


def test_on_enter_refuses_a_call_by_raising():
    class Refusing(ThreadWorld):
        def on_enter(self):
            raise RuntimeError(f"rank {self.rank} may not call the comm")

    with pytest.raises(RuntimeError, match="may not call the comm"):
        Refusing(2).run(lambda comm: comm.all_reduce(torch.ones(1)))


def test_fail_wakes_the_ranks_waiting_and_locked_is_the_networks_lock():
    w = ThreadWorld(2, timeout=30.0)

    def fn(comm):
        if comm.rank == 0:
            time.sleep(0.2)
            w.fail(0, RuntimeError("rank 0 gave up"))      # rank 1 waits for a send never made
            return "failed"
        return comm.recv(0, (1,))

    t0 = time.monotonic()
    results, errors, stuck = w.start(lambda r: fn(w.comm(r)))
    assert results == ["failed", None] and not errors and not stuck   # rank 1 stopped quietly
    assert time.monotonic() - t0 < 5.0, "fail() did not wake the rank waiting"

    w, out = ThreadWorld(2), []
    with w.locked(), w.locked():                            # re-entrant
        runner = threading.Thread(target=lambda: out.append(w.run(_send_recv_all_reduce)))
        runner.start()
        time.sleep(0.3)
        assert w.messages == [], "a rank recorded a message while the lock was held"
    runner.join(20)
    assert out and len(w.messages) == 4


def _waits_seen(comm):
    """Rank 0 sends, then posts an isendrecv, a sendrecv; which sends' waits each wait records."""
    if comm.rank == 1:
        for _ in range(3):
            comm.recv(0, (2,))
        return None
    seen = []
    comm.send(torch.ones(2), 1)
    hop = comm.isendrecv([(torch.ones(2), 1, 0)], [])
    comm.sendrecv((torch.ones(2), 1))
    seen.append("posted")
    comm.wait()                 # the send's and the sendrecv's, not the isendrecv's
    seen.append("comm.wait()")
    hop.wait()
    seen.append("hop.wait()")
    return seen


def test_a_comm_send_is_outstanding_until_its_wait_and_recorded_there():
    """comm.wait() records the waits of comm.send's and sendrecv's sends, the Exchange's wait()
    those of isendrecv's (as DistComm's waits finish them), each once, in the rank's timeline."""
    w = ThreadWorld(2)
    assert w.run(_waits_seen)[0] == ["posted", "comm.wait()", "hop.wait()"]
    sends = w.sent("send", rank=0)
    kinds = [k for _, k, _ in w.timeline[0]]
    assert kinds == ["send", "send", "send", "wait", "wait", "wait"]
    waits = [d for _, k, d in w.timeline[0] if k == "wait"]
    assert waits == [sends[0], sends[2], sends[1]]
    assert [m.waited for m in sends] == [w.timeline[0][i][0] for i in (3, 5, 4)]


def test_a_subgroup_comm_meets_only_its_ranks_and_numbers_its_peers_within_the_group():
    """ThreadComm.subgroup(ranks), as DistComm(dist.new_group(ranks)): the columns of a 2 x 2
    mesh all-reduce apart, and a send to group rank 1 reaches the column's second rank."""
    w = ThreadWorld(4, timeout=30)

    def column(comm):
        col = comm.subgroup([comm.rank % 2, comm.rank % 2 + 2])
        t = torch.tensor([float(comm.rank)])
        col.all_reduce(t)
        if col.rank == 0:
            col.send(torch.tensor([10.0 * comm.rank]), 1)
            col.wait()
            return col.rank, col.world, t.item(), None
        return col.rank, col.world, t.item(), col.recv(0, (1,)).item()
    assert w.run(column) == [(0, 2, 2.0, None), (0, 2, 4.0, None),
                             (1, 2, 2.0, 0.0), (1, 2, 4.0, 10.0)]
    assert [m.ranks for m in w.sent("all_reduce")] and all(
        m.ranks in ((0, 2), (1, 3)) for m in w.sent("all_reduce"))
    assert sorted((m.src, m.dst) for m in w.sent("send")) == [(0, 2), (1, 3)]
