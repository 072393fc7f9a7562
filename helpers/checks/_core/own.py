"""The checks' own code is out of the answer's reach: a check computes its expected value with
functions of its module (`pipeline_dist._bubble`, `mesh2d._fsdp_rows`, `ddp_scratch._buckets`, a
copy of a blocked reference), and an answer that imports the module and calls one would pass
without computing anything.

`gate(package)` runs once, when the checks are imported: every function defined at the top of
a check module (`helpers/checks/*.py`, the harness's `_core` aside, the check bodies aside) gets
a gate's code in place of its own (the function object stays, so every binding of it, in any
module, reaches the gate). While no answer runs the gate calls the original at once; while one
runs, it calls it only for the check's own code (a check module's own code is above it, whose.py,
and no answer window is open below: checks_calling), else refuses. The original code's keys
are blocked like references' (`KEYS`: guard.py refuses a copy exec'd, imported again or made
into a new function while an answer runs). A check module's classes (the nets a check hands the
answer, whose methods run inside it) are not gated: called by the answer, they run as the
answer's, so they cannot carry a gated or blocked call out as the check's.
"""
import dis
import os
import sys
import threading
import types

from ...runtime.thread_world import ThreadWorld
from .guard import _state, refuse, started_by_answer
from .references import code_key
from .run import REGISTRY
from .whose import forwarding_code, genuine, reader_code

__all__ = ["gate", "KEYS", "checks_calling"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_CHECKS_DIR = os.path.dirname(_HERE)
_DECLARE, _CARRIED = os.path.join(_HERE, "declare.py"), os.path.join(_HERE, "carried.py")
_WORLD = os.path.abspath(sys.modules[ThreadWorld.__module__].__file__)   # as world.py's _OURS
_SMALL = 12        # a function this short (instructions) may well have a twin in a library


def _key_table():
    """KEYS (code key -> "the check's own <module>.<name>") and its writer: the dict is held by
    this closure and the read-only view only, no module dict an answer could empty."""
    keys = {}

    def add(key, label):
        keys[key] = label
    return types.MappingProxyType(keys), add


KEYS, _add_key = _key_table()


def _message(name):
    return (f"your code called the check's own {name}, which computes what the check compares "
            "your answer with: an answer computes its result itself")


def checks_calling(frame, bare=True):
    """True when a gated or blocked call is the check's own: a check module's own code
    (whose.py) is on the stack above it and no answer window is open below it on this thread's
    stack: no frame of the reader's, no answer's call in declare.py, no work submitted to an
    executor while an answer ran (carried.py), anywhere (a check module's class or closure
    handed the answer's callable runs it for the answer, not for the check). At the end of the
    stack, a thread started while an answer ran (guard.py's marks), or not by threading at all
    (`_thread.start_new_thread`), is the answer's unless a World's rank (the runtime's thread
    world) runs it. `bare`: a stack with no check's frame
    counts (own.py's gates: a thread the check started), or not (stubs.py)."""
    world = mine = False
    while frame is not None:
        code = frame.f_code
        if reader_code(code):
            return False
        path = os.path.abspath(code.co_filename)
        if path == _DECLARE and code.co_name == "__call__":
            return False
        if path == _CARRIED and not isinstance(
                getattr(frame.f_locals.get("fn"), "__self__", None), threading.Thread):
            return False            # submitted work (a thread's own run is carried too)
        mine = mine or (os.path.dirname(path) == _CHECKS_DIR and genuine(code))
        world = world or (path == _WORLD and genuine(code))
        frame = frame.f_back
    thread = threading.current_thread()     # threading's, or a _DummyThread (_thread's raw)
    return (mine or bare) and (world or not (started_by_answer(thread)
                                             or isinstance(thread, threading._DummyThread)))


def _make():
    """The gates' dispatcher, with the originals in its closure (no module attribute holds
    them)."""
    originals = {}     # key -> (name, a function of the original code)

    def through(key, args, kwargs):
        name, original = originals[key]
        if _state().armed() and not checks_calling(sys._getframe(2)):
            refuse(_message(name))
        return original(*args, **kwargs)

    def add(key, name, original):
        originals[key] = (name, original)
    return through, add


_through, _add = _make()


def _gate_code(freevars, key):
    """Code that hands every call to `_through(key, ...)` (whose.forwarding_code)."""
    return forwarding_code(freevars, "_gate", __name__, "_through", key, __file__)


def _gated(module):
    """The functions defined at the top of `module` (its own file), check bodies aside."""
    file = os.path.abspath(getattr(module, "__file__", "") or "")
    for attr, value in list(vars(module).items()):
        if (isinstance(value, types.FunctionType) and value.__name__ not in REGISTRY
                and os.path.abspath(value.__code__.co_filename) == file):
            yield attr, value


def gate(package):
    """Gate every function of `package`'s check modules (`helpers.checks`), once."""
    done = set()
    prefix = package + "."
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefix) or name.startswith(prefix + "_core"):
            continue
        if os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or "")) != _CHECKS_DIR:
            continue
        for attr, fn in _gated(module):
            if id(fn) in done or fn.__code__.co_name == "_gate":
                continue
            done.add(id(fn))
            label = f"{name[len(prefix):]}.{attr}"
            original = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__,
                                          fn.__defaults__, fn.__closure__)
            original.__kwdefaults__ = fn.__kwdefaults__
            key = f"{label}:{id(fn)}"
            _add(key, label, original)
            if len(list(_instructions(fn.__code__))) >= _SMALL:
                _add_key(("code", code_key(fn.__code__)), f"the check's own {label}")
            fn.__code__ = _gate_code(len(fn.__code__.co_freevars), key)


def _instructions(code):
    return dis.get_instructions(code)
