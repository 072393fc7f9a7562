"""What a function of the reader's still holds after it returned: the async handles, futures
and tensors reachable from its closure, defaults, the module globals its code names, and what
those hold (containers, the reader's objects, bound methods, partials, modules' attributes).
A stateful answer that keeps each step's handles grows without bound, and keeps every step's
gradients alive, while its values stay right; the checks tell it by what it holds one step
later (`check_overlap_hooks`). Read by exact types, the base types' own methods and the
collector's referents: no method, property or container method of the reader's runs."""
import collections
import functools
import gc
import types

import torch

from ...runtime.work import Work
from .keys import str_keys
from .parts import base_items, own_dict
from .run import is_reader_code
from .settle import Guarded

__all__ = ["held_by", "still_held"]

_LIMIT = 20000          # objects visited at most: a walk of a large structure stays bounded
_LEAVES = (str, bytes, int, float, complex, bool, type(None), types.ModuleType, type,
           types.CodeType, types.BuiltinFunctionType)
_DEQUE_ITER = collections.deque.__iter__


def held_by(fn, depth=8):
    """{id: object} of the async handles (`Work`, torch futures) and tensors that `fn` (the
    reader's function, bound method, partial or the harness's Answer around one) reaches."""
    found, seen = {}, set()
    stack = [(fn, depth)]
    while stack and len(seen) < _LIMIT:
        obj, left = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        cls = type(obj)
        if cls is Work or issubclass(cls, (torch._C.Future, torch.Tensor)):
            found[id(obj)] = obj
            if not issubclass(cls, torch.Tensor):
                continue               # a handle's own closures are the World's
        if left and not issubclass(cls, _LEAVES):
            stack.extend((v, left - 1) for v in _parts(obj))
    return found


def _parts(obj):
    """What `obj` holds, read without running code of the reader's (see the module's text)."""
    cls = type(obj)
    if cls is types.MethodType:
        return [obj.__func__, obj.__self__]
    if cls is functools.partial:
        return [obj.func, *obj.args, *dict.values(obj.keywords)]
    if issubclass(cls, Guarded):
        return [object.__getattribute__(obj, "fn")]     # the harness's Answer around it
    if cls is types.FunctionType:
        f = obj
        if not is_reader_code(f.__code__.co_filename):
            return []                  # the harness's, the course's, a library's
        g = f.__globals__ if type(f.__globals__) is dict and str_keys(f.__globals__) else {}
        named = [dict.get(g, n) for n in f.__code__.co_names if type(n) is str]
        cells = [c.cell_contents for c in f.__closure__ or () if _full(c)]
        kw = f.__kwdefaults__
        return [*cells, *(f.__defaults__ or ()), *(dict.values(kw) if type(kw) is dict else ()),
                *named]
    items = base_items(obj)
    if items is not None:
        return items
    if issubclass(cls, collections.deque):
        return list(_DEQUE_ITER(obj))
    if issubclass(cls, torch.Tensor) or issubclass(cls, torch.nn.Module):
        return list(own_dict(obj).values())
    # any other object: its instance dict and slots, by the collector (C code)
    return [v for v in gc.get_referents(obj) if not issubclass(type(v), type)]


def _full(cell):
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True


def still_held(fn, grads, kept):
    """How many handles, futures and tensors of the steps before (`kept`, by id, kept alive so
    that no id is reused) `fn` holds now, the current gradients `grads` aside; `kept` then takes
    this step's handles, futures and gradients."""
    held, grads = held_by(fn), [t for t in grads if t is not None]
    live = {id(t) for t in grads}
    stale = sum(1 for i in held if i in kept and i not in live)
    kept.update({i: h for i, h in held.items() if not issubclass(type(h), torch.Tensor)})
    kept.update({id(t): t for t in grads})
    return stale
