"""What an answer returns is settled into plain values before the check touches it
(tests/check_cases.py's form), each refusal with the words it names:

1. the plain types that keep the objects they were built from: a `torch.Size` of the reader's int
   subclass, a `Fraction` whose `_numerator` slot is one (the check's `int(v)`, `float(q)` would
   run the reader's `__int__` after the call, where it reads the check's frame or calls the
   course's reference);
2. a returned tensor with a function in its instance `__dict__` (`t.to`, `t.bool`: Tensor's
   methods are non-data descriptors, so the attribute shadows the method the comparisons call),
   in a World rank's result too; the same for a returned module's parameter, a leaf's `.grad`
   and a library container's method (an OrderedDict's `items`).
Right answers that return a torch.Size, a Parameter or an OrderedDict keep passing.
"""
import collections
import fractions
import importlib
import sys

import torch
from check_cases import other, parametrize_cases, shortcut

HOLDING = "holding a"
SET_ON = "set on it"


def _frames():
    """The frames above, walked by names built at run time (the scan cannot read them)."""
    f = getattr(sys, "_get" + "frame")(1)
    while f is not None:
        yield getattr(f, "f_" + "locals")
        f = getattr(f, "f_" + "back")


def _local(name, kind=object):
    return next((loc[name] for loc in _frames() if isinstance(loc.get(name), kind)), None)


# ---- 1: plain types holding the reader's objects ----------------------------------------------
class _D(int):
    """An int whose conversions read the check's expected shape."""

    def __int__(self):
        want = _local("want", list)
        return want[self.i] if want else 0

    __index__ = __int__

    def __float__(self):
        return float(self.__int__())


def _d(i):
    d = _D(0)
    d.i = i
    return d


@shortcut("check_local_shape", "a torch.Size of an int subclass that reads the check's frame",
          [HOLDING, "_D"])
def local_shape_size_of_own_ints(shape, split_dim, dp, tp, dp_rank):
    return torch.Size([_d(i) for i in range(len(shape))])


@shortcut("check_shard_sizes", "a torch.Size of an int subclass, no arithmetic", [HOLDING, "_D"])
def shard_sizes_size_of_own_ints(n, k):
    return torch.Size([_d(i) for i in range(k)])


class _N(int):
    """A numerator whose `int()` calls the course's reference on the check's net and batch."""

    def __int__(self):
        for loc in _frames():
            if "net" in loc and "X" in loc:
                ref = getattr(importlib.import_module("hel" + "pers"), "saved_" + "per_layer")
                return sum(ref(loc["net"], loc["X"]))
        return 0


@shortcut("check_saved_bytes", "a Fraction whose numerator slot calls the reference later",
          [HOLDING, "_N"])
def saved_bytes_fraction_slot(net, X):
    q = fractions.Fraction(0, 1)
    q._numerator = _N(0)
    return q


@other("check_local_shape", "a torch.Size of plain ints")
def local_shape_plain_size(shape, split_dim, dp, tp, dp_rank):
    out = list(shape)
    if split_dim is not None:
        out[split_dim] //= tp
    rows = -(-out[0] // dp)
    out[0] = max(0, min(rows, out[0] - dp_rank * rows))
    return torch.Size(out)


# ---- 2: attributes set on a returned tensor or container --------------------------------------
def _bn():
    return next((loc["bn"] for loc in _frames() if loc.get("bn") is not None), None)


@shortcut("check_update_running_stats", "the statistics unchanged; their .to returns the check's",
          [SET_ON, ".to"])
def update_running_stats_to_attribute(running_mean, running_var, mean, var, n, momentum):
    a, b = running_mean.clone(), running_var.clone()
    a.to = lambda dtype, *x, **k: _bn().running_mean.detach().clone().to(dtype)
    b.to = lambda dtype, *x, **k: _bn().running_var.detach().clone().to(dtype)
    return a, b


@shortcut("check_update_running_stats", "the statistics unchanged; .to set on their gradient",
          [SET_ON, ".to"])
def update_running_stats_grad_attribute(running_mean, running_var, mean, var, n, momentum):
    a, b = running_mean.clone().requires_grad_(), running_var.clone().requires_grad_()
    a.grad = torch.zeros_like(a)
    a.grad.to = lambda dtype, *x, **k: _bn().running_mean.detach().clone().to(dtype)
    return a, b


def _kept():
    r = _local("r", dict)
    return r["kept"] if r else None


@shortcut("check_keep_within_capacity", "keeps nothing; its .bool returns the check's mask",
          [SET_ON, ".bool"])
def keep_within_capacity_bool_attribute(expert, capacity, n_experts):
    out = torch.zeros(expert.shape, dtype=torch.bool)
    out.bool = _kept
    return out


def _want_to(dtype, *a, **k):
    loc = next((loc for loc in _frames() if "want" in loc and "results" in loc), None)
    return loc["want"].to(dtype)


@shortcut("check_dispatch_tokens", "rows in reversed order; .to returns the check's (a World)",
          [SET_ON, ".to"])
def dispatch_tokens_to_attribute(x, dest, comm):
    order = torch.argsort(dest, stable=True)
    counts = torch.bincount(dest, minlength=comm.world)
    got_counts = comm.all_to_all(counts.reshape(-1, 1), [1] * comm.world, [1] * comm.world)
    out = comm.all_to_all(x[order], counts.tolist(), got_counts.reshape(-1).tolist())
    out = out.flip(0)
    out.to = _want_to
    return out


@shortcut("check_strip_module_prefix", "the keys kept; an OrderedDict whose items are bent",
          [SET_ON, ".items"])
def strip_module_prefix_items_attribute(state_dict):
    out = collections.OrderedDict(state_dict)
    fixed = collections.OrderedDict((k.removeprefix("module."), v) for k, v in state_dict.items())
    out.items = fixed.items
    out.keys = fixed.keys
    out.__iter__ = fixed.__iter__
    return out


@other("check_strip_module_prefix", "an OrderedDict with nothing set on it")
def strip_module_prefix_ordered(state_dict):
    return collections.OrderedDict((k.removeprefix("module."), v) for k, v in state_dict.items())


test_case = parametrize_cases(__name__)


def test_plain_values_pass_as_they_are():
    """Plain values, a Size of ints, a Fraction of ints and a bare tensor come back unchanged;
    a slice holding an object of the reader's class is refused."""
    import pytest

    from helpers.checks._core.run import CheckFailed
    from helpers.checks._core.settle import settle
    t, p = torch.zeros(2), torch.nn.Parameter(torch.ones(2))
    for x in (torch.Size([2, 3]), fractions.Fraction(3, 4), slice(1, 5), t, p, 3, "a", None):
        assert settle(x, "f", lambda f: f) is x
    with pytest.raises(CheckFailed, match=HOLDING):
        settle(slice(None, _d(1)), "f", lambda f: f)
    net = torch.nn.Linear(2, 2)
    net.weight.to = lambda *a, **k: None
    with pytest.raises(CheckFailed, match=SET_ON):
        settle(net, "f", lambda f: f)
