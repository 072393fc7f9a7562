"""An executor made before the check (a notebook's `POOL = ThreadPoolExecutor(2)`, one worker
started by a warm-up) may start its next worker while the answer maps over it: that worker is
the executor's like the earlier one, and once it waits on the empty queue the right answer
passes, on the first run as on a rerun (patched.py, early_threads.idle_worker). A worker still
running the answer's work after it returned fails, started during the call or not; so does an
idle pool the answer made itself and left open."""
import concurrent.futures
import threading

import pytest

import helpers.checks

THREAD = "a thread it started"
TASK = "a task it submitted to a thread pool was still running"     # at the return (outlived.py)


@pytest.fixture
def pool():
    pool = concurrent.futures.ThreadPoolExecutor(2)
    pool.submit(int).result()               # one worker started now, idle afterwards
    yield pool
    pool.shutdown()


def _grown(pool, then=None):
    """tensor_bytes that makes `pool` run two items at once (so it starts its second worker),
    each then running `then`, and sums the bytes on the pool."""
    def tensor_bytes(tensors):
        gate = threading.Barrier(2, timeout=10)
        grown = pool.map(lambda _: (gate.wait(), then and then()), range(2))
        if then is not None:            # left running
            return sum(t.numel() * t.element_size() for t in tensors)
        list(grown)
        return sum(pool.map(lambda t: t.numel() * t.element_size(), tensors))
    return tensor_bytes


def test_a_right_answer_on_an_earlier_pool_that_grows_passes(pool):
    result = helpers.checks.check_tensor_bytes(_grown(pool))
    assert result.status == "passed", result
    assert len(pool._threads) == 2          # the pool did grow during the answer


def test_a_worker_still_running_the_answers_work_fails(pool):
    release = threading.Event()
    try:
        result = helpers.checks.check_tensor_bytes(_grown(pool, lambda: release.wait(20)))
    finally:
        release.set()
    assert result.status == "failed" and TASK in result.message, result


def test_a_pool_of_the_answers_left_open_fails():
    made = []

    def tensor_bytes(tensors):
        made.append(concurrent.futures.ThreadPoolExecutor(1))
        return sum(made[-1].map(lambda t: t.numel() * t.element_size(), tensors))
    try:
        result = helpers.checks.check_tensor_bytes(tensor_bytes)
    finally:
        for p in made:
            p.shutdown()
    assert result.status == "failed" and THREAD in result.message, result
