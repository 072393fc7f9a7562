"""Threads an answer starts carry its torch dispatch modes (the check's Recorder, the
simulated GPUs) and the harness's function modes marked to be carried (exits.py's watch of the C
base class's exits): guard.py wraps what they run in `_with_modes`."""
import concurrent.futures.thread as _cf_thread
import contextlib
import os
import threading

from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

__all__ = ["_modes", "_with_modes", "CarriedFunctionMode", "carried_function_modes"]

_QUALNAME = type.__dict__["__qualname__"].__get__    # the class's slot: no metaclass code runs


class CarriedFunctionMode(TorchFunctionMode):
    """A function mode of the harness that threads started under it carry too (a subclass's
    name ends in `CarriedMode`: each import of the course has its own class)."""


def carried_function_modes():
    """The function modes of this thread to carry into a thread it starts."""
    return [m for m in _get_current_function_mode_stack()
            if _QUALNAME(type(m)).endswith("CarriedMode")]


def _modes():
    return list(_get_current_dispatch_mode_stack()) + carried_function_modes()


# The simulated GPUs' fake-tensor mode: one thread at a time. Reentrant: an executor's worker
# thread, started under the modes, runs items that carry the modes too.
_FAKE_TURN = threading.RLock()
_TURN_WAIT = 30.0   # seconds a thread waits for its turn on an idle machine (then the answer fails)


def executor_worker(thread):
    """Whether `thread` is a concurrent.futures pool's worker: its items take turns, not it (a
    worker holding the turn while it waits for the next item would lock out every other)."""
    target = getattr(thread, "_target", None)
    return getattr(target, "__code__", None) is _cf_thread._worker.__code__


def _with_modes(fn, modes, turn=True):
    """`fn` run under `modes` (those of the thread that started it) where not already active.
    Under the simulated GPUs the answer's threads take turns (unless `turn` is false): torch's
    fake-tensor mode keeps one "inside a kernel" flag for every thread, so two at once fail at
    random (a right answer that runs its replicas in threads, as DataParallel does, would be
    rejected)."""
    fake = turn and any(_is_fake(m) for m in modes)

    def run(*args, **kwargs):
        active = {id(m) for m in _modes()}
        with contextlib.ExitStack() as stack:
            if fake:
                _take_turn()
                stack.callback(_FAKE_TURN.release)
            for mode in modes:
                if id(mode) not in active:
                    stack.enter_context(mode)
            return fn(*args, **kwargs)
    return run


def _take_turn():
    """The turn, or a refusal once another thread has held it past the wait (scaled by the
    machine's load): the turn is held for a thread's whole run, so threads that wait for one
    another's work would otherwise hang the check with no verdict."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1) if hasattr(os, "getloadavg") else 1.0
    if _FAKE_TURN.acquire(timeout=_TURN_WAIT * min(max(1.0, load), 10.0)):
        return
    from .guard import refuse  # guard imports this module
    refuse("your threads wait for one another's work (a join, a queue, a future, a barrier) "
           "while they run: on the simulated GPUs the threads you start run one at a time, "
           "each to its end, so one waiting for another never returns. Start every thread "
           "from the answer itself and wait for them there (as DataParallel's parallel_apply "
           "does)")


def _is_fake(mode):
    return isinstance(mode, FakeTensorMode)
