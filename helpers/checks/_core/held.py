"""What a function of the reader's still holds after it returned: the async handles, futures
and tensors reachable from it, and from the hooks of the reader's it keeps (state only a hook
holds), by the scan's walk (reach.py, the course's code left out): its closure, defaults and
attributes, the globals its code loads (its module's whole namespace when it calls `globals()`
or `vars()`), a ContextVar's value in this thread, the classes of the reader's and their
attributes, and what those hold (containers, objects, bound methods, partials, the value
of a completed torch future: a collect_all chained step to step holds every step's). A
stateful answer that keeps each step's handles grows without bound, and keeps every step's
gradients alive, while its values stay right; the checks tell it by what it holds one step
later (`check_overlap_hooks`). Read as reach.py reads: no method, property or container method
of the reader's runs."""
import builtins
import contextlib
import contextvars
import gc
import sys
import types

import torch

from ...runtime.work import Work
from .parts import own_dict
from .reach import children, expandable, loads
from .settle import Guarded

__all__ = ["held_by", "Steps", "added_attributes"]

_LIMIT = 20000          # objects visited at most: a walk of a large structure stays bounded
# not walked into: a module (what is reached only through one is out of scope), a library's or
# the harness's function (its closures are the World's, not the answer's state)
_LEAVES = (str, bytes, int, float, complex, bool, type(None), types.ModuleType,
           types.CodeType, types.BuiltinFunctionType)


def held_by(starts, depth=8):
    """{id: object} of the async handles (`Work`, torch futures) and tensors that the reader's
    functions `starts` (functions, bound methods, partials, the harness's Answers around one,
    kept hooks) reach, the depth counted from each; an object met again with more depth left
    is walked again."""
    found, seen = {}, {}
    stack = [(start, depth) for start in starts]
    while stack and len(seen) < _LIMIT:
        obj, left = stack.pop()
        if seen.get(id(obj), -1) >= left:
            continue
        seen[id(obj)] = left
        cls = type(obj)
        if cls is Work or issubclass(cls, (torch._C.Future, torch.Tensor)):
            found[id(obj)] = obj
            if cls is Work:
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
    if issubclass(cls, torch._C.Future):
        return _settled(obj)
    if issubclass(cls, Guarded):       # the harness's wrapper of the reader's function or hook
        return [v for v in gc.get_referents(obj) if not issubclass(type(v), type)]
    if cls is contextvars.ContextVar:  # its value in this thread's context (a rank's own)
        return [contextvars.ContextVar.get(obj, None)]
    if cls is types.FunctionType and not expandable(obj, course=False):
        return []                      # the harness's, the course's, a library's
    kids = [child for _, child in children(obj, course=False)]
    if cls is types.FunctionType and _reads_globals(obj):
        kids.insert(0, obj.__globals__)     # `globals()["NAME"]`: walked last (held_by pops)
    return kids


def _settled(fut):
    """The value of a completed, non-failed torch future (a collect_all's futures, an
    all-reduce's tensors), which C++ holds and only `value()` reaches; torch's own methods are
    called, not a subclass's (the World's WorkFuture records a wait in its `value()`). Its
    attributes and callbacks are the World's or C++'s, not walked."""
    try:
        return [torch._C.Future.value(fut)] if torch._C.Future.done(fut) else []
    except Exception:           # it failed: its error holds nothing of the answer's
        return []


@contextlib.contextmanager
def added_attributes():
    """Yields a function of no arguments: the values of the attributes set, since the block was
    entered, on the modules loaded then (a library's, the reader's; the course's helpers aside),
    modules left out. A store the answer keeps there (`setattr(torch.distributed, name, [])`,
    read by a built name) is no module's own, and no load of the reader's names it."""
    course = __name__.split(".")[0]
    before = {name: (m, set(m.__dict__.copy())) for name, m in list(sys.modules.items())
              if isinstance(m, types.ModuleType) and name.split(".")[0] != course}

    def added():
        return [v for m, names in before.values() for k, v in m.__dict__.copy().items()
                if k not in names and not isinstance(v, types.ModuleType)]
    yield added


def _reads_globals(fn):
    """Whether the reader's `fn` (or a function nested in it) calls the builtin `globals` or
    `vars` (its module's namespace read by a built name)."""
    return any(found in (builtins.globals, builtins.vars) for _, found in loads(fn))


class Steps:
    """What the reader's functions (`starts()`: its finish and its kept hooks) hold step by
    step. What they hold before the first step (an earlier run's, left in a module's dict) is
    not this run's growth and is not counted; everything is kept alive, so no id is reused."""

    def __init__(self, starts):
        self.starts, self.kept = starts, {}
        self.before = held_by(starts())

    def stale(self, grads):
        """How many handles, futures and tensors of the steps before they hold now, the current
        gradients `grads` aside; this step's handles, futures and gradients are then kept."""
        held, grads = held_by(self.starts()), [t for t in grads if t is not None]
        live = {id(t) for t in grads}
        stale = sum(1 for i in held if i in self.kept and i not in live)
        self.kept.update({i: h for i, h in held.items()
                          if not issubclass(type(h), torch.Tensor) and i not in self.before})
        self.kept.update({id(t): t for t in grads})
        return stale
