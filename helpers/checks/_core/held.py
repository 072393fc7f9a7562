"""What a function of the reader's still holds after it returned: the async handles, futures
and tensors reachable from it by the scan's walk (reach.py, the course's code left out): its
closure, defaults and attributes, the globals its code loads, the classes of the reader's and
their attributes, and what those hold (containers, objects, bound methods, partials). A
stateful answer that keeps each step's handles grows without bound, and keeps every step's
gradients alive, while its values stay right; the checks tell it by what it holds one step
later (`check_overlap_hooks`). Read as reach.py reads: no method, property or container method
of the reader's runs."""
import gc
import types

import torch

from ...runtime.work import Work
from .parts import own_dict
from .reach import children, expandable
from .settle import Guarded

__all__ = ["held_by", "still_held"]

_LIMIT = 20000          # objects visited at most: a walk of a large structure stays bounded
# not walked into: a module (what is reached only through one is out of scope), a library's or
# the harness's function (its closures are the World's, not the answer's state)
_LEAVES = (str, bytes, int, float, complex, bool, type(None), types.ModuleType,
           types.CodeType, types.BuiltinFunctionType)


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
    """What `obj` holds: reach.py's children of it, the course's code and members left out; a
    tensor's own attributes only (its hook tables hold the check's hooks and the harness's
    wrappers of the answer's, whose state the answer's function reaches itself)."""
    cls = type(obj)
    if issubclass(cls, torch.Tensor):
        return list(own_dict(obj).values())
    if issubclass(cls, Guarded):       # the harness's wrapper of the reader's function or hook
        return [v for v in gc.get_referents(obj) if not issubclass(type(v), type)]
    if cls is types.FunctionType and not expandable(obj, course=False):
        return []                      # the harness's, the course's, a library's
    return [child for _, child in children(obj, course=False)]


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
