"""Python numbers between thread ranks: a number one rank read out of its own tensors may not
reach another rank except through the comm.

provenance.py refuses a rank that touches another rank's tensor. A rank can also turn its own
tensor into Python numbers (`.item()`, `float(t)`, `.tolist()`, `.numpy()`) and leave them in a
module global, a closure or a class attribute, where another rank reads them after a decoy
collective. Two marks follow such numbers, for one run of a World:

- a tag: in a rank, `.item()`, `float(t)` and `.tolist()` of its own floating tensors return
  floats that carry the rank (`Tagged`), and Python arithmetic on them keeps the tags of every
  operand (`sum(...)` over the ranks' numbers carries them all). A torch call of rank B whose
  arguments hold a number tagged with another rank fails (`TagWatch`, a TorchFunctionMode), and
  so does a rank's result that holds one;
- a fingerprint: every floating value a rank reads out (the exits above, numpy and the others of
  exits.py included) is kept; a rank that puts into torch (a Python scalar argument, a tensor
  made from Python or numpy data) or returns a value that only other ranks read out fails.
  Round values (integers, multiples of 1/4096) are too common to mean anything and are left out.

What it does not see: integers; a number laundered (`float(x)`, `str`, numpy) and changed by
arithmetic before it reaches the other rank (book/teachers.md names the limit).
"""
import math

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

from .run import CheckFailed

__all__ = ["Tagged", "TagWatch", "tag", "is_round", "foreign_message"]


class Tagged(float):
    """A float a rank read out of its own tensor: arithmetic keeps the ranks it came from."""

    def __new__(cls, value, ranks):
        obj = super().__new__(cls, value)
        obj.ranks = frozenset(ranks)
        return obj

    def __reduce__(self):
        return float, (float(self),)


def _binary(name):
    op = getattr(float, name)

    def method(self, other, *rest):
        out = op(self, other, *rest)
        if not isinstance(out, float):
            return out                 # NotImplemented, or a comparison's bool
        return Tagged(out, self.ranks | getattr(other, "ranks", frozenset()))
    method.__name__ = name
    return method


def _unary(name):
    op = getattr(float, name)

    def method(self):
        return Tagged(op(self), self.ranks)
    method.__name__ = name
    return method


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
              "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
              "__rpow__"):
    setattr(Tagged, _name, _binary(_name))
for _name in ("__neg__", "__pos__", "__abs__"):
    setattr(Tagged, _name, _unary(_name))


def tag(value, rank):
    """`value` (a number or nested lists of them, as item/tolist return) with floats tagged."""
    if isinstance(value, list):
        return [tag(v, rank) for v in value]
    if isinstance(value, float) and not isinstance(value, Tagged):
        return Tagged(value, (rank,))
    return value


def is_round(v):
    """Too common a value to say where it came from: an integer or a multiple of 1/4096."""
    return not math.isfinite(v) or (v * 4096).is_integer()


def values(t, limit=100_000):
    """The floating values of tensor `t` (at most `limit`), read with every mode off."""
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        if not t.is_floating_point() or t.device.type != "cpu" or t.is_meta:
            return []
        flat = t.detach().reshape(-1)[:limit].double()
        return torch._C.TensorBase.tolist(flat)        # not the watched Tensor.tolist


def foreign_message(rank, others, how):
    names = ", ".join(map(str, sorted(others)))
    return (f"rank {rank} {how} numbers that rank {names} read out of its own tensors (.item(), "
            f".tolist(), .numpy() ...) and left where rank {rank} could reach them (a module "
            "global, a closure, a class attribute): ranks share data only through the comm "
            "(send/recv or a collective)")


class TagWatch(TorchFunctionMode):
    """Rank `rank`'s torch calls: none may take a number tagged with another rank."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for leaf in tree_leaves((args, kwargs)):
            if isinstance(leaf, Tagged) and leaf.ranks - {self.rank}:
                raise CheckFailed(foreign_message(self.rank, leaf.ranks - {self.rank},
                                                  f"passed to {getattr(func, '__name__', func)}"))
        return func(*args, **kwargs)


def foreign_in(tree, rank, exited):
    """The other ranks a number in `tree` (not tensors) comes from: by tag or by fingerprint."""
    for leaf in tree_leaves(tree):
        if isinstance(leaf, Tagged) and leaf.ranks - {rank}:
            return leaf.ranks - {rank}
        if isinstance(leaf, float) and not is_round(leaf):
            who = exited.get(float(leaf), ())
            if who and rank not in who:
                return set(who)
        if hasattr(leaf, "dtype") and hasattr(leaf, "ravel") and not isinstance(
                leaf, torch.Tensor) and getattr(leaf.dtype, "kind", "") == "f":
            for v in leaf.ravel()[:100_000].tolist():          # a numpy array
                who = exited.get(v, ()) if not is_round(v) else ()
                if who and rank not in who:
                    return set(who)
    return set()
