"""The scan of an answer's code (references.py) before it runs reads every object the code
reaches by the object's own type, and reads the reader's objects without being stopped by them
(tests/check_cases.py's form):

1. an object that claims another class (a `__class__` property: a module, a function) or a
   callable subclass of `str` is still walked, so what its `__call__` names is seen;
2. right answers whose code holds an object whose attributes compute and fail (a `__module__`
   property that raises, a `__getattr__` that raises KeyError) are judged, not reported as the
   check's own failure;
3. what an object holds is walked whatever it is (reach.py): the methods of a plain instance's
   class, a class that claims a library's module (`__module__ = "json"`) or was made by `type()`,
   a property's getter, a metaclass's method, a function kept in an instance attribute;
4. right answers that hold the reader's objects pass: an `nn.Module` of the reader's, a dataclass
   of settings, an object holding tensors.
"""
import ctypes
import dataclasses
import struct
import types
from fractions import Fraction

import torch
from check_cases import other, parametrize_cases, shortcut

UNWATCHED = "unwatched way out of torch"


def _sizes(n, k):
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


def _through_c(n):
    # named in plain view: the scan must reach this code to see it
    import ctypes
    return n + 0 * ctypes.sizeof(ctypes.c_int)


# ---- 1. objects that claim another class -------------------------------------------------------
class _LooksLikeModule:
    @property
    def __class__(self):          # isinstance(obj, types.ModuleType) believes it
        return types.ModuleType

    def __call__(self, n):
        return _through_c(n)


class _LooksLikeFunction:
    @property
    def __class__(self):          # inspect.isroutine believes it: no __call__ to read
        return types.FunctionType

    def __call__(self, n):
        return _through_c(n)


class _CallableStr(str):
    def __call__(self, n):
        return _through_c(n)


_MODULE_LIKE, _FUNCTION_LIKE, _STR_LIKE = _LooksLikeModule(), _LooksLikeFunction(), _CallableStr()


@shortcut("check_shard_sizes", "ctypes behind an object that claims to be a module", UNWATCHED)
def shard_sizes_module_claim(n, k):
    return _sizes(_MODULE_LIKE(n), k)


@shortcut("check_shard_sizes", "ctypes behind an object that claims to be a function",
          UNWATCHED)
def shard_sizes_function_claim(n, k):
    return _sizes(_FUNCTION_LIKE(n), k)


@shortcut("check_shard_sizes", "ctypes behind a callable subclass of str", UNWATCHED)
def shard_sizes_str_subclass(n, k):
    return _sizes(_STR_LIKE(n), k)


# ---- 2. objects whose attributes fail ----------------------------------------------------------
class _NoModule:
    @property
    def __module__(self):
        raise RuntimeError("computed on demand, and not here")


class _Settings:
    """A student's settings object: attribute reads look keys up (KeyError when missing)."""

    def __init__(self, **values):
        self.__dict__["values"] = values

    def __getattr__(self, name):
        return self.values[name]


_ODD, _SETTINGS = _NoModule(), _Settings(first="remainder")


@other("check_shard_sizes", "holds an object whose __module__ raises")
def shard_sizes_odd_global(n, k):
    return _sizes(n, k) if _ODD is not None else []


@other("check_shard_sizes", "reads a settings object whose __getattr__ raises KeyError")
def shard_sizes_settings(n, k):
    q, r = divmod(n, k)
    if _SETTINGS.first == "remainder":
        return [q + 1] * r + [q] * (k - r)
    return [q] * (k - r) + [q + 1] * r


# ---- 3. what an object holds ------------------------------------------------------------------
def _flat(t):
    return t.float().contiguous().reshape(-1)


def _exact_mean_var(get, counts, means, variances):
    """The global mean and variance in exact fractions of the values `get` reads out of torch."""
    w, c = means.shape
    m, v, n = ([Fraction(x) for x in get(t)] for t in (means, variances, counts))
    total = sum(n)
    mean = [sum(n[r] * m[r * c + j] for r in range(w)) / total for j in range(c)]
    ex2 = [sum(n[r] * (v[r * c + j] + m[r * c + j] ** 2) for r in range(w)) / total
           for j in range(c)]
    return (torch.tensor([float(x) for x in mean], dtype=torch.float32),
            torch.tensor([float(ex2[j] - mean[j] ** 2) for j in range(c)], dtype=torch.float32))


class _Reader:
    def floats(self, t):
        return torch._C.TensorBase.tolist(_flat(t))


class _RawReader:
    def floats(self, t):
        t = _flat(t)
        return list(struct.unpack(f"<{t.numel()}f", ctypes.string_at(t.data_ptr(), t.numel() * 4)))


class _ClaimsJson:
    __module__ = "json"
    floats = staticmethod(lambda t: torch._C.TensorBase.tolist(_flat(t)))


class _Props:
    @property
    def floats(self):
        return lambda t: torch._C.TensorBase.tolist(_flat(t))


class _Meta(type):
    def floats(cls, t):
        return torch._C.TensorBase.tolist(_flat(t))


class _WithMeta(metaclass=_Meta):
    pass


_READER, _RAW_READER, _PROPS = _Reader(), _RawReader(), _Props()
_TYPED = type("_Typed", (), {"floats": lambda self, t: torch._C.TensorBase.tolist(_flat(t))})()
_CLASSES = {"json": _ClaimsJson, "meta": _WithMeta}


@shortcut("check_global_mean_var", "TensorBase.tolist in a method of an instance", UNWATCHED)
def global_mean_var_instance_method(counts, means, variances):
    return _exact_mean_var(_READER.floats, counts, means, variances)


@shortcut("check_global_mean_var", "ctypes.string_at in a method of an instance", UNWATCHED)
def global_mean_var_instance_ctypes(counts, means, variances):
    return _exact_mean_var(_RAW_READER.floats, counts, means, variances)


@shortcut("check_global_mean_var", "TensorBase.tolist in a class claiming json's module",
          UNWATCHED)
def global_mean_var_claims_json(counts, means, variances):
    return _exact_mean_var(_CLASSES["json"].floats, counts, means, variances)


@shortcut("check_global_mean_var", "TensorBase.tolist in a class made by type()", UNWATCHED)
def global_mean_var_made_by_type(counts, means, variances):
    return _exact_mean_var(_TYPED.floats, counts, means, variances)


@shortcut("check_global_mean_var", "TensorBase.tolist in a property's getter", UNWATCHED)
def global_mean_var_property(counts, means, variances):
    return _exact_mean_var(_PROPS.floats, counts, means, variances)


@shortcut("check_global_mean_var", "TensorBase.tolist in a metaclass's method", UNWATCHED)
def global_mean_var_metaclass(counts, means, variances):
    return _exact_mean_var(_CLASSES["meta"].floats, counts, means, variances)


_SHARED = {}


def _fetch(q, i, like):
    """Rank `q`'s gradient `i`, copied at its data_ptr()."""
    src, out = _SHARED[q][i], torch.zeros_like(like)
    ctypes.memmove(out.data_ptr(), src.data_ptr(), src.numel() * src.element_size())
    return out


class _Mover:
    def fetch(self, q, i, like):
        return _fetch(q, i, like)


class _Holder:
    def __init__(self, fetch):
        self.fetch = fetch


_MOVER, _HOLDER = _Mover(), _Holder(_fetch)


def _dp_average_by(fetch, grads, comm):
    _SHARED[comm.rank] = [g.detach().clone() for g in grads]
    for i, g in enumerate(grads):
        decoy = torch.zeros_like(g)
        comm.all_reduce(decoy)          # every rank has filled _SHARED when this returns
        g.copy_(decoy + sum(fetch(q, i, g) for q in range(comm.world)) / comm.world)


@shortcut("check_dp_average", "ctypes.memmove in a method of an instance", UNWATCHED)
def dp_average_instance_ctypes(grads, comm):
    _dp_average_by(_MOVER.fetch, grads, comm)


@shortcut("check_dp_average", "ctypes.memmove in a function kept in an instance attribute",
          UNWATCHED)
def dp_average_attribute_ctypes(grads, comm):
    _dp_average_by(_HOLDER.fetch, grads, comm)


# ---- 4. right answers holding the reader's objects --------------------------------------------
class _Weighted(torch.nn.Module):
    """The global statistics as a module of the reader's, holding a tensor."""

    def __init__(self):
        super().__init__()
        self.register_buffer("one", torch.ones(()))

    def forward(self, counts, means, variances):
        w = (counts / counts.sum() * self.one)[:, None]
        mean = (w * means).sum(0)
        return mean, (w * (variances + (means - mean) ** 2)).sum(0)


@dataclasses.dataclass(frozen=True)
class _Plan:
    shifted: bool = True
    scale: torch.Tensor = dataclasses.field(default_factory=lambda: torch.ones(()))


class _Averager:
    def __init__(self):
        self.plan = _Plan()

    def average(self, grads, comm):
        for g in grads:
            comm.all_reduce(g)
            g.div_(comm.world * self.plan.scale)


_WEIGHTED, _PLAN, _AVERAGER = _Weighted(), _Plan(), _Averager()


@other("check_global_mean_var", "an nn.Module of the reader's, held by the module")
def global_mean_var_module(counts, means, variances):
    return _WEIGHTED(counts, means, variances)


@other("check_global_mean_var", "a dataclass of settings")
def global_mean_var_settings(counts, means, variances):
    c = counts[:, None]
    shift = means[0] if _PLAN.shifted else torch.zeros_like(means[0])
    d, n = means - shift, c.sum()
    mean_d = (c * d).sum(0) / n
    var = (c * (variances + (d - mean_d) ** 2)).sum(0) / n
    return mean_d + shift, var * _PLAN.scale


@other("check_dp_average", "an object of the reader's holding settings and a tensor")
def dp_average_helper_object(grads, comm):
    _AVERAGER.average(grads, comm)


test_case = parametrize_cases(__name__)
