"""Nothing the answer replaces in the libraries the checks compute with outlives its call. A check
computes its expected value and compares after the answer returns, through globals it looks up
then (`torch.allclose`, `F.conv2d`, `builtins.abs`, `math.isclose`, tensor methods); an answer
that rebinds one (`torch.allclose = lambda *a, **k: True`) would bend the check's own arithmetic.
So `Answer` copies, before the call, the namespaces of those libraries (and of every module the
course's modules bind as a global) and, after it, fails an answer that changed, added or deleted
one of their functions, putting the originals back (as hooks.py removes hooks); their functions'
default arguments are compared by their contents too (defaults.py: a `__kwdefaults__` dict
changed in place keeps every binding). Threads the answer started are joined first (a thread
that outlives the call fails: it could patch later). The answers running at once (a World's
ranks) share one snapshot, taken before the first of them started, and an answer that raised
is checked too. So is the table of imported modules: an entry of `sys.modules` replaced or
removed (the check's later `from helpers import X` would reach the reader's module) fails the
answer and is put back; entries added (new imports) pass. The harness's own stand-ins
(helpers.checks) come and go while answers run and are not judged; an answer may set its own
module's globals."""
import builtins
import math
import operator
import os
import random
import statistics
import sys
import threading
import time
import types

import numpy
import torch
import torch.distributed
import torch.linalg
import torch.nn.functional

from . import defaults, imported, tables, versions
from .early_threads import idle_worker
from .guard import started_by_answer
from .keys import odd_keys_message, taken_out
from .parts import descriptor, own_methods, plain_function, wrapped_by
from .provenance import world_run
from .run import CheckFailed
from .versions import same
from .whose import genuine, reader_code

__all__ = ["snapshot", "expect_unpatched", "odd_keys"]

_FIXED = (builtins, torch, torch.nn.functional, torch.linalg, torch.distributed, math,
          statistics, operator, numpy, random)
# the C entry points torch's Python wrappers look up each time they run (F.cross_entropy calls
# torch._C._nn.cross_entropy_loss, Tensor.split torch._VF.split_with_sizes): private names
# watched too (no library rebinds a C function while it runs; torch._C._VariableFunctions
# itself is read-only)
_C_SPACES = (torch._C, torch._C._nn, torch._VF, torch._C._linalg,
             torch._C._special, torch._C._fft)
# the classes checks compute their expected values with: tensors, torch.nn's modules and
# torch.optim's optimizers (a replaced `nn.MSELoss.forward` would bend the check's loss)
_CLASSES = (torch.Tensor, torch._C.TensorBase, torch.nn.Module, torch.optim.Optimizer, *(
    c for space in (torch.nn, torch.optim) for c in vars(space).values()
    if isinstance(c, type) and issubclass(c, (torch.nn.Module, torch.optim.Optimizer))))
_MISSING = object()
_CELL = types.CellType.__dict__["cell_contents"].__get__   # the C getter, bound at import
_MODULE_OF = type.__dict__["__module__"].__get__
_callable = callable        # bound at import: `builtins.callable` is watched, not trusted
_JOIN_S = 2.0                       # how long a thread the answer started may take to finish
_HELPERS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_CHECKS = os.path.join(_HELPERS, "checks") + os.sep
# What _spaces found and the copies versions.py keeps (_CACHE), and each World run's snapshot
# (_SHARED: a run, or None -> [answers running now, their snapshot]): handed to the functions
# below as default arguments, then deleted as module attributes, so code of the reader's that
# reached this module by a name built at run time cannot poison a kept copy (a replaced
# torch.allclose would then compare equal to it) or mark namespaces scanned.
_CACHE = {"modules": -1, "spaces": ()}
_LOCK = threading.Lock()
_MODULES = imported.MODULES     # the import system's table, bound at import
_SHARED = {}


def _course_module(name):
    """The course's own modules (the façade `helpers` and its splits), not the grader's."""
    return (name == "helpers" or name.startswith("helpers.")) and not name.startswith(
        "helpers.checks")


def _spaces(_CACHE=_CACHE):
    """(name, owner, namespace dict, private names watched) of every watched module and class;
    recomputed when the set of imported modules changes."""
    if _CACHE["modules"] != len(sys.modules):
        found = {id(m): m for m in _FIXED}
        for name, mod in list(sys.modules.items()):
            if _own(mod):
                found.setdefault(id(mod), mod)
            if name.split(".")[0] == "helpers" and isinstance(mod, types.ModuleType):
                if _course_module(name):
                    found.setdefault(id(mod), mod)      # checks import from the course after
                for value in list(vars(mod).values()):
                    if isinstance(value, types.ModuleType) and not _private(value.__name__) \
                            and not value.__name__.startswith(("__main__", "torch.ops")):
                        found.setdefault(id(value), value)   # (torch.ops: ops load lazily)
        own = tuple(c for m in found.values() if _own(m) for c in list(vars(m).values())
                    if isinstance(c, type) and c.__module__ == m.__name__)
        _CACHE["spaces"] = tuple((m.__name__, m, vars(m), False) for m in found.values()) + tuple(
            (f"{c.__module__}.{c.__qualname__}", c, c.__dict__, True) for c in own) + tuple(
            (f"{c.__module__}.{c.__name__}", c, c.__dict__, False) for c in _CLASSES) + tuple(
            (getattr(c, "__name__", "torch._C"), c, vars(c), True) for c in _C_SPACES)
        _CACHE["views"] = tuple(ns for _, _, ns, _ in _CACHE["spaces"])
        # their version tags' reader (None: no tags here); each one's last copy and last scan
        _CACHE.update(tags=versions.reader(_CACHE["views"]), copies={}, verified={})
        _CACHE["defaults"] = defaults.held((name, ns) for name, _, ns, _ in _CACHE["spaces"])
        named = tuple(
            (f"{m.__name__}.{key}", cell) for m in found.values() if _own(m)
            for key, f in list(vars(m).items()) if type(f) is types.FunctionType
            and (_harness(f) or _harness(wrapped_by(f))) for cell in f.__closure__ or ())
        _CACHE["cells"] = named, tuple(cell for _, cell in named)
        _CACHE["modules"] = len(sys.modules)
    return _CACHE["spaces"], _CACHE["views"]


def snapshot(keys=True, _SHARED=_SHARED):
    """The watched namespaces and the threads alive before the answer ran: one snapshot shared
    by the answers running at once in one World run (its ranks), taken when the first of them
    starts. Each rank taking its own would record as original what another rank had already
    replaced, and put that back. `keys`: their keys read first (a copy of a dict compares its
    keys); an answer's call passes False, every window of the reader's code having ended with
    that read (late.inside) and the check's first snapshot made it (declare.judged_scan)."""
    run = world_run()
    with _LOCK:
        shared = _SHARED.setdefault(run, [0, None])
        if not shared[0]:
            odd = odd_keys() if keys else []
            spaces, views, copies, tagged = copied()
            shared[1] = (spaces, views, copies, cells(), held_defaults(), tables.kept(),
                         set(threading.enumerate()), imported.copy(), odd, tagged, run)
        shared[0] += 1
        return shared[1]


def copied(_CACHE=_CACHE):
    """The watched namespaces, a copy of each (kept while its version tag is unchanged:
    versions.py) and (the tags' reader, the tags read before the copies)."""
    spaces, views = _spaces()
    tags = _CACHE["tags"]
    now = tags() if tags else None
    return spaces, views, versions.copies(views, now, _CACHE["copies"]), (tags, now)


def odd_keys(_CACHE=_CACHE):
    """keys.taken_out for sys.modules and the watched namespaces (read after it, by name): of
    those, the ones changed since a scan found only str keys in them (all, without tags)."""
    read = []
    odd = taken_out(_MODULES, lambda: versions.unverified(*_spaces(), _CACHE, read),
                    versions.clean_keys)
    for tags, now, pick in read:        # scanned now; one that held an odd key lost it, which
        if tags is _CACHE["tags"]:      # gave it another tag than `now`'s
            _CACHE["verified"].update((i, now[i]) for i in pick)
    return odd


def cells(_CACHE=_CACHE):
    """The closure cells of the harness's own functions (a check's wrapper, `late.inside` and
    contextlib's wrapper of it) and what each holds now: a cell's contents can be set in place
    (`cell_contents = ...`) with no binding changed. (Their names, the cells, their contents.)"""
    named, held = _CACHE.get("cells", ((), ()))
    return named, held, _read_cells(held)


def _read_cells(held, _tuple=tuple, _map=map):
    """What each cell of `held` holds (_MISSING: empty), read in C by the cells' own getter."""
    try:
        return _tuple(_map(_CELL, held))
    except ValueError:      # an empty cell among them
        return _tuple(_map(_contents, held))


def held_defaults(_CACHE=_CACHE):
    """The watched functions' default-argument containers, what each holds now (a
    `__kwdefaults__` dict can be changed in place: defaults.py) and their tags read before."""
    held = _CACHE.get("defaults", ())
    tags = defaults.tags(held)
    return held, defaults.copy(held, tags), tags


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:      # an empty cell
        return _MISSING


def cells_changed(saved, _all=all, _map=map, _is=operator.is_):
    """The harness functions whose closure cells hold something else than in `saved` (from
    `cells()`; each put back). Every cell holding the very object it held is told in C, by
    identity; any other (or one emptied) goes to the cell-by-cell comparison."""
    named, held, values = saved
    try:
        if _all(_map(_is, _map(_CELL, held), values)):
            return []
    except ValueError:      # a cell emptied
        pass
    changed = []
    for (name, cell), value in zip(named, values, strict=True):
        if _contents(cell) is not value:
            changed.append(f"{name} (its closure)")
            if value is not _MISSING:
                cell.cell_contents = value
    return changed


def _own(module):
    """One of the harness's own modules (helpers.checks), or a class one defines (`Result`): its
    tables, constants and methods are what the verdicts read, judged by identity, private names
    and a class's dunders included (`Result.__bool__`)."""
    if issubclass(type(module), type):      # by exact types: an object of the reader's class
        name = _MODULE_OF(module)           # in sys.modules runs none of its code here
        return type(name) is str and _own(_MODULES.get(name))
    where = dict.get(vars(module), "__file__") if type(module) is types.ModuleType else None
    return type(where) is str and os.path.abspath(where).startswith(_CHECKS)


def _judged(owner, key, value):
    """Whether a name of the harness's own is judged: every name of its classes, and every one of
    its modules' but those `_judged_data` leaves."""
    return isinstance(owner, type) or _judged_data(key, value)


def _private(dotted):
    """A module or name the libraries keep to themselves (`torch._dynamo.utils`, `_stack`): they
    rebind those while they run (dynamo swaps its own helpers), and no check computes with them."""
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def _harness(value):
    """One of the harness's stand-ins (a World's torch.distributed, the tagging tensor methods, a
    ufunc's): a function whose code is helpers.checks' own (whose.genuine: not a copy compiled
    under a check file's name), or an object of a class whose methods all are; read by exact
    type, never by a `__module__` the reader can write."""
    fn = plain_function(value, answers=False)
    if fn is not None:
        return _checks_code(fn.__code__)
    methods = own_methods(type(value))
    return bool(methods) and all(_checks_code(f.__code__) for f in methods)


def _checks_code(code):
    name = code.co_filename
    return type(name) is str and os.path.abspath(name).startswith(_CHECKS) and genuine(code)


def _watched(value, space=""):
    """What the checks could call or read through (a function, a class, a descriptor such as a
    property, whose getter runs when the name is read), or one of math's constants; not a
    submodule. By exact reads (parts.descriptor): nothing of the reader's runs."""
    cls = type(value)
    return not issubclass(cls, types.ModuleType) and (
        _callable(value) or descriptor(value) or (space == "math" and issubclass(cls, float)))


def _library_wrapper(new, value, added=False):
    """A library's own wrapper of the original, made by an import the answer set off (importing
    torch._dynamo wraps torch.manual_seed): a plain function, not the reader's code by whose.py
    (a wrapper compiled under a library's file name is not that file's code), and it calls the
    original."""
    if type(new) is not types.FunctionType or reader_code(new.__code__):
        return False
    if added:       # a class's wrapper of an inherited method (the first Optimizer of a class
        inner = plain_function(value, answers=False)                           # hooks its step)
        return inner is not None and not reader_code(inner.__code__)
    return wrapped_by(new) is value


def _judged_data(key, value):
    """Whether a name of the harness's own module is judged: every one (`observe._NOT_WORK`,
    `inputs._ROUNDOFF`, `rank_numbers.ROUND_INT`, `expect`) but dunders and its submodules
    (the submodule rule's)."""
    return not (key.startswith("__") or isinstance(value, types.ModuleType))


def _harness_thread(thread):
    """A thread that runs the course's code (a World's rank), not one of the reader's."""
    target = getattr(thread, "_target", None)
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    return code is not None and os.path.abspath(code.co_filename).startswith(_HELPERS)


def _join_started(threads):
    """Wait a little for the threads started during the call; the names of those still alive.
    A worker that an executor made before the call started during it (`POOL.map` on a pool
    made earlier grows it) is the executor's like its earlier workers: once it waits on its
    empty queue it is not the answer's (early_threads.idle_worker)."""
    late = [t for t in threading.enumerate() if t not in threads and started_by_answer(t)
            and not _harness_thread(t)]
    alive, deadline = [], time.monotonic() + _JOIN_S
    for t in late:
        while t.is_alive() and not idle_worker(t, threads) and time.monotonic() < deadline:
            t.join(min(0.05, max(0.0, deadline - time.monotonic())))
        if t.is_alive() and not idle_worker(t, threads):
            alive.append(t.name)
    return alive


def expect_unpatched(name, before, _SHARED=_SHARED):
    """CheckFailed naming what the answer replaced in a library the checks use (each is put
    back first), or the thread it left running. Called once for every snapshot(), also when
    the answer raised (a replaced function must not outlive a failed answer either)."""
    try:
        changed, alive, swapped, odd = _put_back(before)
    finally:
        with _LOCK:
            shared = _SHARED[before[-1]]
            shared[0] -= 1
            if not shared[0]:
                del _SHARED[before[-1]]
    if odd:
        raise CheckFailed(odd_keys_message(name, odd))
    if swapped:
        raise CheckFailed(
            f"{name} replaced or removed {', '.join(swapped[:3])}: the check goes on importing "
            "modules after your function returns (`from helpers import ...`), so it may not "
            "change the table of imported modules (the originals are put back). Import what you "
            "need under your own names instead of editing sys.modules")
    if changed:
        raise CheckFailed(
            f"{name} replaced {', '.join(sorted(changed)[:3])}: the check goes on computing with "
            "the libraries after your function returns, so it may not change them (the originals "
            "are put back). Compute the result with your own names instead of rebinding a "
            "library's (or changing its functions' defaults)")
    if alive:
        raise CheckFailed(
            f"{name} returned while a thread it started ({alive[0]}) still ran: it could change "
            "what the check computes with after your function returned. Join every thread you "
            "start (or leave the executor's `with` block) before returning")


def _put_back(before):
    """The names of what was replaced (each put back), the answer's threads still alive, and the
    entries of sys.modules replaced (each put back).
    The harness's stand-ins come and go on their own schedule: one installed during the call
    is not the answer's; one the answer found and that is gone is a change (it replaced or
    deleted the stand-in), never put back (its owner puts torch's original back when it ends;
    a rank still running after its World ended must not reinstall a stale stand-in)."""
    spaces, views, copies, closures, held, kept, threads, modules, odd, (tags, then), _ = before
    alive = _join_started(threads)
    # sys.modules' keys before a lookup in it, its entries first: what the rest imports is
    odd = [*odd, *taken_out(_MODULES, lambda: ((), ()), versions.clean_keys)]   # the original
    swapped = imported.changed(modules)
    changed = cells_changed(closures) + defaults.changed(*held) + tables.changed(kept)
    tagged = tags() if tags else None   # the same dicts' tags as before the call
    if (tagged == then) if tags else same(copies, views, _all_spaces=True):   # (keys: strs)
        return changed, alive, swapped, odd
    moved = versions.moved(tagged, then, len(views))
    odd += taken_out({}, lambda: tuple(tuple(x[i] for i in moved) for x in (spaces, views)))
    for i, ((space, owner, _, private), saved, now) in enumerate(zip(spaces, copies, views,
                                                                       strict=True)):
        if (tags and tagged[i] == then[i]) or same(saved, now):
            continue
        own = _own(owner)
        for key, value in saved.items():
            new = now.get(key, _MISSING)
            if new is value:
                continue
            if own and _judged(owner, key, value):     # the harness's own tables and names
                changed.append(f"{space}.{key}")
                setattr(owner, key, value)
                continue
            if isinstance(value, types.ModuleType) and not (_private(key) and not private):
                changed.append(f"{space}.{key}")   # a submodule rebound (`torch.linalg = m`):
                _restore(owner, key, value)        # the check's lookups would reach the reader's
                continue
            held = value if new is _MISSING else new    # judged by what the name holds now
            if (_private(key) and not private) or not _watched(held, space) \
                    or _harness(new) or _library_wrapper(new, value):
                continue
            changed.append(f"{space}.{key}")
            if not _harness(value):
                _restore(owner, key, value)
        for key in now.keys() - saved.keys():
            if own and _judged(owner, key, now[key]):   # a name added to the harness's own
                changed.append(f"{space}.{key}")        # (a property on `Result`)
                delattr(owner, key)
            elif (private or not _private(key)) and _watched(now[key], space) \
                    and not _harness(now[key]) and not _library_wrapper(
                        now[key], wrapped_by(now[key]), added=True):
                changed.append(f"{space}.{key}")
                delattr(owner, key)
    return changed, alive, swapped, odd


del _CACHE, _SHARED


def _restore(owner, key, value):
    """Put `value` back as owner.key (a C type's attribute may be read-only: then it was never
    changed)."""
    try:
        setattr(owner, key, value)
    except (AttributeError, TypeError):
        pass
