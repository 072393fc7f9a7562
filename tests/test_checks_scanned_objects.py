"""The scan of an answer's code (references.py) before it runs reads every object the code
reaches by the object's own type, and reads the reader's objects without being stopped by them
(tests/check_cases.py's form):

1. an object that claims another class (a `__class__` property: a module, a function) or a
   callable subclass of `str` is still walked, so what its `__call__` names is seen;
2. right answers whose code holds an object whose attributes compute and fail (a `__module__`
   property that raises, a `__getattr__` that raises KeyError) are judged, not reported as the
   check's own failure.
"""
import types

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


test_case = parametrize_cases(__name__)
