"""Reader code installed before a check: a dispatch or torch function mode entered in an earlier
cell, a hook for every module or optimizer, saved-tensor hooks, and the process's callbacks that
callbacks.py judges after the answer's call (a trace or profile function, a gc callback, sys's
hooks and streams, an import hook, a signal handler). Each runs inside the check (its reference
values, its comparisons, the answer's operations under the Recorder, its verdict line) and could
answer for it, and hooks.py and callbacks.py fail only what the answer adds. So a check refuses
to start while one is active, naming what to remove: refusing (not popping them for the check
and back) leaves the reader's process as it was, shows the grade the notebook itself would get,
and tells the reader of a leftover that also bends their own cells' numbers. Trace and profile
functions are the exception: they are taken off (and stay off), since one would see every frame
of the check and could rewrite its locals, its verdict included, until the check returned."""
import functools
import sys
import threading
import types

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .callbacks import STREAMS, _readers, callbacks
from .hooks import _GLOBAL, _function_modes, _reader_hook, _saved_top
from .run import CheckFailed
from .settle import reader_class

__all__ = ["expect_no_early_hooks", "taken_off", "verdict_writer"]

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


# trace and profile functions: (what, setter), in the order taken_off reads them; sys's getters
# and setters bound at import (sys's attributes are the reader's to rebind)
_GP, _SP, _GT, _ST = sys.getprofile, sys.setprofile, sys.gettrace, sys.settrace
_TRACERS = (("sys.setprofile", _SP), ("sys.settrace", _ST),
            ("threading.setprofile", threading.setprofile),
            ("threading.settrace", threading.settrace))
_SKIPPED = ("weakref.finalize", "signal.setitimer", "os.environ")   # judged only after the call


def taken_off():
    """Take off the reader's trace and profile functions (sys's, and threading's for the threads
    the check starts) before the check runs a line, and return the refusal naming them (None if
    there were none). sys's are taken off in the first statement (a tracer sees each line and
    could rewrite this function's locals); a library's (a debugger, coverage) is put back at
    once (one set from C, not callable, is no Python code and stays); the reader's stay off
    (put back, one would see the check's last frames)."""
    seen = ((p := _GP()), callable(p) and _SP(None), (t := _GT()), callable(t) and _ST(None))
    seen = (seen[0], seen[2], getattr(threading, "_profile_hook", None),
            getattr(threading, "_trace_hook", None))
    found, first = [], None
    for (what, put), fn in zip(_TRACERS, seen, strict=True):
        if not callable(fn):
            continue
        if not (_readers((fn,)) or _reader(fn)):
            if what.startswith("sys."):
                put(fn)
            continue
        put(None)
        found.append(f"{what}(None)")
        first = first or (what, fn)
    if first is None:
        return None
    what, fn = first
    return (f"a {'trace' if 'trace' in what else 'profile'} function of yours ({what}: "
            f"{_name(fn)}), set earlier, was still active: it would see every frame of the check "
            "and could rewrite its values, so it cannot judge your answer. It has been taken off "
            f"({', '.join(found)}): run the check again, and set it again only after the checks "
            "(or restart the kernel)")


def verdict_writer(stream, fallback):
    """What prints the verdict line: the `write` of sys.stdout's class as the check starts, bound
    to it (a `write` set on the instance, or the class's rebound later, is passed by), or the
    process's own stream's when sys.stdout is the reader's (its `write` would run the reader's
    code with the check's frames open; early_hooks refuses the check then)."""
    if stream is None or _reader_stream(stream):
        stream = fallback
    if stream is None:
        return len
    write = getattr(type(stream), "write", None)        # None: a proxy that forwards it
    return functools.partial(write, stream) if write is not None else stream.write


def _reader_stream(stream):
    return _readers((stream,)) or _reader(stream)


def _callbacks():
    """The process's callbacks (callbacks.py's list) that hold the reader's code now."""
    found = []
    for what, value in callbacks().items():
        if what.startswith(_SKIPPED) or any(what == t[0] for t in _TRACERS):
            continue
        for v in value if isinstance(value, tuple) else (value,):
            if v is None or isinstance(v, int) or not (      # int: signal.SIG_DFL and such
                    _reader_stream(v) if what in STREAMS else _readers((v,))):
                continue
            if what in STREAMS:
                found.append(f"{what} runs code of yours ({type(v).__name__}: your class, or "
                             "a method of yours set on it), set earlier: put back the stream you "
                             "replaced")
            elif isinstance(value, tuple):
                found.append(f"a function of yours ({_name(v)}) in {what} is still installed: "
                             f"remove it from {what}")
            else:
                found.append(f"{what} holds code of yours ({_name(v)}), set earlier: put back the "
                             "one you replaced")
    return found


def early_hooks():
    """The reader's interceptors active now, as phrases naming each and its removal."""
    found = _callbacks()
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
    message = _refusal(early_hooks())
    if message:
        raise CheckFailed(message)


def _refusal(found):
    if found:
        return (f"{found[0]}, {_RESTART}. Code of yours installed before the check would run "
                "inside it (its own operations, its comparisons), so it cannot judge your answer"
                + (f" ({len(found) - 1} more such hook or mode)" if len(found) > 1 else ""))
    return None
