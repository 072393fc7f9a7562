"""Nothing of the reader's code is left to run later through the process's own callbacks. After
the answer returned, the check converts, computes its expected value and compares; a callback
the answer installed process-wide (a gc callback, a signal handler or timer, sys's hooks, a
profile or trace function, an import hook, a finalizer of its own, what shows a warning) would
run the reader's code
then, where nothing watches it, and could bend the verdict (rebind what the check compares with,
after patched.py's comparison). So `Answer` notes them before the call and fails an answer that
returns with one of the reader's changed, putting the original back (a library imported
lazily may install its own). Audit hooks, which cannot be removed, and sys.monitoring are
refused when installed (guard.py); `atexit.register`, which cannot be listed, when the answer's
code reaches it (references.py), and counted while it runs (left_later.py). So are the slots the
harness itself reads after the call: sys's streams and the methods set on them (the verdict is
printed through `sys.stdout`: a writer of the reader's would run with the check's frames open)
and the grading switch (`os.environ`'s keys that make a failure raise): any change fails, whoever's
object it holds. early_hooks.py refuses a check that starts with one of the reader's.

What runs the reader's code later without being a callback (an object whose death runs it, an
exit function, a Python kernel for an operator) is left_later.py's."""
import functools
import os
import signal
import sys
import threading
import types
import warnings
import weakref

from .run import GRADING_ENVS, CheckFailed
from .settle import reader_class
from .whose import reader_code

__all__ = ["callbacks", "expect_no_callbacks", "STREAMS"]

_GC = __import__("gc").callbacks      # the list gc runs (rebinding gc.callbacks leaves it)
_SYS = ("excepthook", "displayhook", "unraisablehook", "breakpointhook")
_WARNINGS = ("showwarning", "_showwarnmsg")    # what a warning raised inside the check runs
_SIGNALS = tuple(signal.valid_signals())
_TIMERS = tuple(getattr(signal, n) for n in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")
                if hasattr(signal, n))
STREAMS = ("sys.stdout", "sys.stderr", "sys.stdin")
_ENVIRON = os.environ                 # the process's environment (rebinding os.environ leaves it)
_OWN = tuple(f"{what}.__dict__" for what in STREAMS)      # methods set on the stream itself
_METHODS = ("write", "writelines", "flush")
_SWITCHES = tuple(f"os.environ[{k!r}]" for k in GRADING_ENVS)
_STATE = frozenset((*STREAMS, *_OWN, *_SWITCHES, "os.environ"))   # any change of these fails
_LISTS = types.MappingProxyType({"sys.meta_path": sys.meta_path,
                                 "sys.path_hooks": sys.path_hooks, "gc.callbacks": _GC,
                                 "threading._register_atexit": getattr(
                                     threading, "_threading_atexits", [])})


def _getsignal(s):
    try:
        return signal.getsignal(s)
    except (ValueError, OSError):
        return None


_JUDGED = {}        # alive finalizer -> its text, or None: each judged once
_UNSEEN = object()


def _finalizers(*, _JUDGED=_JUDGED):
    """The alive finalizers whose function may run the reader's code: {finalizer: its text}.
    Each is judged once (torch keeps a hundred or more alive; judging them all at every call
    made each answer's call 40 ms slower)."""
    found, alive = {}, list(weakref.finalize._registry)
    for f in _JUDGED.keys() - set(alive):          # finalizers that ran: forgotten (pop:
        _JUDGED.pop(f, None)                         # a World's other rank may forget it too)
    for f in alive:
        text = _JUDGED.get(f, _UNSEEN)
        if text is _UNSEEN:
            info = f._registry.get(f)
            text = None if info is None or not _readers(
                (info.func, *info.args, *(info.kwargs or {}).values())) else getattr(
                    info.func, "__name__", "a function")
            _JUDGED[f] = text
        if text is not None:
            found[f] = text
    return found


def _readers(values):
    """Whether any of `values` is (or wraps) a callable or an object of the reader's, or a
    builtin that would run code handed to it (exec, setattr ...): not the course's or a
    library's own function."""
    for v in values:
        if not isinstance(v, type) and reader_class(type(v)):
            return True
        while isinstance(v, functools.partial):
            v = v.func
        code = getattr(getattr(v, "__func__", v), "__code__", None)
        if isinstance(code, types.CodeType) and reader_code(code):
            return True
        if isinstance(v, types.BuiltinFunctionType) and getattr(v, "__self__", None) in (
                None, sys.modules["builtins"]):
            return True
    return False


def _own(stream):
    """The methods set on `stream` itself (its instance dict), flat: (name, value, ...); none
    read from a stream of the reader's class (reading could run its code: it fails anyway)."""
    if stream is None or reader_class(type(stream)):
        return ()
    held = getattr(stream, "__dict__", None)
    held = held if isinstance(held, dict) else {}
    return tuple(x for name in _METHODS if name in held for x in (name, held[name]))


def callbacks():
    """What runs later on its own, now: {what: value}."""
    found = {f"sys.{n}": getattr(sys, n, None) for n in _SYS}
    found.update({"threading.excepthook": threading.excepthook, "sys.setprofile": sys.getprofile(),
                  "sys.settrace": sys.gettrace(),
                  "threading.setprofile": getattr(threading, "_profile_hook", None),
                  "threading.settrace": getattr(threading, "_trace_hook", None),
                  "sys.set_asyncgen_hooks": tuple(sys.get_asyncgen_hooks()),
                  "weakref.finalize": frozenset(_finalizers())})
    found.update({k: tuple(v) for k, v in _LISTS.items()})
    found.update({f"signal.signal({s!s})": _getsignal(s) for s in _SIGNALS})
    found.update({f"signal.setitimer({t})": signal.getitimer(t)[0] > 0 for t in _TIMERS})
    found.update({f"warnings.{n}": getattr(warnings, n, None) for n in _WARNINGS})
    found.update({what: getattr(sys, what[4:], None) for what in STREAMS})
    found.update({own: _own(found[what]) for what, own in zip(STREAMS, _OWN, strict=True)})
    found.update({what: _ENVIRON.get(k) for what, k in zip(_SWITCHES, GRADING_ENVS, strict=True)})
    found["os.environ"] = os.environ
    return found


def _put_back(what, value):
    if what.startswith("sys.") and (what[4:] in _SYS or what in STREAMS):
        setattr(sys, what[4:], value)
    elif what.startswith("warnings."):
        setattr(warnings, what[9:], value)
    elif what in _OWN:
        held = getattr(getattr(sys, what[4:-9], None), "__dict__", None)
        if isinstance(held, dict):
            for name in _METHODS:
                held.pop(name, None)
            held.update(zip(value[::2], value[1::2], strict=True))
    elif what in _SWITCHES:
        key = GRADING_ENVS[_SWITCHES.index(what)]
        if value is None:
            _ENVIRON.pop(key, None)
        else:
            _ENVIRON[key] = value
    elif what == "os.environ":
        os.environ = value    # noqa: B003 (the object noted before the call, not a new one)
    elif what == "threading.excepthook":
        threading.excepthook = value
    elif what == "sys.setprofile":
        sys.setprofile(value)
    elif what == "sys.settrace":
        sys.settrace(value)
    elif what.startswith("threading.set"):
        setattr(threading, f"_{what[13:]}_hook", value)
    elif what == "sys.set_asyncgen_hooks":
        sys.set_asyncgen_hooks(*value)
    elif what in _LISTS:
        _LISTS[what][:] = value
    elif what == "weakref.finalize":
        for f in _finalizers().keys() - value:
            f.detach()
    elif what.startswith("signal.signal(") and threading.current_thread() is \
            threading.main_thread() and value is not None:
        signal.signal(next(s for s in _SIGNALS if f"signal.signal({s!s})" == what), value)
    elif what.startswith("signal.setitimer("):
        signal.setitimer(next(t for t in _TIMERS if f"signal.setitimer({t})" == what), 0)


def _new(before, after):
    """What is new in `after`: the items a list gained, else the value itself."""
    if isinstance(after, (tuple, frozenset)):
        return [v for v in after if not any(v is b for b in before or ())]
    return [after]


def _left(what, before, after):
    """Whether the change of `what` is a callback of the reader's left to run: a timer armed, a
    finalizer of the reader's made (those are filtered already), a reader's function put in."""
    if what.startswith("signal.setitimer") or what in _STATE:
        return True
    new = _new(before, after)
    return bool(new) if what == "weakref.finalize" else _readers(new)


def _same(a, b):
    """`a` and `b` are the same callbacks, by identity (`!=` would run an object's `__eq__`)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
    if isinstance(a, frozenset) and isinstance(b, frozenset):
        return a == b                 # weakref.finalize objects: compared by identity
    return a is b or (type(a) in (str, bool) and a == b)


def expect_no_callbacks(name, before):
    """CheckFailed naming the process-wide callback of the reader's the answer left, or the
    harness's slot it changed (each put back first, as far as it can be)."""
    after = callbacks()
    changed = [what for what, value in after.items() if not _same(before.get(what), value)
               and _left(what, before.get(what), value)]
    for what in changed:
        _put_back(what, before.get(what))
    slots = [what for what in changed if what in _STATE]
    if slots:
        why = ["the check prints its verdict through sys.stdout after your function returned: "
               "restore a stream you replace (contextlib.redirect_stdout does)"] if set(
                   slots) & {*STREAMS, *_OWN} else []
        why += ["the grading switch decides whether a failed check raises: leave the "
                "environment's grading keys alone"] if set(slots) - {*STREAMS, *_OWN} else []
        raise CheckFailed(f"{name} left {', '.join(slots[:3])} changed (put back): "
                          + "; ".join(why))
    if changed:
        raise CheckFailed(
            f"{name} left {', '.join(changed[:3])} set: a process-wide callback would run your "
            "code after your function returned, while the check judges it (it is put back). "
            "Compute the result inside your function, and install nothing that runs later")


del _JUDGED
