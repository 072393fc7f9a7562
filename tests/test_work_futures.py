"""The thread world's async Work (helpers/runtime/work.py): complete once every rank launched
it, as on gloo; its future and `result()` give what torch's gloo gives (`[tensor]` for an
all-reduce), and the rank's wait is recorded where it first observes completion (wait, value,
result, is_completed or done returning True, wait_all, a chained future), not when the future
is made or a then() callback runs: check_overlap_hooks reads that record."""
import launch_targets as lt
import torch

import helpers
from helpers.checks._core.world import World
from helpers.runtime.comm import wire


def _async_sum(w, t):
    """An async all-reduce (sum) of `t` on `w`'s calling rank: its Work and its Message."""
    work = w.collective("all_reduce", range(w.size), t, wire(t),
                        lambda ps: [torch.stack(ps).sum(0)] * len(ps),
                        lambda total: t.copy_(total), True, value=lambda: [t])
    return work, w.sent("all_reduce", rank=w.rank)[-1]


def _waits_where_the_rank_waits(comm, w):
    t = torch.full((3,), float(comm.rank + 1))
    work, m = _async_sum(w, t)
    fut = work.get_future()
    seen = dict(waited_at_get_future=m.waited, delivered=t.tolist())
    chained = fut.then(lambda f: f.value()[0] * 2)
    seen["waited_after_then"] = m.waited
    torch.futures.wait_all([chained])
    seen.update(waited=m.waited, chained=chained.value().tolist(), done=fut.done())
    seen["value_is_t"] = torch.futures.Future.value(fut)[0] is t
    t2 = torch.ones(2)
    work2, m2 = _async_sum(w, t2)
    work2.get_future()
    work2.wait()                       # Work.wait() after get_future(): the wait is recorded
    seen["waited_by_work_wait"] = m2.waited is not None
    seen["observed"] = {how: _observed(w, how) for how in _OBSERVE}
    return seen


_OBSERVE = dict(is_completed=lambda work: work.is_completed(),
                done=lambda work: work.get_future().done(),
                chained_done=lambda work: work.get_future().then(lambda f: 1).done(),
                result=lambda work: work.result()[0].tolist())


def _observed(w, how):
    """(what `how` returned, whether the wait was recorded before it, after it): a fresh async
    all-reduce, complete at once (every rank launched it), observed only by `how`."""
    t = torch.ones(2)
    work, m = _async_sum(w, t)
    before = m.waited
    got = _OBSERVE[how](work)
    return got, before is None, m.waited is not None


def test_the_future_completes_with_the_result_and_the_wait_is_where_the_rank_waits():
    """On the grader's World, which also records a wait through torch.futures.wait_all (its C
    `_collect_all` replaced while the World runs)."""
    collect_all = torch._C._collect_all
    w = World(2)
    for seen in w.run(lambda comm: _waits_where_the_rank_waits(comm, w)):
        assert seen["done"] and seen["value_is_t"], "the future is not torch's [tensor]"
        assert seen["delivered"] == [3.0] * 3, "get_future() did not deliver the sum"
        assert seen["waited_at_get_future"] is None, "get_future() recorded a wait"
        assert seen["waited_after_then"] is None, "a then() callback was recorded as a wait"
        assert seen["waited"] is not None, (
            "wait_all over a chained future did not record the wait where the rank waited")
        assert seen["chained"] == [6.0] * 3
        assert seen["waited_by_work_wait"]
        assert seen["observed"] == dict(is_completed=(True, True, True), done=(True, True, True),
                                        chained_done=(True, True, True),
                                        result=([2.0, 2.0], True, True)), (
            "completion seen through is_completed(), done() or result() was not recorded as "
            f"the rank's wait: {seen['observed']}")
    assert torch._C._collect_all is collect_all, "torch._C._collect_all was not put back"


def test_the_futures_resolve_as_on_gloo_in_a_two_process_launch():
    gloo = helpers.launch(lt.future_values, 2, quiet=True, timeout=120)
    w = World(2)
    threads = w.run(lambda comm: lt.future_values(comm.rank, 2, {}))
    assert threads == gloo
    assert gloo[0]["all_reduce"] == [("t", (4,), 12.0)]      # torch's [tensor], the sum
