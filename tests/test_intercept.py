"""runtime.intercept.intercept, the one rebinding of torch.distributed's functions: on_call runs
before each call and its callback after it, with the result; nested blocks both see each call
and each puts back what it found; leaving on an exception restores; a thread rank is refused.
torch.distributed.is_initialized stands in for a collective (it needs no process group)."""
import pytest
import torch.distributed as dist

from helpers.runtime.intercept import in_rank_thread, intercept
from helpers.runtime.thread_world import ThreadWorld


def _log(seen, tag):
    """An on_call that notes (tag, "before", name, args) and then (tag, "after", result)."""
    def on_call(name, args, kwargs):
        seen.append((tag, "before", name, args, kwargs))
        return lambda result: seen.append((tag, "after", result))
    return on_call


def test_on_call_runs_before_and_its_callback_after_with_the_result():
    original, seen = dist.is_initialized, []
    with intercept(["is_initialized", "no_such_function"], _log(seen, "a")):
        assert dist.is_initialized is not original
        got = dist.is_initialized()
        assert not hasattr(dist, "no_such_function")        # what torch lacks is skipped
    assert seen == [("a", "before", "is_initialized", (), {}), ("a", "after", got)]
    assert dist.is_initialized is original


def test_no_callback_is_fine():
    seen = []
    with intercept(["is_initialized"], lambda *call: seen.append(call)):
        dist.is_initialized()
    assert seen == [("is_initialized", (), {})]


def test_nested_blocks_both_see_each_call_and_each_puts_back_what_it_found():
    original, seen = dist.is_initialized, []
    with intercept(["is_initialized"], _log(seen, "outer")):
        outer = dist.is_initialized
        with intercept(["is_initialized"], _log(seen, "inner")):
            dist.is_initialized()
        assert dist.is_initialized is outer                  # the outer wrapper, back in place
        dist.is_initialized()
    assert dist.is_initialized is original
    assert [s[:2] for s in seen] == [("inner", "before"), ("outer", "before"),
                                     ("outer", "after"), ("inner", "after"),
                                     ("outer", "before"), ("outer", "after")]


def test_an_exception_in_the_block_or_the_callback_restores_every_function():
    original, reduce = dist.is_initialized, dist.all_reduce
    with pytest.raises(ValueError, match="in the block"):
        with intercept(["is_initialized", "all_reduce"], _log([], "a")):
            raise ValueError("in the block")
    assert dist.is_initialized is original and dist.all_reduce is reduce

    def fails(name, args, kwargs):
        raise ValueError("in on_call")
    with pytest.raises(ValueError, match="in on_call"):
        with intercept(["is_initialized"], fails):
            dist.is_initialized()
    assert dist.is_initialized is original


def test_a_thread_rank_is_refused_naming_the_fix_and_nothing_is_rebound():
    """Rebinding is process-wide: thread ranks nesting blocks would restore each other's
    wrappers, so each is told to read its comm's traffic instead."""
    original = dist.is_initialized

    def rank(comm):
        with pytest.raises(RuntimeError, match=r"^who rebinds .*comm\.traffic \(a property\)"):
            with intercept(["is_initialized"], _log([], "a"), who="who"):
                pass
        return in_rank_thread() and dist.is_initialized is original
    assert ThreadWorld(2).run(rank) == [True, True]
    assert not in_rank_thread()
