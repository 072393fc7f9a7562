"""Threads an answer starts carry its torch dispatch modes (the check's Recorder, the
simulated GPUs) and the harness's function modes marked to be carried (exits.py's watch of the C
base class's exits): guard.py wraps what they run in `_with_modes`. The simulated GPUs run one
operation at a time, whichever thread asks (`one_simulated_op`)."""
import contextlib
import os
import threading

from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from ...runtime.intercept import RANK_THREAD
from .outlived import calls_tasks, current
from .run import HarnessError

__all__ = ["_modes", "_with_modes", "CarriedFunctionMode", "carried_function_modes",
           "one_simulated_op", "ranks_carried", "rank_carried"]

_QUALNAME = type.__dict__["__qualname__"].__get__    # the class's slot: no metaclass code runs


class CarriedFunctionMode(TorchFunctionMode):
    """A function mode of the harness that threads started under it carry too (a subclass's
    name ends in `CarriedMode`: each import of the course has its own class)."""


def carried_function_modes():
    """The function modes of this thread to carry into a thread it starts."""
    return [m for m in _get_current_function_mode_stack()
            if _QUALNAME(type(m)).endswith("CarriedMode")]


_WORLDS = []    # the worlds running now (world.py's run_context): their ranks' threads carry them
# (a default argument of the functions below, no module attribute: guard.py)


def _modes():
    return list(_get_current_dispatch_mode_stack()) + carried_function_modes()


def _with_modes(fn, modes, task=None, *, _WORLDS=_WORLDS):
    """`fn` run under `modes` (those of the thread that started it) where not already active,
    and as the rank of a running world that started it (`ranks_carried`: a process group
    belongs to the process, so a rank's collectives from its own threads are that rank's).
    Threads run side by side under the simulated GPUs too: each simulated operation is whole
    and its "inside a kernel" flag the thread's own (fake.py), so threads that wait for one
    another's work (a join, a queue, a barrier) run as they would on real devices. It works for
    the answer's call that started it (outlived.py): `task` (a Thread's) is done when `fn`
    returns; once that call has returned, what `fn` raises is no verdict's (the call was judged
    at its return) and goes unprinted."""
    ranks = [(w, w.rank) for w in list(_WORLDS) if w.rank is not None]
    call = current()

    def run(*args, **kwargs):
        active = {id(m) for m in _modes()}
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(calls_tasks(call))
                for world, rank in ranks:
                    stack.enter_context(_as_rank(world, rank))
                for mode in modes:
                    if id(mode) not in active:
                        stack.enter_context(mode)
                return fn(*args, **kwargs)
        except BaseException:
            if call is None or not call.closed:
                raise
            return None
        finally:
            if task is not None:
                task[1] = True
    return run


def rank_carried(*, _WORLDS=_WORLDS):
    """The rank of a running world the calling thread works for (None: none)."""
    return next((w.rank for w in list(_WORLDS) if w.rank is not None), None)




@contextlib.contextmanager
def ranks_carried(world, *, _WORLDS=_WORLDS):
    """While `world` runs, a thread one of its ranks starts (a Thread, a pool's task) runs as
    that rank (`_with_modes`)."""
    _WORLDS.append(world)
    try:
        yield
    finally:
        _WORLDS.remove(world)


@contextlib.contextmanager
def _as_rank(world, rank):
    """This thread as `rank` of `world` (the thread-local rank ThreadWorld sets in its ranks'
    threads, and intercept's), put back after (a pool's thread runs other tasks)."""
    local = world._local
    before = getattr(local, "rank", None), getattr(RANK_THREAD, "rank", None)
    local.rank = RANK_THREAD.rank = rank
    try:
        yield
    finally:
        local.rank, RANK_THREAD.rank = before


# One simulated operation at a time, in every thread (the answer's own threads beside the one
# that called it): torch's fake-tensor mode keeps its caches and memo on the one mode object.
_ONE_OP = threading.RLock()
_OP_WAIT = 30.0     # seconds an operation waits for another thread's (then the check stops)


@contextlib.contextmanager
def one_simulated_op(broke=None):
    """Hold the simulated GPUs for one operation (reentrant: an operation's parts run inside
    it). A wait past _OP_WAIT (scaled by the machine's load) ends the check as the grader's
    problem (noted in `broke`, for a thread's), never a hang: no code of the reader's runs
    inside a simulated operation."""
    if not _ONE_OP.acquire(blocking=False) and not _ONE_OP.acquire(timeout=_OP_WAIT * min(
            max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)), 10.0)):
        e = HarnessError("a simulated GPU operation waited for another thread's to end past "
                         f"{_OP_WAIT:g} s: the grader's simulation stalled. Not a verdict on "
                         "your answer: run the check again")
        (broke if broke is not None else []).append((e, None))
        raise e
    try:
        yield
    finally:
        _ONE_OP.release()


del _WORLDS
