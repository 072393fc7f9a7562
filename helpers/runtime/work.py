"""What an async call of the thread world (thread_world.py) returns: a Work, and the future its
`get_future()` gives. A collective's Work is complete when the call returns, as on gloo and
NCCL once every rank of the group has launched it (the thread world's launch returns then,
the result delivered); a receive's is delivered at its first `wait()` (or `get_future()`).
The future resolves to what torch's gloo gives (`[tensor]` for an all-reduce), and so does
`result()`. A rank's wait is recorded where the rank first observes completion: `Work.wait()`,
`result()`, `is_completed()` returning True, the future's `wait()`, `value()` or `done()`
returning True, `torch.futures.wait_all` or `collect_all(...).wait()` over it, or any of these
on a future chained from it with `then()`. So a loop on `is_completed()` or `done()` waits
where it runs, as `wait()` does. Making the future does not wait, nor does a `then()` or
`add_done_callback()` callback running (torch runs those off the rank's thread). The checks'
World fails a rank that returns with one never waited for (helpers/checks/_core/waits.py).
"""
import contextlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

__all__ = ["Work", "WorkFuture", "waited_all"]


class WorkFuture(torch.futures.Future):
    """A torch Future whose `wait()`, `value()` and `done()` (when True) first record the rank's
    wait (`waited()`, once); a future chained with `then()` records the same wait. A callback
    gets a plain completed Future with the same value, so reading it there is no wait."""

    def __init__(self, waited: Callable[[], None],
                 landed: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
                 ) -> None:
        super().__init__()
        self._waited, self._landed = waited, landed     # landed(): around each callback

    def wait(self) -> Any:
        self._waited()
        return super().wait()

    def value(self) -> Any:
        self._waited()
        return super().value()

    def done(self) -> bool:
        finished = super().done()
        if finished:            # the rank sees it complete: it has waited
            self._waited()
        return finished

    def _plain(self) -> torch.futures.Future:
        """A plain Future holding this one's value (or error), for a callback to read."""
        plain = torch.futures.Future()
        try:
            plain.set_result(torch.futures.Future.value(self))
        except Exception as e:      # the callback sees the error when it reads, as in torch
            plain.set_exception(e)
        return plain

    def then(self, callback: Callable[[torch.futures.Future], Any]) -> "WorkFuture":
        child = WorkFuture(self._waited, self._landed)

        def run(_):
            try:
                with self._landed():
                    value = callback(self._plain())
                child.set_result(value)
            except Exception as e:
                child.set_exception(e)
        super().add_done_callback(run)
        return child

    def add_done_callback(self, callback: Callable[[torch.futures.Future], Any]) -> None:
        def run(_):
            with self._landed():
                callback(self._plain())
        super().add_done_callback(run)


class Work:
    """What an async call returns. `deliver`: None when the result is in place already (a
    collective: delivered as its launch returned), else what delivers it, once, at the first
    wait or `get_future()` (a receive). `wait()`, `result()` and `is_completed()` returning True
    record the rank's wait; `get_future()` returns one completed WorkFuture resolving to
    `value()`, recording nothing until the rank waits on it. It holds only closures (no
    attribute leads to the world or the message a check judges)."""

    __slots__ = ("_wait", "_done", "_future", "_result")

    def __init__(self, world: Any, message: Any, deliver: Callable[[], None] | None = None,
                 value: Callable[[], Any] | None = None) -> None:   # a ThreadWorld, a Message
        pending = [] if deliver is None else [deliver]
        made = []

        def delivered():
            if pending:
                with world.comm_context():
                    pending.pop()()

        def waited():
            delivered()
            if world.record and message.waited is None:
                message.waited = world.event(message.rank, "wait", message)

        def done():
            if pending:
                return False
            waited()
            return True

        def result():
            waited()
            return value() if value is not None else []

        def future():
            delivered()
            if not made:
                fut = WorkFuture(waited, lambda: world.landed_context(message))
                fut.set_result(value() if value is not None else [])
                made.append(fut)
            return made[0]
        self._wait, self._done, self._future, self._result = waited, done, future, result

    def wait(self, timeout: float | None = None) -> bool:
        self._wait()
        return True

    def is_completed(self) -> bool:
        return self._done()

    def result(self) -> Any:
        """What gloo's `result()` gives once the work completed (`[tensor]` for an all-reduce,
        as its future's value)."""
        return self._result()

    def get_future(self) -> WorkFuture:
        return self._future()


def waited_all(futures: Iterable[Any]) -> None:
    """Record the waits of the WorkFutures among `futures` (torch.futures.wait_all and
    collect_all combine them in C++, past their own `wait()`: the grader's World replaces the C
    function both call, helpers/checks/_core/dist.py)."""
    for f in futures:
        if isinstance(f, WorkFuture):
            f._waited()
