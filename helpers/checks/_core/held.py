"""What a function of the reader's still holds after it returned: the async handles, futures
and tensors reachable from it, from the hooks of the reader's it keeps (state only a hook
holds) and from the other starts a check names (what it handed over, the module attributes set
since the checks' first import: `added_attributes`), by the scan's walk (reach.py, the
course's code left out): its closure, defaults and attributes, the globals its code loads (its
module's whole namespace when it calls `globals()` or `vars()`), a ContextVar's value in this
thread, the classes of the reader's and their attributes, and what those hold (containers and
a dict's keys, objects, bound methods, partials, the value of a completed torch future: a
collect_all chained step to step holds every step's). A
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
from .guard import _state
from .keys import str_keys
from .parts import own_dict
from .reach import children, expandable, loads
from .reader_objects import is_a
from .settle import Guarded

__all__ = ["held_by", "Steps", "added_attributes"]

_LIMIT = 20000          # objects visited at most: a walk of a large structure stays bounded
# not walked into: a module (what is reached only through one is out of scope), a library's or
# the harness's function (its closures are the World's, not the answer's state)
_LEAVES = (str, bytes, int, float, complex, bool, type(None), types.ModuleType,
           types.CodeType, types.BuiltinFunctionType)
_COURSE = frozenset({__name__.split(".")[0], "helpers"})    # the fresh copy's and the notebook's
_MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__


def _modules():
    """(name, module) of the modules loaded now, the course's aside (read by exact types)."""
    return [(name, m) for name, m in list(sys.modules.items()) if type(name) is str
            and is_a(m, types.ModuleType) and name.split(".")[0] not in _COURSE]


def _namespaces(which=None):
    """{name: (module, its attribute names)} of the modules loaded now (`_modules`), or of
    those `which(name, module)` picks."""
    return {name: (m, {k for k in _MODULE_DICT(m).copy() if type(k) is str})
            for name, m in _modules() if which is None or which(name, m)}


def _first_import():
    """The namespaces when the course's checks were first imported in this process, kept on the
    state every import shares (guard.py): fresh.py's copy, made after the notebook's cells ran,
    judges by the notebook's import, not by its own."""
    state = _state()
    found = getattr(state, "held_namespaces", None)
    if type(found) is not dict:
        found = state.held_namespaces = _namespaces()
    return found


_AT_IMPORT = _first_import()    # what a library's modules held then is their own


def held_by(starts, depth=8):
    """{id: object} of the async handles (`Work`, torch futures) and tensors that the reader's
    functions `starts` (functions, bound methods, partials, the harness's Answers around one,
    kept hooks) reach, the depth counted from each; an object met again with more depth left
    is walked again."""
    found, seen = {}, {}
    stack = [(start, depth) for start in reversed(starts)]   # the first walked first
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
    """Yields a function of no arguments: the values of the attributes set on loaded modules (a
    library's, the reader's; the course's helpers aside) since the checks were imported (for a
    module imported later, since the block was entered), and every attribute of a module made
    since, not imported (no `__spec__` or `__file__`: `types.ModuleType(name)` put in
    sys.modules), modules left out. A store the answer keeps there, at import or while it runs
    (`setattr(torch, name, {})` read by a built name, a made module reached by
    `importlib.import_module`), is no library's own, and no load of the reader's names it."""
    # what `added` reads only for a module not in _AT_IMPORT: those alone are noted now
    entered = _namespaces(lambda name, m: _known(name, m, _AT_IMPORT) is None)

    def added():
        out = []
        for name, m in _modules():
            space = _MODULE_DICT(m)
            known = _known(name, m, _AT_IMPORT)
            if known is None and not _made(name, space.copy()):
                known = _known(name, m, entered)
                if known is None:
                    continue    # imported while the block ran: what it holds is its own
            out += [v for v in _values(space, known or set()) if not is_a(v, types.ModuleType)]
        return out
    yield added


def _values(space, known):
    """The values of the namespace `space` under names not in `known`: none where it holds no
    more names than `known` (most modules: one that lost as many is not read), else a set
    difference made in C, at once, where every key is an exact str (no key's code runs), else a
    copy's items."""
    if len(space) <= len(known):
        return []
    if str_keys(space):
        return [space.get(k) for k in space.keys() - known]
    return [v for k, v in dict.items(space.copy()) if type(k) is not str or k not in known]


def _known(name, module, snapshot):
    """The attribute names `module` had in `snapshot` (`_namespaces`), or None if not there."""
    held, names = snapshot.get(name, (None, None))
    return names if held is module else None


def _made(name, space):
    """Whether the module of namespace `space` was made, not imported (no spec, no file)."""
    spec = next((v for k, v in dict.items(space) if type(k) is str and k == "__spec__"), None)
    return name != "__main__" and spec is None and not any(
        type(k) is str and k == "__file__" for k in space)


def _reads_globals(fn):
    """Whether the reader's `fn` (or a function nested in it) calls the builtin `globals` or
    `vars` (its module's namespace read by a built name)."""
    return any(found is builtins.globals or found is builtins.vars for _, found in loads(fn))


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
