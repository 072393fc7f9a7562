"""The checks' own code is out of the answer's reach: a check computes its expected value with
functions of its module (`pipeline_dist._bubble`, `mesh2d._fsdp_rows`, `ddp_scratch._buckets`, a
copy of a blocked reference), and an answer that imports the module and calls one would pass
without computing anything.

`gate(package)` runs once, when the checks are imported: every function defined at the top of
a check module (`helpers/checks/*.py`, the harness's `_core` aside, the check bodies aside) gets
a gate's code in place of its own (the function object stays, so every binding of it, in any
module, reaches the gate). While no answer runs the gate calls the original at once; while one
runs, it calls it only for the check's own code (the first frame above it, past libraries and
the harness, is a check module's own code: whose.py), else refuses. The original code's keys
are blocked like references' (`KEYS`: guard.py refuses a copy exec'd, imported again or made
into a new function while an answer runs). A check module's classes (the nets a check hands the
answer, whose methods run inside it) are not gated.
"""
import os
import sys
import threading
import types

from .guard import _MARK, _state, refuse
from .references import code_key
from .whose import forwarding_code, genuine, reader_code

__all__ = ["gate", "KEYS"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_CHECKS_DIR = os.path.dirname(_HERE)
_DECLARE, _CARRIED = os.path.join(_HERE, "declare.py"), os.path.join(_HERE, "carried.py")
_WORLD = os.path.join(os.path.dirname(_CHECKS_DIR), "runtime", "thread_world.py")
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


def _checks_calling(frame):
    """True when the gated function is called by a check's own code: the first frame above it
    that is not a library's or the harness's is a check module's own code (not the reader's, not
    an answer's call in declare.py, not work submitted to an executor while an answer ran:
    carried.py); at the end of the stack, a World's rank (the runtime's thread world started
    it) or a thread not started while an answer ran (guard.py's mark)."""
    world = False
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
        if os.path.dirname(path) == _CHECKS_DIR and genuine(code):
            return True
        world = world or (path == _WORLD and genuine(code))
        frame = frame.f_back
    return world or not getattr(threading.current_thread(), _MARK, False)


def _make():
    """The gates' dispatcher, with the originals in its closure (no module attribute holds
    them)."""
    originals = {}     # key -> (name, a function of the original code)

    def through(key, args, kwargs):
        name, original = originals[key]
        if _state().armed() and not _checks_calling(sys._getframe(2)):
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
    from .run import REGISTRY
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
    import dis
    return dis.get_instructions(code)
