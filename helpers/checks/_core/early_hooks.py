"""Reader code installed before a check: a dispatch or torch function mode entered in an earlier
cell, a hook for every module or optimizer, saved-tensor hooks. Each runs inside the check (its
reference values, its comparisons, the answer's operations under the Recorder) and could answer
for it, and hooks.py fails only what the answer adds. So a check refuses to start while one is
active, naming what to remove: refusing (not popping them for the check and back) leaves the
reader's process as it was, shows the grade the notebook itself would get, and tells the reader
of a leftover that also bends their own cells' numbers."""
import functools
import types

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .hooks import _GLOBAL, _function_modes, _reader_hook, _saved_top
from .run import CheckFailed
from .settle import reader_class

__all__ = ["expect_no_early_hooks"]

_RESTART = "or restart the kernel, then run the check again"


def _reader(obj):
    """Whether `obj` (a mode, a hook) runs the reader's code: its class or function is the
    reader's, or a function it holds (a library's mode or wrapper fed the reader's callback)."""
    if _reader_hook(obj, None) or reader_class(type(obj)):
        return True
    held = getattr(obj, "__dict__", None)
    return isinstance(held, dict) and not type(obj).__module__.startswith("helpers.") and any(
        callable(v) and _reader_hook(v, None) for v in held.values())


def _reader_callback(hook):
    """A hook the reader's, or a builtin (no Python code: `SEEN.append`, a partial of
    `operator.setitem` on the reader's dict) that would keep what it is handed for the reader."""
    while isinstance(hook, functools.partial):
        hook = hook.func
    code = getattr(getattr(hook, "__func__", hook), "__code__", None)
    return not isinstance(code, types.CodeType) or _reader(hook)


def _name(hook):
    while isinstance(hook, functools.partial):
        hook = hook.func
    return getattr(hook, "__name__", type(hook).__name__)


def _modes():
    """(kind, mode) for every mode now entered: torch function modes, dispatch modes (user and
    infrastructure slots: a mode can claim one by its `_mode_key`)."""
    yield from (("a torch function mode", m) for m in _function_modes())
    yield from (("a dispatch mode", m) for m in _get_current_dispatch_mode_stack())
    for key in torch._C._TorchDispatchModeKey.__members__.values():
        mode = torch._C._get_dispatch_mode(key)
        if mode is not None:
            yield "a dispatch mode", mode


def early_hooks():
    """The reader's interceptors active now, as phrases naming each and its removal."""
    found = []
    for kind, mode in _modes():
        if _reader(mode):
            found.append(f"{kind} of yours ({type(mode).__name__}) entered earlier is still "
                         "active: exit it (leave its `with` block, or call "
                         "mode.__exit__(None, None, None) until it is gone)")
    for owner, attr in _GLOBAL:
        hooks = getattr(owner, attr, None)
        for hook in list(hooks.values()) if isinstance(hooks, dict) else ():
            if _reader_callback(hook):
                every = "module" if "optimizer" not in attr else "optimizer"
                found.append(f"a hook of yours for every {every} ({_name(hook)} in "
                             f"{owner.__name__}.{attr}) is still registered: remove it "
                             "(handle.remove() on the handle its register_ call returned)")
    top = _saved_top()
    if top and any(_reader_callback(h) for h in top):
        found.append("saved-tensor hooks of yours (torch.autograd.graph.saved_tensors_hooks "
                     "entered earlier) are still active: leave their `with` block")
    return found


def expect_no_early_hooks():
    """CheckFailed, before the check computes anything, while code of the reader's installed
    earlier would run inside it; nothing is removed (the reader's process stays as it was)."""
    found = early_hooks()
    if found:
        raise CheckFailed(
            f"{found[0]}, {_RESTART}. Code of yours installed before the check would run inside "
            "it (its own operations, its comparisons), so it cannot judge your answer"
            + (f" ({len(found) - 1} more such hook or mode)" if len(found) > 1 else ""))
