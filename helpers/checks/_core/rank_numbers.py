"""Python numbers between thread ranks: a number one rank read out of its own tensors may not
reach another rank except through the comm.

provenance.py refuses a rank that touches another rank's tensor. A rank can also turn its own
tensor into Python numbers (`.item()`, `float(t)`, `.tolist()`, `.numpy()`, `.shape`) and leave
them in a module global, a closure or a class attribute, where another rank reads them after a
decoy collective. Two marks follow such numbers, for one run of a World:

- a tag: in a rank, `.item()` and `.tolist()` of its own tensors return floats and integers that
  carry the rank (`Tagged`, `TaggedInt`), and so do the sizes it reads (`.size()`, `.shape`,
  `.numel()`: `TagWatch`) and numpy's results on its arrays (rank_arrays.py); Python arithmetic
  keeps the tags of every operand (`sum(...)` over the ranks' numbers carries them all). A torch
  call of rank B whose arguments hold a number tagged with another rank (a scalar, a size, a
  slice) fails (`TagWatch`, a TorchFunctionMode), and so do a recv sized by one (world.py), a
  numpy or math function handed one (rank_arrays.py) and a rank's result that holds one;
- a fingerprint: every floating value a rank reads out (the exits above, numpy and the others of
  exits.py included), every integer beyond ROUND_INT in size, and the floats under an integer
  view of a float tensor (provenance.py) are kept; a rank that puts into torch (a Python scalar
  argument, a tensor made from Python or numpy data, integers viewed as floats) or returns a
  value that only other ranks read out fails. Round values (integral floats, multiples of
  1/4096, integers below ROUND_INT) are too common to mean anything and are left out.

What it does not see (book/teachers.md names the limit): numbers Python makes plain again
(`int(t)`, `float(t)`, `len(t)`, `int(x)`, `float(x)`, `hash(x)`, an unbound `int.__add__`:
CPython turns the subclass an `__int__` or `__len__` returns back into a plain number) when
they are round, counts Python makes (`list.count`,
`collections.Counter`), text and bytes (`str`, pickling), each changed by arithmetic before it
reaches the other rank; an integer that only steers Python (a loop count, a comparison).
"""
import math

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

from .parts import base_items, own_dict
from .run import CheckFailed

__all__ = ["Tagged", "TaggedInt", "TagWatch", "tag", "retag", "ranks_of", "is_round",
           "foreign_message"]


class Tagged(float):
    """A float a rank read out of its own tensor: arithmetic keeps the ranks it came from."""

    def __new__(cls, value, ranks):
        obj = super().__new__(cls, value)
        obj.ranks = frozenset(ranks)
        return obj

    def __reduce__(self):
        return float, (float(self),)


class TaggedInt(int):
    """An integer a rank read out of its own tensor (a count, a size): as Tagged."""

    def __new__(cls, value, ranks):
        obj = super().__new__(cls, value)
        obj.ranks = frozenset(ranks)
        return obj

    def __reduce__(self):
        return int, (int(self),)


def retag(out, ranks):
    """`out` (a Python or numpy number, or nested tuples/lists of them) tagged with `ranks`."""
    if not ranks:
        return out
    if isinstance(out, (tuple, list)):
        return type(out)(retag(v, ranks) for v in out) if type(out) in (tuple, list) else out
    if isinstance(out, (bool, np.bool_)):
        return out
    if isinstance(out, (float, np.floating)) and not isinstance(out, np.longdouble):
        return Tagged(out, ranks)
    if isinstance(out, (int, np.integer)):
        return TaggedInt(out, ranks)
    return out


def _method(cls, name):
    op = getattr(cls.__mro__[1], name)

    def method(self, *args):
        out = op(self, *args)
        if out is NotImplemented:
            return out
        return retag(out, self.ranks.union(*map(ranks_of, args)))
    method.__name__ = name
    return method


def _attribute(cls, name):
    get = getattr(cls.__mro__[1], name).__get__
    return property(lambda self: retag(get(self), self.ranks), doc=f"{name}, tagged")


# Every method and attribute of int and float keeps the tag of what it returns (dir() walked, so
# a method a new Python adds is wrapped too), except what returns no number (text, a truth value)
# and what CPython makes plain itself: int(), float() and hash() copy a subclass's result into a
# plain number (int() and float() warning), so `__int__`, `__float__` and `__hash__` stay as they
# are; the fingerprints catch a number made plain that way (rank_builtins.py keeps int() and
# float() in the answer's own module).
UNTAGGED = frozenset((
    "__hash__", "__int__", "__float__", "__bool__", "__repr__", "__str__", "__format__", "hex",
    "to_bytes", "is_integer", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"))
_MACHINERY = frozenset((
    "__class__", "__new__", "__init__", "__init_subclass__", "__subclasshook__",
    "__getattribute__", "__setattr__", "__delattr__", "__reduce__", "__reduce_ex__", "__dir__",
    "__doc__", "__getstate__", "__getformat__", "fromhex", "from_bytes"))
for _cls in (Tagged, TaggedInt):
    for _name in sorted(set(dir(_cls.__mro__[1])) - UNTAGGED - _MACHINERY):
        _base = getattr(_cls.__mro__[1], _name)
        setattr(_cls, _name, _attribute(_cls, _name) if hasattr(_base, "__set__")
                else _method(_cls, _name))


def ranks_of(leaf):
    """The ranks a leaf (a number, a numpy array, a slice) carries, or an empty set: read by
    exact types and from its instance dict (no `__class__` or `ranks` property of the reader's
    runs: the harness reads a rank's result after its window closed)."""
    cls = type(leaf)
    if cls is slice:
        return frozenset().union(*(ranks_of(v) for v in (leaf.start, leaf.stop, leaf.step)))
    if not issubclass(cls, (Tagged, TaggedInt, np.ndarray)):
        return frozenset()
    ranks = own_dict(leaf).get("ranks")
    return ranks if type(ranks) is frozenset else frozenset()


def tag(value, rank):
    """`value` (a number or nested lists of them, as item/tolist return) with numbers tagged."""
    if isinstance(value, list):
        return [tag(v, rank) for v in value]
    if isinstance(value, (Tagged, TaggedInt, bool)):
        return value
    if isinstance(value, (float, int)):
        return retag(value, (rank,))
    return value


ROUND_INT = 1 << 16     # integers below are counts, sizes, indices: too common to mean anything


def is_round(v):
    """Too common a value to say where it came from: a float that is an integer or a multiple
    of 1/4096, an integer below ROUND_INT in size (above it: a float's bit pattern, a hash)."""
    if isinstance(v, int):
        return abs(v) < ROUND_INT
    return not math.isfinite(v) or (v * 4096).is_integer()


def values(t, limit=100_000):
    """The values of tensor `t` (of its first `limit`) that are not round (is_round: they say
    nothing of where they came from, so no rule reads them), read with every mode off; the
    floats sorted out in torch, not one by one in Python."""
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        if t.device.type != "cpu" or t.is_meta or t.dtype == torch.bool or t.is_complex():
            return []
        flat = t.detach().reshape(-1)[:limit]
        if t.is_floating_point():
            d = flat.double()
            scaled = d * 4096
            plain = torch.isfinite(d) & ~(torch.isfinite(scaled) & (scaled == scaled.round()))
            return torch._C.TensorBase.tolist(d[plain])   # not the watched Tensor.tolist
        return [v for v in torch._C.TensorBase.tolist(flat.long()) if not is_round(v)]


def foreign_message(rank, others, how):
    names = ", ".join(map(str, sorted(others)))
    return (f"rank {rank} {how} numbers that rank {names} read out of its own tensors (.item(), "
            f".tolist(), .numpy(), pickling, .shape ...) and left where rank {rank} could reach "
            f"them (a "
            "module global, a closure, a class attribute): ranks share data only through the "
            "comm (send/recv or a collective)")


_SIZES = ("size", "numel", "nelement", "dim", "ndimension", "__get__")   # __get__: .shape, .ndim


class TagWatch(TorchFunctionMode):
    """Rank `rank`'s torch calls: none may take a number tagged with another rank; the sizes it
    reads (.size(), .shape, .numel()) are tagged with it."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for leaf in tree_leaves((args, kwargs)):
            others = ranks_of(leaf) - {self.rank}
            if others:
                raise CheckFailed(foreign_message(self.rank, others,
                                                  f"passed to {getattr(func, '__name__', func)}"))
        out = func(*args, **kwargs)
        if getattr(func, "__name__", None) in _SIZES and isinstance(out, (int, tuple)):
            if isinstance(out, torch.Size):
                return torch.Size(retag(tuple(out), (self.rank,)))
            if type(out) is int:
                return TaggedInt(out, (self.rank,))
        return out


def foreign_in(tree, rank, exited):
    """The other ranks a number in `tree` (not tensors) comes from: by tag or by fingerprint.
    Walked and read by exact types, numbers and arrays as their base types hold them: nothing
    of the reader's runs (a rank's result is read after its window closed)."""
    for leaf in _leaves(tree):
        if ranks_of(leaf) - {rank}:
            return ranks_of(leaf) - {rank}
        cls = type(leaf)
        if issubclass(cls, float) or (issubclass(cls, int) and cls is not bool):
            v = float.__float__(leaf) if issubclass(cls, float) else int.__int__(leaf)
            who = exited.get(v, ()) if not is_round(v) else ()
            if who and rank not in who:
                return set(who)
        array = np.ndarray.view(leaf, np.ndarray) if issubclass(cls, np.ndarray) else \
            np.asarray(leaf) if cls in _NUMPY_SCALARS else None
        if array is not None and array.dtype.kind in ("f", "i", "u"):
            for v in array.ravel()[:100_000].tolist():          # a numpy array
                who = exited.get(v, ()) if not is_round(v) else ()
                if who and rank not in who:
                    return set(who)
    return set()


_NUMPY_SCALARS = frozenset(c for c in vars(np).values() if type(c) is type and issubclass(
    c, np.generic))


def _leaves(tree, depth=8):
    """The leaves of lists, tuples, sets and dicts (their subclasses read by the base types' own
    methods) down to `depth`, each container once."""
    out, seen, stack = [], set(), [(tree, depth)]
    while stack:
        v, left = stack.pop()
        items = base_items(v) if left else None
        if items is None:
            out.append(v)
        elif id(v) not in seen:
            seen.add(id(v))
            stack.extend((x, left - 1) for x in reversed(items))
    return out
