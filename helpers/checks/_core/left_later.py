"""What an answer leaves to run the reader's code later without being a callback (`left_later`):
an object whose death runs it (a `__del__` of the reader's class, a weakref's callback, a
suspended generator's `finally`), an exit function, a Python kernel for an operator; the
collector stays off while answers run so that what the call made stays young."""
import atexit
import contextlib
import gc
import itertools
import sys
import sysconfig
import threading
import types
import weakref

import torch

from .callbacks import _UNSEEN, _readers
from .guard import refuse
from .parts import class_attribute, function_closure, function_globals
from .run import CheckFailed, is_reader_code, stand_in

__all__ = ["left_later", "collector_back"]


_WINDOW = {"depth": 0, "gc": False, "library_exits": 0}
_WINDOW_LOCK = threading.Lock()
_READER_EXITS = []          # exit functions of the reader's registered through the stand-in
_KEPT = []                  # objects left by failed answers: kept alive, so they never run
_GENERATORS = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)
_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)
_AT_EXIT = atexit.register
_TORCH = torch.__file__.rsplit("/", 1)[0] + "/"
_STDLIB = sysconfig.get_paths()["stdlib"]
_DISPATCH = torch._C._DispatchModule         # what every torch.library registration goes through
_KERNELS = types.MappingProxyType({n: vars(_DISPATCH)[n] for n in (
    "impl", "impl_t_t", "impl_with_aoti_compile", "fallback") if n in vars(_DISPATCH)})


@stand_in(_AT_EXIT)
def _register_at_exit(func, *args, **kwargs):
    _note_exit(func, _readers((func, *args, *kwargs.values())))
    return _AT_EXIT(func, *args, **kwargs)


def _note_exit(func, readers, *, _WINDOW=_WINDOW, _READER_EXITS=_READER_EXITS):
    """An exit function registered, the reader's or a library's (no parameter of the stand-in,
    whose keywords are its caller's)."""
    if readers:
        _READER_EXITS.append(func)
    else:
        _WINDOW["library_exits"] += 1


def _from_reader(values):
    """Whether a registration is the reader's: one of `values` is, or the first caller past
    torch and the standard library is the reader's code."""
    if _readers(values):
        return True
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith((_TORCH, __file__)) or (
            frame.f_code.co_filename.startswith(_STDLIB)
            and "-packages" not in frame.f_code.co_filename)):
        frame = frame.f_back
    return frame is not None and is_reader_code(frame.f_code.co_filename)


def _kernel_stand_in(name, method):
    @stand_in(method)
    def register(self, *args, **kwargs):
        if _from_reader((*args, *kwargs.values())):
            op = next((a for a in args if isinstance(a, str)), name)
            refuse(f"your code registers a kernel of its own for an operator ({op}, "
                   "torch.library): it would run your code inside torch's operations, unseen "
                   "by the check and after your function returned. Run torch's own operations")
        return method.__get__(self, _DISPATCH)(*args, **kwargs)
    return register


_KERNEL_STAND_INS = types.MappingProxyType(
    {name: _kernel_stand_in(name, m) for name, m in _KERNELS.items()})


def _kind(cls, kinds):
    """What an object of `cls` runs when it dies, if it may be the reader's code (`kinds`: the
    window's cache, class -> kind, None: nothing)."""
    plain = type(cls) is type      # a metaclass's __hash__ or __getattribute__ never runs
    kind = kinds.get(cls, _UNSEEN) if plain else _UNSEEN
    if kind is _UNSEEN:
        if issubclass(cls, weakref.ref):
            kind = "a weakref's callback"
        elif any(cls is c for c in _PROXIES):
            kind = "a weakref proxy's callback"
        elif any(cls is c for c in _GENERATORS):
            kind = "a suspended generator"
        else:
            finalizer = class_attribute(cls, "__del__")
            kind = "a __del__" if finalizer is not None and _readers((finalizer,)) else None
        if plain:
            kinds[cls] = kind
    return kind



def _runs_later(obj, kind):
    """Whether `obj` (of `kind`) would run the reader's code when it dies."""
    if kind == "a weakref's callback":
        return obj() is not None and _readers((obj.__callback__,))
    if kind == "a weakref proxy's callback":
        return _readers(gc.get_referents(obj))
    if kind == "a suspended generator":
        code = getattr(obj, "gi_code", None) or getattr(obj, "cr_code", None) or getattr(
            obj, "ag_code", None)
        return bool(getattr(obj, "gi_suspended", getattr(obj, "cr_suspended", False))) and \
            code is not None and is_reader_code(code.co_filename) and bool(code.co_exceptiontable)
    return kind is not None


def _young(kinds):
    """{id: (object, kind)} of the young objects (those made since the last collection: with the
    collector off while answers run, all they made) that may run code when they die. The list of
    them lives only inside one call of C code, no bytecode of ours between (a tuple another thread
    is building fails to grow while another reference to it is held, and a thread switch comes
    only between bytecodes): classes first seen are judged in between."""
    new = set(map(type, _listed())) - kinds.keys()
    for cls in new:
        _kind(cls, kinds)
    picked = list(itertools.compress(*_picked(kinds)))
    return {id(o): (o, kinds[type(o)]) for o in picked}


def _picked(kinds):
    """The young objects and whether each may run code when it dies, both listed only when
    iterated."""
    objs, again = itertools.tee(_listed())
    return objs, map(kinds.get, map(type, again))


def _listed():
    """gc's young objects, listed only when iterated: the list is made and let go inside the C
    call that consumes it."""
    return itertools.chain.from_iterable(map(gc.get_objects, (0,)))


def _reachable(fn, args, kinds):
    """{id: (object, kind)} of what the answer's module, closure and arguments hold (three levels
    down): where an object it made lives after a collection it set off moved it out of the young
    objects."""
    found, seen = {}, set()
    stack = [(v, 3) for v in (function_globals(fn) or {}, *(
        c.cell_contents for c in function_closure(fn) if _cell(c)), *args)]
    while stack and len(seen) < 20000:
        obj, depth = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        cls = type(obj)
        kind = _kind(cls, kinds)
        if kind is not None:
            found[id(obj)] = (obj, kind)
        if not depth or issubclass(cls, (str, bytes, int, float, types.ModuleType, type)):
            continue
        # read by the base types' own methods and the collector's referents: a container or
        # an object of the reader's class runs none of its code here (after the call)
        if issubclass(cls, dict):
            stack.extend((v, depth - 1) for v in list(dict.values(obj)))
        elif issubclass(cls, (list, tuple, set, frozenset)):
            stack.extend((v, depth - 1) for v in list(gc.get_referents(obj)))
        elif not callable(obj):
            stack.extend((v, depth - 1) for v in gc.get_referents(obj) if type(v) is dict)
    return found


def _cell(cell):
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True


def _collections():
    return sum(s["collections"] for s in gc.get_stats())


def _open(scan, *, _WINDOW=_WINDOW, _READER_EXITS=_READER_EXITS):
    """The first answer of those running at once notes what is young (`scan`: not in a World,
    whose ranks run the check's code beside it: listing the young objects while another thread
    builds a tuple fails that thread) and the exit functions, and puts the stand-ins in. It
    returns (to the first answer alone) its own copy of what it noted, which no module holds:
    `_WINDOW` is reachable from the answer, which could add its objects to the young ones or
    mark its class as running nothing when its objects die, and restore it before returning."""
    mine = None
    with _WINDOW_LOCK:
        if _WINDOW["depth"] == 0:
            kinds = {}                 # a new cache: a class may have gained a __del__ since
            _WINDOW["gc"], _WINDOW["scan"] = gc.isenabled(), scan
            if scan:
                gc.disable()           # what the calls make stays young, where _young finds it
            atexit.register = _register_at_exit
            for name, stand in _KERNEL_STAND_INS.items():
                setattr(_DISPATCH, name, stand)
            _WINDOW.update(young=_young(kinds) if scan else {}, runs=_collections(),
                           exits=atexit._ncallbacks(), library=_WINDOW["library_exits"],
                           readers=len(_READER_EXITS), kinds=kinds)
            mine = dict(_WINDOW, kinds=dict(kinds), young=dict(_WINDOW["young"]))
        _WINDOW["depth"] += 1
    return mine


def _close(fn, args, mine, *, _WINDOW=_WINDOW, _READER_EXITS=_READER_EXITS):
    """The last answer of those running at once judges what they all left (while another still
    ran, its objects would be taken for this one's): (objects left, exit functions left), by
    what the first noted (`mine`, when it is this one: its own copy)."""
    with _WINDOW_LOCK:
        _WINDOW["depth"] -= 1
        if _WINDOW["depth"]:
            return [], 0
        noted = mine if mine is not None else dict(_WINDOW, kinds=dict(_WINDOW["kinds"] or {}))
        kinds = noted["kinds"]
        try:
            found = _young(kinds) if noted["scan"] else {}
            if noted["scan"] and _collections() != noted["runs"]:
                found.update(_reachable(fn, args, kinds))
            left = [(o, k) for i, (o, k) in found.items()
                    if i not in noted["young"] and _runs_later(o, k)]
            _KEPT.extend(o for o, _ in left)     # a weakref's referent too: it never dies
            _KEPT.extend(o() for o, k in left if k == "a weakref's callback")
            readers = _READER_EXITS[noted["readers"]:]
            del _READER_EXITS[noted["readers"]:]
            exits = atexit._ncallbacks() - noted["exits"] - (
                _WINDOW["library_exits"] - noted["library"])
            for f in readers:
                atexit.unregister(f)
        finally:
            _WINDOW["young"] = _WINDOW["kinds"] = None
            atexit.register = _AT_EXIT
            for name, method in _KERNELS.items():
                setattr(_DISPATCH, name, method)
            _WINDOW["gc_back"] = noted["gc"] and noted["scan"]
        return left, exits


def collector_back(*, _WINDOW=_WINDOW):
    """The collector on again once no answer runs, after the callbacks they left were judged and
    put back (a collection between would run a gc callback of the reader's)."""
    with _WINDOW_LOCK:
        if _WINDOW["depth"] == 0 and _WINDOW.get("gc_back"):
            _WINDOW["gc_back"] = False
            gc.enable()


@contextlib.contextmanager
def left_later(name, fn, args, world=False):
    """Fail an answer that leaves something to run its code later, after the check compared:
    an object it made whose death runs the reader's code (kept alive from then on, so it never
    runs), an exit function (one of the reader's is unregistered). A Python kernel for an
    operator is refused when registered (by the stand-ins of torch.library's registrations)."""
    mine = _open(not world)
    returned = False
    try:
        yield
        returned = True
    finally:
        left, exits = _close(fn, args, mine)
    if returned and left:
        obj, kind = left[0]
        raise CheckFailed(
            f"{name} left an object that would run your code later, when it is collected "
            f"({kind}: {type(obj).__name__}), after your function returned, while the check "
            "judges it (it is kept alive). Compute the result inside your function, and leave "
            "nothing that runs your code when it dies")
    if returned and exits > 0:
        raise CheckFailed(
            f"{name} registered a function to run at exit (atexit.register): it would run your "
            "code after the check judged it. Compute the result inside your function, and leave "
            "nothing that runs later")


del _WINDOW, _READER_EXITS
