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

What it does not see: arrays reached another way (an attribute of an object, a module-level
object holding them), the methods of any array that are not ufuncs (`A[:k].cumsum()`,
`reshape`), indexing and `len`; numpy's other submodules (`numpy.random`, `numpy.fft`).
"""
import contextlib
import threading

import numpy as np
import numpy.lib.stride_tricks
import numpy.linalg
import numpy.ma
import torch

from .rank_arrays import _functions
from .run import expect

__all__ = ["numpy_work", "expect_list"]

_MODULES = (np, numpy.lib.stride_tricks, numpy.ma, numpy.linalg)
_NAMES = {m: _functions(m) for m in _MODULES}
_LOCK = threading.Lock()
_ACTIVE = []        # the lists of the numpy_work() blocks running now (innermost last)


def _arrays(x, depth=0):
    """Whether `x` is or holds an array numpy would compute on (a 0-d one is a number)."""
    if isinstance(x, np.ndarray):
        return x.ndim > 0
    if isinstance(x, (list, tuple, range)):
        return True
    if isinstance(x, dict) and depth == 0:
        return any(_arrays(v, 1) for v in x.values())
    return False


def _record(name):
    if _ACTIVE:
        _ACTIVE[-1].append(name)


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
    call.__name__, call.__doc__, call.__wrapped__ = fn.__name__, fn.__doc__, fn
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
    g = getattr(getattr(fn, "func", fn), "__globals__", None)
    if isinstance(g, dict) and not str(g.get("__name__", "")).startswith(("helpers", "numpy")):
        for n, v in list(g.items()):
            if n.startswith("__"):
                continue
            if isinstance(v, np.ndarray) and type(v) is np.ndarray and v.ndim > 0:
                saved.append((g, n, v))
                g[n] = v.view(_Seen)
            elif callable(v) and id(v) in stand_ins and stand_ins[id(v)] is not v:
                saved.append((g, n, v))
                g[n] = stand_ins[id(v)]
    for cell in getattr(getattr(fn, "func", fn), "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:          # a cell not filled yet
            continue
        if isinstance(v, np.ndarray) and type(v) is np.ndarray and v.ndim > 0:
            saved.append((_Cell(cell), "cell_contents", v))
            cell.cell_contents = v.view(_Seen)
    return saved


class _Cell:
    """A closure cell as a mapping, to put back what it held."""

    def __init__(self, cell):
        self._cell = cell

    def __setitem__(self, name, v):
        setattr(self._cell, name, v)


@contextlib.contextmanager
def numpy_work(fn=None):
    """While active: the numpy calls on arrays (their names, in order) in the list it yields;
    `fn`'s module sees the stand-ins too."""
    calls = []
    with _LOCK:
        _ACTIVE.append(calls)
        saved = _install(fn)
    try:
        yield calls
    finally:
        with _LOCK:
            for space, n, v in reversed(saved):
                space[n] = v
            _ACTIVE.remove(calls)


def expect_list(value, call, how):
    """Fail an answer that returned its sizes in a tensor or an array, naming it and the fix
    (before its torch or numpy work is judged: making the container is not the mistake)."""
    kind = ("a tensor" if isinstance(value, torch.Tensor) else
            "a numpy array" if isinstance(value, np.ndarray) and value.ndim else None)
    expect(kind is None, f"{call} returned {kind} ({value.tolist() if kind else ''}), expected "
                         f"a list of ints: build the list with arithmetic on the numbers ({how}), "
                         "no tensor or array")
