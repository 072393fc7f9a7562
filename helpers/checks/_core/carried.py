"""Threads an answer starts carry its torch dispatch modes (the check's Recorder, the
simulated GPUs) and the harness's function modes marked to be carried (exits.py's watch of the C
base class's exits): guard.py wraps what they run in `_with_modes`."""
import contextlib
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


_FAKE_TURN = threading.Lock()   # the simulated GPUs' fake-tensor mode: one thread at a time


def _with_modes(fn, modes):
    """`fn` run under `modes` (those of the thread that started it) where not already active.
    Under the simulated GPUs the answer's threads take turns: torch's fake-tensor mode keeps one
    "inside a kernel" flag for every thread, so two at once fail at random (a right answer that
    runs its replicas in threads, as DataParallel does, would be rejected)."""
    fake = any(_is_fake(m) for m in modes)

    def run(*args, **kwargs):
        active = {id(m) for m in _modes()}
        with contextlib.ExitStack() as stack:
            if fake:
                stack.enter_context(_FAKE_TURN)
            for mode in modes:
                if id(mode) not in active:
                    stack.enter_context(mode)
            return fn(*args, **kwargs)
    return run


def _is_fake(mode):
    return isinstance(mode, FakeTensorMode)
