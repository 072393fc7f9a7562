"""numpy and Python's math between thread ranks: a rank may compute on its own numbers only.

rank_numbers.py tags the numbers a rank reads out of its own tensors. This module follows them
into numpy and into the functions that turn many numbers into one (math.fsum, statistics.mean),
where a tag would otherwise be lost, for one run of a World:

- `.numpy()` and `np.asarray(t)` (`__array__`) of a rank's own tensor return a `RankArray`, an
  ndarray that carries the rank; numpy's operations on it (ufuncs, the functions numpy lets an
  array override, indexing, `.tolist()`, `.item()`) keep the rank on what they return;
- while the World runs, every function of the `numpy`, `math` and `statistics` namespaces is
  watched: called from a rank, it looks through its arguments (lists, tuples, dicts, tensors)
  for numbers or arrays tagged with another rank and fails the answer if it finds one, and tags
  what it returns with the calling rank when it was handed that rank's numbers or tensors; a
  RankArray of another rank fails the same way whatever reads it (an operator, a method, an
  index, iteration, printing, copying or pickling);
- the numpy views of tensors a rank gets (`.numpy()`, `np.asarray(t)`, `np.from_dlpack(t)`) are
  read-only (`read_only`): a write through one would change the tensor with no torch operation
  for provenance.py to see.

So an all-reduce done in numpy on the other ranks' copies fails where the other rank's array
meets numpy, before any arithmetic, and a count read out with `.item()` or `.tolist()` fails
where another rank hands it to torch, to the comm (a recv's shape) or returns it.

What it does not see (book/teachers.md): conversions Python makes exact (`int(t)`, `len(t)`,
`float(x)`, `int(x)`: CPython turns a subclass back into a plain number), text and bytes
(`str`, `tobytes`, `memoryview`), `ndarray.view(np.ndarray)`, names bound before the run
(`from numpy import sum`), and an integer that only steers Python (a loop count, a comparison).
"""
import contextlib
import functools
import math
import statistics
import types
from collections.abc import Iterator

import numpy as np
import torch
import torch.utils.dlpack

from .rank_numbers import Tagged, TaggedInt, foreign_message, ranks_of, retag
from .run import CheckFailed

__all__ = ["RankArray", "watch_numbers", "own_array", "read_only"]

_WHO = []       # while a World runs: a function giving the calling thread's rank (None: none)


def current_rank(*, _WHO=_WHO):
    """The calling thread's rank while a World runs, else None."""
    return _WHO[-1]() if _WHO else None


def _ranks_in(x, rank, depth=0):
    """The ranks the numbers and arrays in `x` carry; a tensor counts as the calling rank's
    (provenance.py refuses another rank's)."""
    if isinstance(x, (Tagged, TaggedInt, np.ndarray, slice)):
        return ranks_of(x)
    if type(x) in (float, int, bool, str, type(None)):
        return frozenset()
    if isinstance(x, torch.Tensor):
        return frozenset((rank,))
    if depth < 8 and isinstance(x, (list, tuple, dict, set, frozenset)):
        found = set()
        for v in (x.values() if isinstance(x, dict) else x):
            if type(v) is float or type(v) is int:
                continue
            found |= _ranks_in(v, rank, depth + 1)
        return frozenset(found)
    return frozenset()


def _refuse(rank, tree, how):
    """The ranks in `tree`: fail if one is not the calling rank's."""
    ranks = _ranks_in(tree, rank)
    if rank is not None and ranks - {rank}:
        raise CheckFailed(foreign_message(rank, ranks - {rank}, how))
    return ranks


def mark(out, ranks):
    """`out` (arrays, numbers, tuples of them) tagged with `ranks`."""
    if not ranks:
        return out
    if isinstance(out, np.ndarray):
        out = out.view(RankArray)
        out.ranks = frozenset(ranks)
        return out
    if type(out) in (tuple, list):
        return type(out)(mark(v, ranks) for v in out)
    return retag(out, ranks)


def _plain(x):
    if isinstance(x, RankArray):
        return x.view(np.ndarray)
    if isinstance(x, Tagged):
        return float(x)
    if isinstance(x, TaggedInt):
        return int(x)
    if type(x) in (tuple, list):
        return type(x)(_plain(v) for v in x)
    if type(x) is dict:
        return {k: _plain(v) for k, v in x.items()}
    return x


class RankArray(np.ndarray):
    """A numpy array made from rank `ranks`' own tensors (see the module's docstring)."""

    ranks = frozenset()

    def __array_finalize__(self, obj):
        self.ranks = getattr(obj, "ranks", frozenset())

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        ranks = _refuse(current_rank(), (inputs, kwargs),
                        f"computed with numpy's {ufunc.__name__} on")
        return mark(getattr(ufunc, method)(*_plain(inputs), **_plain(kwargs)), ranks)

    def __array_function__(self, func, types_, args, kwargs):
        ranks = _refuse(current_rank(), (args, kwargs), f"computed with numpy's {func.__name__} on")
        return mark(func(*_plain(args), **_plain(kwargs)), ranks)

    def _read(self, how):
        _refuse(current_rank(), self, how)
        return self.view(np.ndarray)

    def __getitem__(self, index):
        return mark(self._read("indexed").__getitem__(index), self.ranks)

    def __iter__(self):
        ranks = self.ranks
        return (mark(v, ranks) for v in self._read("iterated"))

    def __setitem__(self, index, value):
        if not self.flags.writeable:
            raise CheckFailed(_READ_ONLY.format(current_rank()))
        super().__setitem__(index, value)

    def tolist(self):
        return mark(self._read("listed").tolist(), self.ranks)

    def item(self, *args):
        return mark(self._read("read").item(*args), self.ranks)


def _reader(name):
    def method(self, *args, **kwargs):
        return getattr(self._read(f"read ({name})"), name)(*args, **kwargs)
    method.__name__ = name
    return method


for _name in ("__repr__", "__str__", "__format__", "__float__", "__int__",
              "__index__", "__bool__", "__reduce__", "__reduce_ex__", "__copy__", "__deepcopy__",
              "tobytes", "tofile", "dump", "dumps", "__dlpack__", "__array__"):
    setattr(RankArray, _name, _reader(_name))


def _plain_reader(name):
    def method(self, *args, **kwargs):
        _refuse(current_rank(), self, f"read (.{name})")
        return getattr(np.ndarray, name)(self, *args, **kwargs)
    method.__name__ = name
    return method


RankArray.view = _plain_reader("view")           # view(np.ndarray) would drop the rank
for _name in ("flat", "base", "data", "ctypes", "__array_interface__"):
    setattr(RankArray, _name, property(functools.partial(
        lambda name, self: (_refuse(current_rank(), self, f"read (.{name})"),
                            getattr(super(RankArray, self), name))[1], _name)))


def _number_ufunc(self, ufunc, method, *inputs, **kwargs):
    """A tagged number meeting numpy (np.float32(2) * x, np.ones(3) * x): as a RankArray."""
    return RankArray.__array_ufunc__(self, ufunc, method, *inputs, **kwargs)


Tagged.__array_ufunc__ = TaggedInt.__array_ufunc__ = _number_ufunc


_READ_ONLY = (
    "rank {} wrote into a tensor through a numpy view of it (t.numpy()[...] = ..., np.copyto, "
    "out=): while ranks run, the numpy views of tensors are read-only, since a write through one "
    "changes the tensor with no torch operation to see; write with torch (t.copy_(...), "
    "t[...] = ...)")


def read_only(out):
    """`out`, a numpy view of a tensor's memory handed to a rank, made read-only (for good:
    numpy refuses to make writeable again an array whose memory belongs to a tensor)."""
    if isinstance(out, np.ndarray) and out.base is not None:
        out.flags.writeable = False
    return out


def own_array(out, rank):
    """What `.numpy()` or `__array__` returned to rank `rank`, carrying the rank."""
    return mark(out, (rank,)) if isinstance(out, np.ndarray) and rank is not None else out


def _watched(fn, module, keep=True):
    """`fn`, refusing another rank's numbers; its result tagged with the caller's (`keep`)."""
    drain = module != "numpy" or fn.__name__ == "fromiter"   # iterables of numbers, consumed

    def call(*args, **kwargs):
        rank = current_rank()
        if rank is None:
            return fn(*args, **kwargs)
        if drain:
            args = [list(a) if isinstance(a, Iterator) and not isinstance(
                a, (np.ndarray, torch.Tensor)) else a for a in args]
        ranks = _refuse(rank, (args, kwargs), f"computed with {module}.{fn.__name__} on")
        out = fn(*_plain(args), **_plain(kwargs))
        if fn.__name__ == "from_dlpack" and module == "numpy":
            out = read_only(out)                # a view of the tensor's memory, as .numpy()
        return mark(out, ranks) if keep else out
    call.__name__, call.__doc__ = fn.__name__, fn.__doc__     # no __wrapped__: not the original
    return call


def _functions(module):
    """The names of `module`'s functions (numpy's ufuncs included), not its classes."""
    return [name for name, v in vars(module).items() if not name.startswith("_") and (
        isinstance(v, (types.FunctionType, types.BuiltinFunctionType, np.ufunc))
        or type(v).__name__ == "_ArrayFunctionDispatcher")]


_NAMES = types.MappingProxyType({m: tuple(_functions(m)) for m in (np, math, statistics)})
_INTO_TORCH = {torch: ("from_numpy", "frombuffer", "from_dlpack"),   # no torch function to watch
               torch.utils.dlpack: ("from_dlpack",)}
_INTO_TORCH = types.MappingProxyType(_INTO_TORCH)


class _Ufunc:
    """A ufunc's stand-in in numpy's namespace: its methods (reduce, accumulate ...) watched."""

    def __init__(self, ufunc):
        self._ufunc, self._call = ufunc, _watched(ufunc, "numpy")

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        v = getattr(self._ufunc, name)
        return _watched(v, f"numpy.{self._ufunc.__name__}") if callable(v) else v


_MADE = {}      # (module, name) -> (the function, its stand-in): made once, installed per run


def _stand_in(module, name, f, *, _MADE=_MADE):
    made = _MADE.get((module, name))
    if made is None or made[0] is not f:
        made = _MADE[(module, name)] = f, (_Ufunc(f) if isinstance(f, np.ufunc) else _watched(
            f, module.__name__, keep=module not in _INTO_TORCH))
    return made[1]


@contextlib.contextmanager
def watch_numbers(rank_of, *, _WHO=_WHO):
    """While active: `rank_of()` names the calling thread's rank (None: not a rank, or the
    network's own work), and the namespaces above are watched."""
    _WHO.append(rank_of)
    saved = {m: {n: vars(m)[n] for n in names} for m, names in _NAMES.items()}
    saved.update({m: {n: vars(m)[n] for n in names} for m, names in _INTO_TORCH.items()})
    try:
        if len(_WHO) == 1:
            for m, functions in saved.items():
                for n, f in functions.items():
                    setattr(m, n, _stand_in(m, n, f))
        yield
    finally:
        _WHO.pop()
        if not _WHO:
            for m, functions in saved.items():
                for n, f in functions.items():
                    setattr(m, n, f)


del _WHO, _MADE
