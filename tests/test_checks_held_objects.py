"""The scan of an answer's code (references.py, reach.py) sees what a C object holds, as the
collector does (tests/check_cases.py's form): the unwatched `torch._C.TensorBase.tolist`, bound
at import and kept in a slice, a mapping proxy, a generator, an exception's args, a defaultdict's
default factory, a ContextVar's default, a class reached through a weak reference or a dict's
key, or the watched `torch.Tensor.tolist` bound before the check ran and kept in a slice, is
refused before the answer runs; a right answer holding C objects of its own (a slice, a
generator, numpy arrays, a DataLoader) passes."""
import collections
import contextvars
import types
import weakref
from fractions import Fraction

import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut

UNWATCHED = "unwatched way out of torch"


def _flat(t):
    return t.float().contiguous().reshape(-1)


def _kept(get):
    """An answer reading values out through `get()`: E[x^2] - E[x]^2 in exact fractions."""
    def global_mean_var(counts, means, variances):
        w, c = means.shape
        m, v, n = ([Fraction(x) for x in get()(_flat(t))] for t in (means, variances, counts))
        total = sum(n)
        mean = [sum(n[r] * m[r * c + j] for r in range(w)) / total for j in range(c)]
        ex2 = [sum(n[r] * (v[r * c + j] + m[r * c + j] ** 2) for r in range(w)) / total
               for j in range(c)]
        return (torch.tensor([float(x) for x in mean]),
                torch.tensor([float(ex2[j] - mean[j] ** 2) for j in range(c)]))
    return global_mean_var


def _forever(f):
    while True:
        yield f


class _Box:
    """Held strongly only where the answer's code does not look."""


_Box.tolist = torch._C.TensorBase.tolist
_FACTORY = collections.defaultdict((lambda f: lambda: f)(torch._C.TensorBase.tolist))
_HOLDERS = types.SimpleNamespace(
    slice=slice(torch._C.TensorBase.tolist), proxy=types.MappingProxyType(
        {"f": torch._C.TensorBase.tolist}), gen=_forever(torch._C.TensorBase.tolist),
    exc=ValueError(torch._C.TensorBase.tolist), weak=weakref.ref(_Box),
    var=contextvars.ContextVar("tolist", default=torch._C.TensorBase.tolist),
    watched=slice(torch.Tensor.tolist), keyed={torch._C.TensorBase.tolist: "tolist"})
_UNSEEN = [_Box]
del _Box
_SLICE, _PROXY, _GEN, _EXC = _HOLDERS.slice, _HOLDERS.proxy, _HOLDERS.gen, _HOLDERS.exc
_WEAK, _VAR, _WATCHED, _KEYED = _HOLDERS.weak, _HOLDERS.var, _HOLDERS.watched, _HOLDERS.keyed
_CASES = (("a slice's stop", lambda: _SLICE.stop), ("a mapping proxy", lambda: _PROXY["f"]),
          ("a generator made at import", lambda: next(_GEN)),
          ("an exception's args", lambda: _EXC.args[0]),
          ("a defaultdict's default factory", lambda: _FACTORY["tolist"]),
          ("a ContextVar's default", lambda: _VAR.get()),
          ("a class reached through a weak reference", lambda: vars(_WEAK())["tolist"]),
          ("a dict's key", lambda: next(iter(_KEYED))))
for _what, _get in _CASES:
    shortcut("check_global_mean_var", f"TensorBase.tolist held in {_what}", UNWATCHED)(
        _kept(_get))
shortcut("check_global_mean_var", "Tensor.tolist bound at import, held in a slice",
         UNWATCHED)(_kept(lambda: _WATCHED.stop))


# ---- right answers holding C objects of their own ---------------------------------------------
_RANGE = slice(None, None, 1)
_ARRAYS = {"weights": np.ones(3), "log": np.zeros((4, 4))}
_LOADER = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)),
                                      batch_size=2)
_STEPS = iter(range(10 ** 6))


@other("check_global_mean_var", "holds a slice, a generator, numpy arrays and a DataLoader")
def global_mean_var_c_objects(counts, means, variances):
    assert len(_ARRAYS["weights"]) == 3 and _LOADER.batch_size == 2 and next(_STEPS) >= 0
    c = counts[_RANGE, None]
    n = c.sum()
    mean = (c * means).sum(0) / n
    return mean, (c * (variances + (means - mean) ** 2)).sum(0) / n


test_case = parametrize_cases(__name__)


_ARRAY = __import__("numpy").arange(3)


def test_a_function_reading_an_array_global_is_walked():
    """held.py asks whether a reader's function reads globals() by identity: a global numpy
    array it loads (whose `==` is elementwise) is no error."""
    from helpers.checks._core.held import _reads_globals

    def uses_array():
        return _ARRAY.sum()

    def uses_globals():
        return globals()

    assert not _reads_globals(uses_array)
    assert _reads_globals(uses_globals)
