"""numpy work while an answer runs: the Recorder's counterpart for arrays outside torch.

A check that refuses torch work (the shard sizes must come from arithmetic, not from a tensor
split and measured) would let the same work through in numpy, which no aten operation sees. While
`numpy_work(fn)` is active, every function of numpy's namespaces (`numpy`, `numpy.lib`'s
`stride_tricks`, `numpy.ma`, `numpy.linalg`; ufuncs and their methods, `reduce`, `accumulate`
...) that is handed an array (an ndarray that is not 0-d, a list, a tuple, a range) or returns
one is recorded by name, from any thread; so are the names the answer's module bound to them
before the run (`from numpy import array_split`) and the ufuncs and array functions run on the
arrays that module holds (`A[:k] < r`, `np.diff(A)`: its ndarrays are seen through a view while
the answer runs), and those its closure holds. numpy on numbers alone (`np.int64(n) // k`,
`np.ceil(n / k)`) is arithmetic and is not recorded.

Methods are seen from below: while the answer runs inside it (c_calls_watched) a profile
function (`sys.setprofile`, and `threading.setprofile` for the threads the answer starts) sees
every call the reader's code makes into C, with the object it is bound to, so a method of an
array (`A[:k].cumsum()`, `reshape`, `.sum()`, `np.ndarray.cumsum(A)` unbound) or of a ufunc,
and a C function of numpy's own modules, are recorded however the array or the function was
reached. Arrays that objects of the answer's module hold (an attribute, a dict or list entry,
two levels down) are seen through a view, like its globals, so an operator on one
(`H.A[:k] < r`) is recorded too.

What it does not see: operators on an array the answer reached another way (a module it
imports), indexing, `len` and Python's builtins run over an array (`sum(A)`); numpy's other
submodules (`numpy.random`, `numpy.fft`); threads started before the run; C extensions.
"""
import contextlib
import itertools
import sys
import threading
import time
import types

import numpy as np
import numpy.lib.stride_tricks
import numpy.linalg
import numpy.ma
import torch

from .guard import armed, note_refusal
from .keys import plain_keys, str_keys
from .parts import _CLASS_DICT, function_closure, function_globals, module_name
from .rank_arrays import _functions
from .run import CheckFailed, expect, is_reader_code
from .settle import reader_class

__all__ = ["numpy_work", "c_calls_watched", "expect_list"]

_MODULES = (np, numpy.lib.stride_tricks, numpy.ma, numpy.linalg)
_NAMES = types.MappingProxyType({m: tuple(_functions(m)) for m in _MODULES})
_LOCK = threading.Lock()
_ACTIVE = []        # the lists of the numpy_work() blocks running now (innermost last)
# every record ticks, and every block counts the ticks it saw (bound as defaults, which guard.py
# keeps while an answer runs): a block whose list holds fewer was emptied (the answer reaches
# `_ACTIVE` by a built name) and fails
_TICK, _OPENED = itertools.count().__next__, itertools.count().__next__
_EMPTIED = ("your code emptied the check's record of its numpy calls (numpy_work): an answer "
            "computes, it leaves the grader be")


def _arrays(x, depth=0):
    """Whether `x` is or holds an array numpy would compute on (a 0-d one is a number)."""
    if isinstance(x, np.ndarray):
        return x.ndim > 0
    if isinstance(x, (list, tuple, range)):
        return True
    if isinstance(x, dict) and depth == 0:
        return any(_arrays(v, 1) for v in x.values())
    return False


def _record(name, _tick=_TICK):
    _tick()
    if _ACTIVE:
        _ACTIVE[-1].append(name)
    elif armed():      # the recorders are in only while a block runs: the answer emptied it
        note_refusal(_EMPTIED)


def _note(name, args, kwargs, out):
    """Record `name` if it was handed an array or returned one (numbers alone are arithmetic)."""
    if (any(_arrays(a, 1) for a in args) or _arrays(kwargs) or _array_out(out)
            or isinstance(out, (list, tuple)) and any(_array_out(o) for o in out)):
        _record(name)


def _array_out(x):
    return isinstance(x, np.ndarray) and x.ndim > 0


def _watched(fn, name):
    def call(*args, **kwargs):
        out = fn(*args, **kwargs)
        _note(name, args, kwargs, out)
        return out
    call.__name__, call.__doc__ = fn.__name__, fn.__doc__     # no __wrapped__: not the original
    return call


class _Ufunc:
    """A ufunc's stand-in: calling it and its methods (reduce, accumulate, at ...) recorded."""

    def __init__(self, ufunc, name):
        self._ufunc, self._name, self._call = ufunc, name, _watched(ufunc, name)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, attr):
        v = getattr(self._ufunc, attr)
        return _watched(v, f"{self._name}.{attr}") if callable(v) else v


class _Seen(np.ndarray):
    """A view of an array the answer's module holds: ufuncs and array functions on it recorded."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _record(f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}"))
        inputs = [i.view(np.ndarray) if isinstance(i, _Seen) else i for i in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, _Seen) else o
                                  for o in kwargs["out"])
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        _record(f"numpy.{func.__name__}")
        return super().__array_function__(func, types_, args, kwargs)


_NUMBER_METHODS = frozenset({"item", "tolist", "astype", "conjugate", "conj", "round", "is_integer",
                   "as_integer_ratio", "bit_count", "__round__", "__format__", "__index__",
                   "__int__", "__float__", "__bool__", "__reduce__", "__reduce_ex__"})


def _profile(frame, event, arg):
    """A call the reader's code makes into C: recorded if bound to an array (not 0-d), a ufunc,
    one of numpy's modules, or a numpy number's method that is not arithmetic (`.repeat(k)`)."""
    if event != "c_call" or not is_reader_code(frame.f_code.co_filename):
        return
    owner = getattr(arg, "__self__", None)
    if isinstance(owner, np.ndarray) and owner.ndim > 0:
        _record(f"ndarray.{arg.__name__}")
    elif isinstance(owner, np.generic) and arg.__name__ not in _NUMBER_METHODS:
        _record(f"{type(owner).__name__}.{arg.__name__}")     # np.int64(q).repeat(k): an array
    elif isinstance(owner, np.ufunc):
        _record(f"numpy.{owner.__name__}.{arg.__name__}")
    elif isinstance(owner, types.ModuleType) and owner.__name__.split(".")[0] == "numpy":
        _record(f"{owner.__name__}.{arg.__name__}")


def _stand_in(module, name, f):
    label = f"numpy.{name}" if module is np else f"{module.__name__}.{name}"
    return _Ufunc(f, label) if isinstance(f, np.ufunc) else _watched(f, label)


def _install(fn):
    """Stand-ins in numpy's namespaces and the answer's module; what to put back."""
    saved, stand_ins = [], {}
    for m, names in _NAMES.items():
        for n in names:
            f = vars(m)[n]
            stand_ins.setdefault(id(f), _stand_in(m, n, f))
            saved.append((vars(m), n, f))
            setattr(m, n, stand_ins[id(f)])
    g = function_globals(fn)
    if g is not None and not module_name(g).startswith(("helpers", "numpy")):
        for n, v in list(g.items()):
            if n.startswith("__"):
                continue
            if _plain_array(v):
                saved.append((g, n, v))
                g[n] = v.view(_Seen)
            elif callable(v) and id(v) in stand_ins and stand_ins[id(v)] is not v:
                saved.append((g, n, v))
                g[n] = stand_ins[id(v)]
            else:
                _held(v, saved)
    for cell in function_closure(fn):
        try:
            v = cell.cell_contents
        except ValueError:          # a cell not filled yet
            continue
        if _plain_array(v):
            saved.append((_Cell(cell), "cell_contents", v))
            cell.cell_contents = v.view(_Seen)
        else:
            _held(v, saved)
    return saved


def _plain_array(v):
    return type(v) is np.ndarray and v.ndim > 0      # (no `__class__` of the reader's read)


_ODD = object()     # a dict whose keys the harness does not look up (keys.plain_keys)
_ODD_KEYS = ("your module holds an array in a dict keyed by objects that are not names or "
             "numbers: the check watches the arrays your module holds and cannot reach that one. "
             "Key the dict by strs or ints")


def _held(holder, saved, depth=0):
    """The arrays an object of the answer's module holds (its attributes, a dict's or a list's
    entries; two levels down) replaced by views that record the ufuncs run on them. Read by
    exact types, through the base types' own methods: a dict subclass's `items`, a
    `__getattribute__` or a key's `__eq__` of the reader's would run its code here, in the
    check body. One whose keys are not names or numbers is not written (a lookup would run a
    key's `__eq__`): holding an array there fails the answer."""
    cls = type(holder)
    if cls is dict:
        space, items = (holder if plain_keys(holder) else _ODD), dict.items(holder)
    elif cls is list:
        space, items = holder, enumerate(holder)
    elif issubclass(cls, type) and reader_class(holder):
        held = _CLASS_DICT(holder)
        space, items = (_Attr(holder) if str_keys(held) else _ODD), held.items()
    elif cls is types.SimpleNamespace or reader_class(cls):
        try:
            space = object.__getattribute__(holder, "__dict__")
        except (AttributeError, TypeError):     # no instance dict (slots)
            return
        if type(space) is not dict:
            return
        space, items = (space if plain_keys(space) else _ODD), dict.items(space)
    else:
        return
    for n, v in list(items):
        if _plain_array(v) and space is _ODD:       # (none of its keys is looked up)
            saved.append((_ODD, n, v))
        elif _plain_array(v):
            try:
                space[n] = v.view(_Seen)
            except (AttributeError, TypeError):     # a read-only attribute, an enum's member
                continue
            saved.append((space, n, v))
        elif depth < 1 and not (type(n) is str and n.startswith("__")):
            _held(v, saved, depth + 1)


class _Attr:
    """A class's attributes as a mapping, to put its arrays back (type's own setattr: no
    metaclass of the reader's runs)."""

    def __init__(self, obj):
        self._obj = obj

    def __setitem__(self, name, v):
        type.__setattr__(self._obj, name, v)


class _Cell:
    """A closure cell as a mapping, to put back what it held."""

    def __init__(self, cell):
        self._cell = cell

    def __setitem__(self, name, v):
        setattr(self._cell, name, v)


@contextlib.contextmanager
def numpy_work(fn=None, *, _tick=_TICK, _opened=_OPENED):
    """While active: the numpy calls on arrays (their names, in order) in the list it yields;
    `fn`'s module sees the stand-ins too."""
    calls = []
    with _LOCK:
        _ACTIVE.append(calls)
        saved = _install(fn)
        opened, ticked = _opened(), _tick()
    try:
        expect(not any(space is _ODD for space, _, _ in saved), _ODD_KEYS)
        yield calls
    finally:
        with _LOCK:
            plain = {}      # id(namespace) -> plain_keys, read once per namespace: a key the
            for space, n, v in reversed(saved):         # loop writes back is a str
                if space is _ODD:
                    continue
                if type(space) is dict and id(space) not in plain:
                    plain[id(space)] = plain_keys(space)
                if type(space) is not dict or plain[id(space)]:
                    space[n] = v    # (a key the call added: its `__eq__` would run; it fails)
            _ACTIVE[:] = [c for c in _ACTIVE if c is not calls]
            ticks, others = _tick() - ticked - 1, _opened() - opened - 1
    if not others and len(calls) < ticks:       # (a block inside this one has its own ticks)
        raise CheckFailed(_EMPTIED)


@contextlib.contextmanager
def c_calls_watched():
    """The profile function on while a numpy_work() block is active: around the reader's call
    (declare.Answer), not the whole block, so that the harness's own scans before and after the
    call (every key of every namespace) run without a Python hook on each of their C calls. The
    threads the answer starts get it too (threading.setprofile)."""
    if not _ACTIVE:
        yield
        return
    profiles = sys.getprofile(), threading.getprofile()
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    try:
        yield
    finally:
        threading.setprofile(profiles[1])   # first: a thread that starts now gets the old one
        _set_profile(profiles[0])


def _set_profile(fn, tries=1000):
    """sys.setprofile(fn), tried again while a thread the answer left starting installs its own
    (CPython refuses two installs at once: "another profile function is being installed")."""
    for _ in range(tries - 1):
        try:
            sys.setprofile(fn)
            return
        except RuntimeError:
            time.sleep(0.001)
    sys.setprofile(fn)


def expect_list(value, call, how):
    """Fail an answer that returned its sizes in a tensor or an array, naming it and the fix
    (before its torch or numpy work is judged: making the container is not the mistake)."""
    kind = ("a tensor" if isinstance(value, torch.Tensor) else
            "a numpy array" if isinstance(value, np.ndarray) and value.ndim else None)
    expect(kind is None, f"{call} returned {kind} ({value.tolist() if kind else ''}), expected "
                         f"a list of ints: build the list with arithmetic on the numbers ({how}), "
                         "no tensor or array")
