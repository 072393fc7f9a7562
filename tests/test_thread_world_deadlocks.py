"""A ThreadWorld's deadlock is raised in the call of each rank it leaves blocked, also when the
last other rank to return is the one that finds it (no rank is woken to stop quietly), and its
words name each blocked call and the ranks that returned without the send, receive or
collective it waits for (helpers/runtime/thread_world.py, thread_waits.py, errors.py)."""
import time
import traceback

import pytest
import torch

from helpers.runtime.errors import Deadlock
from helpers.runtime.thread_world import ThreadWorld


def _frames(error):
    return [f.name for f in traceback.extract_tb(error.__traceback__)]


def _late_return(comm):
    """Rank 0 waits for a message rank 1 never sends; rank 1 returns after it blocked."""
    if comm.rank == 0:
        return comm.recv(1, (1,))
    time.sleep(0.3)           # rank 0 is blocked by then: rank 1's return finds the deadlock


def _late_collective(comm):
    """Rank 0 all-reduces once more than rank 1, which returns after rank 0 blocked."""
    comm.all_reduce(torch.ones(1))
    if comm.rank == 0:
        comm.all_reduce(torch.ones(1))
    else:
        time.sleep(0.3)


def _late_send_wait(comm):
    """Rank 1 waits for a send rank 0 never receives; rank 0 returns after rank 1 blocked."""
    if comm.rank == 1:
        comm.send(torch.ones(1), 0)
        comm.wait()
    else:
        time.sleep(0.3)


@pytest.mark.parametrize("fn, words", [
    (_late_return, "rank 0 waits in recv for a message from rank 1 (tag 0) that was never sent, "
                   "but rank 1 returned without sending it"),
    (_late_collective, "rank 0 waits in all_reduce for the other ranks of [0, 1] to call it, "
                       "but rank 1 returned without calling it. Every rank of a group must make "
                       "the same collective calls"),
    (_late_send_wait, "rank 1 waits in comm.wait() for its send to rank 0 (tag 0) to be "
                      "received, but rank 0 returned without receiving it. A send completes "
                      "only once its peer receives it")])
def test_a_deadlock_found_as_the_last_rank_returns_is_raised_in_the_blocked_rank(fn, words):
    for _ in range(3):       # the same verdict every run
        t0 = time.monotonic()
        with pytest.raises(Deadlock) as info:
            ThreadWorld(2, timeout=30).run(fn)
        assert time.monotonic() - t0 < 10
        assert fn.__name__ in _frames(info.value), _frames(info.value)   # the rank's own call
        message = str(info.value)
        assert words in message, message
        assert "post the receives before waiting" not in message, message


def test_a_send_cycle_keeps_its_words_and_each_rank_raises_its_own_copy():
    """Three ranks that each wait for their send before receiving: every one blocked, none
    returned, the fix to post the receives first; each blocked rank raised the Deadlock in its
    own call (three errors, three objects)."""
    def ring(comm):
        comm.send(torch.ones(1), (comm.rank + 1) % 3)
        comm.wait()
        comm.recv((comm.rank - 1) % 3, (1,))
    w = ThreadWorld(3, timeout=30)
    _, errors, stuck = w.start(lambda r: ring(w.comm(r)))
    assert not stuck and len(errors) == 3 and len({id(e) for _, e in errors}) == 3, errors
    assert all(isinstance(e, Deadlock) and "ring" in _frames(e) for _, e in errors), errors
    assert "post the receives before waiting" in str(errors[0][1])
    assert errors[0][1].blocked == {0: errors[0][1].blocked[0], 1: errors[0][1].blocked[1],
                                    2: errors[0][1].blocked[2]} and errors[0][1].returned == []
