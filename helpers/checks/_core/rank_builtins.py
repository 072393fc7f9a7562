"""int(), float() and len() in the reader's code while a World runs: they keep the rank.

CPython turns the subclass an `__int__`, `__float__` or `__len__` returns back into a plain
number, so `int(t)`, `float(t)` and `len(t)` would drop the tag rank_numbers.py puts on what a
rank reads out of its own tensors (and `int(x)` the tag of a tagged number): a count read with
`int((dest == j).sum())` and left in a module global would reach another rank unseen. While a
World runs, the module the answer was defined in (its globals) sees stand-ins for these three
names: the builtin's result, tagged with the calling rank when its argument is a tensor and
with the argument's ranks when it carries some. Outside a rank's thread they are the builtins.
`isinstance(x, int)` and `issubclass` answer as for the builtin, numpy reads `dtype=int` as
before, and torch's factories, reductions and `Tensor.to`/`.type`/`.new_*` get the builtin back
(a torch function outside that list given `dtype=int` raises a TypeError naming the stand-in).

What it does not see: the reader's code in another module, and counts Python makes itself
(`list.count`, `collections.Counter`, `sum(1 for ...)`).
"""
import builtins
import contextlib
import threading
import types

import numpy as np
import torch

from . import rank_arrays
from .keys import drop_odd_keys, str_keys
from .parts import function_globals, module_name
from .rank_numbers import Tagged, TaggedInt, ranks_of
from .run import CheckFailed

__all__ = ["shadowing", "shadow"]

_LOCK = threading.Lock()
_PATCHED = {}          # id(globals) -> (globals, {name: what it held, or _MISSING})
_MISSING = object()
_ACTIVE = []


def _ranks(x, rank):
    if isinstance(x, torch.Tensor):
        return frozenset((rank,))
    if type(x) in (list, tuple) and x:
        return ranks_of(x[0])
    return ranks_of(x)


class _Same(type):
    """The stand-in's type: isinstance and issubclass answer as for the builtin."""

    def __instancecheck__(cls, x):
        return isinstance(x, cls._course_builtin)

    def __subclasscheck__(cls, t):
        return issubclass(t, cls._course_builtin)

    def __repr__(cls):
        return repr(cls._course_builtin)


def _tagged(builtin, tagged_type):
    def __new__(cls, *args, **kwargs):
        if cls is not stand_in:
            return builtin.__new__(cls, *args, **kwargs)       # a reader's subclass of it
        out = builtin(*args, **kwargs)
        rank = rank_arrays.current_rank()
        if rank is None or len(args) != 1 or kwargs or type(out) is not builtin:
            return out
        ranks = _ranks(args[0], rank)
        return tagged_type(out, ranks) if ranks else out
    stand_in = _Same(builtin.__name__, (builtin,), {
        "__new__": __new__, "_course_builtin": builtin, "dtype": np.dtype(builtin),
        "__module__": "builtins", "__doc__": builtin.__doc__})
    return stand_in


def _len(obj):
    n = builtins.len(obj)
    rank = rank_arrays.current_rank()
    if rank is None:
        return n
    ranks = _ranks(obj, rank)
    return TaggedInt(n, ranks) if ranks else n


STAND_INS = {"int": _tagged(builtins.int, TaggedInt), "float": _tagged(builtins.float, Tagged),
             "len": _len}
STAND_INS = types.MappingProxyType(STAND_INS)


_TORCH = ("tensor", "as_tensor", "asarray", "zeros", "ones", "empty", "full", "arange", "linspace",
          "zeros_like", "ones_like", "empty_like", "full_like", "rand", "randn", "randint",
          "randperm", "eye", "sum", "mean", "prod", "cumsum", "softmax", "log_softmax")
_METHODS = ("to", "type", "new_tensor", "new_zeros", "new_ones", "new_empty", "new_full", "sum",
            "mean", "prod", "cumsum", "softmax", "log_softmax")


def _builtin(x):
    return x._course_builtin if type(x) is _Same else x


def _dtype_builtins(fn):
    """`fn` with the stand-ins of int and float (dtype=int) handed to it as the builtins: torch's
    argument parser takes a Python type as a dtype only if it is the builtin itself."""
    def call(*args, **kwargs):
        if any(type(a) is _Same for a in args) or any(type(v) is _Same for v in kwargs.values()):
            args = [_builtin(a) for a in args]
            kwargs = {k: _builtin(v) for k, v in kwargs.items()}
        return fn(*args, **kwargs)
    call.__name__, call.__doc__ = fn.__name__, fn.__doc__     # no __wrapped__: not the original
    return call


_DTYPE_TAKERS = [(torch, name) for name in _TORCH] + [(torch.Tensor, name) for name in _METHODS]
_DTYPE_TAKERS = tuple(_DTYPE_TAKERS)


def shadow(fn, *, _PATCHED=_PATCHED, _ACTIVE=_ACTIVE):
    """While shadowing() is active: the stand-ins in the globals `fn` was defined in (not the
    course's or torch's, nor a name the module binds to something else than the builtin)."""
    if not _ACTIVE:
        return
    g = function_globals(fn)                  # read by type: no attribute of the reader's
    if g is None or module_name(g).startswith(("helpers", "torch")):
        return
    with _LOCK:
        if id(g) in _PATCHED or not _ACTIVE:
            return
        saved = {name: g.get(name, _MISSING) for name in STAND_INS}
        _PATCHED[id(g)] = g, saved
        for name, stand_in in STAND_INS.items():   # `int = builtins.int` is the builtin still
            if saved[name] is _MISSING or saved[name] is getattr(builtins, name):
                g[name] = stand_in


@contextlib.contextmanager
def shadowing(*, _PATCHED=_PATCHED, _ACTIVE=_ACTIVE):
    """For one World run: shadow() installs the stand-ins; they are removed at the end."""
    _ACTIVE.append(True)
    saved = [(owner, name, vars(owner).get(name, _MISSING)) for owner, name in _DTYPE_TAKERS]
    if len(_ACTIVE) == 1:
        for owner, name, _ in saved:
            setattr(owner, name, _dtype_builtins(getattr(owner, name)))
    odd = False
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE.pop()
            if not _ACTIVE:
                for owner, name, before in saved:
                    if before is _MISSING:
                        delattr(owner, name)
                    else:
                        setattr(owner, name, before)
                for g, saved in _PATCHED.values():
                    if not str_keys(g):         # a key the ranks added: taken out unlooked-up
                        drop_odd_keys(g)
                        odd = True
                    for name, before in saved.items():
                        if g.get(name) is not STAND_INS[name]:
                            continue
                        if before is _MISSING:
                            del g[name]
                        else:
                            g[name] = before
                _PATCHED.clear()
    if odd:
        raise CheckFailed(
            "your function's module globals were given a key that is not a str while the ranks "
            "ran: the check looks names up there after they end, which would run that key's "
            "code. Bind only names in your module")


del _PATCHED, _ACTIVE
