"""The harness's own tables bound as module globals and read while answers run (a check's words,
torch's flop formulas, the registry of checks): code of the reader's that reached one by a name
built at run time could change it in place, which no binding shows (patched.py compares bindings
by identity). Each is compared around every window of the reader's code (patched.py, late.py):
by its version tag (versions.py), else item by item, with a copy kept when it last changed
outside a window; a change fails the window and is put back. The harness's live state (what it
changes while answers run) is held as functions' default arguments instead, which guard.py keeps
from the reader's code while an answer runs; LIVE names each mutable container a harness module
still binds, and why (tests/test_checks_harness_globals.py fails for one in neither list)."""
import operator
import sys
import types

from . import versions

__all__ = ["READ_ONLY", "LIVE", "kept", "changed"]

_BASE = __name__.rsplit("._core.", 1)[0]     # "helpers.checks" (or the fresh copy's name)
_MISSING = object()
# (module under helpers.checks, name): nothing writes them while answers run
READ_ONLY = (
    ("_core.declare", "REGISTRY"), ("_core.bytecode", "_SAME"),
    ("_core.cuda_calls", "ACCELERATOR"), ("_core.dist_bound", "ALIASES"),
    ("_core.held", "_AT_IMPORT"), ("_core.hooks", "_TENSOR_TABLES"),
    ("_core.inflight", "COMM_FIX"), ("_core.observe", "_FLOPS"), ("_core.reach", "_FUNC"),
    ("_core.waits", "_COMM_FIX"), ("_core.whose", "_FROZEN"), ("costs", "OPTIMIZER_STATE_BYTES"),
    ("dataparallel", "_CUDA_ONLY"), ("dataparallel", "_OWNERS"), ("dataparallel", "_ORIGINALS"),
    ("tensor_parallel_dist", "_ONE"), ("tensor_parallel_dist", "_REBUILDS"),
    ("tensor_parallel_dist", "_LOGITS"), ("zero", "_NOT_RS"), ("_core.groups", "_OUTSIDE"),
    ("_core.stream_races", "_READ_OUT"))
# tables an import adds to (torch registers a flop formula, a check module registers its checks):
# an entry added is kept, one replaced or removed is a change
_GROWS = frozenset({("_core.observe", "_FLOPS"), ("_core.declare", "REGISTRY")})
_SHARED = "shared by every import of the course through guard.py's hook (one set per process)"
_KEEPS = "keeps objects alive (emptied, what a failed answer left may run later: it fails already)"
LIVE = types.MappingProxyType({
    ("_core.addresses", "_WATCHERS"): _SHARED, ("_core.exits", "_WATCHERS"): _SHARED,
    ("_core.exits", "_ENTERED"): _SHARED, ("_core.exits", "_SAVED"): _SHARED,
    ("_core.storage_exits", "_WATCHERS"): _SHARED, ("_core.storage_exits", "_ENTERED"): _SHARED,
    ("_core.defaults", "_KEPT"): _KEEPS, ("_core.hooks", "_KEPT"): _KEEPS,
    ("_core.keys", "_DROPPED"): _KEEPS, ("_core.left_later", "_KEPT"): _KEEPS,
    ("_core.modes", "_KEPT"): _KEEPS,
    ("_core.callbacks", "_GC"): "gc.callbacks itself, judged by callbacks.py around each window",
    ("_core.imported", "MODULES"): "sys.modules itself, judged by imported.py around each window",
    ("_core.patched", "_MODULES"): "sys.modules itself, judged by imported.py around each window",
    ("_core.compile_ready", "_DONE"): "set, torch.compile's installs land in the answer's own "
                                      "window, which then fails: only stricter",
    ("_core.numpy_work", "_ACTIVE"): "each block counts the records it saw (defaults): an "
                                     "emptied list fails the block",
})


def _tables(_s):
    """(label, dict, grows) of READ_ONLY's loaded tables, found again when modules were imported;
    their tags' reader and a copy of each."""
    if _s["modules"] != len(sys.modules):
        found = []
        for module, name in READ_ONLY:
            space = getattr(sys.modules.get(f"{_BASE}.{module}"), "__dict__", None)
            table = space.get(name) if type(space) is dict else None
            if type(table) is dict:
                found.append((f"{_BASE}.{module}.{name}", table, (module, name) in _GROWS))
        dicts = tuple(t for _, t, _ in found)
        _s.update(modules=len(sys.modules), found=tuple(found), tags=versions.reader(dicts),
                  copies=tuple(dict(t) for t in dicts), then=None)
    return _s


def kept(_s={"modules": -1}):           # noqa: B006 (the state, on purpose: no module attribute)
    """Before a window: the tables, their tags and a copy of each (made again for a table changed
    since, outside a window: an import, a cell between two checks)."""
    _tables(_s)
    tags = _s["tags"]
    now = tags() if tags else None
    if tags and now != _s["then"] and _s["then"] is not None:
        _s["copies"] = tuple(dict(t) if a != b else c for (_, t, _), c, a, b in zip(
            _s["found"], _s["copies"], now, _s["then"], strict=True))
    elif not tags:
        _s["copies"] = tuple(dict(t) for _, t, _ in _s["found"])
    _s["then"] = now
    return _s["found"], _s["copies"], tags, now


def changed(saved, _is=operator.is_):
    """After a window: the tables changed in place since `saved` (from `kept`), each put back."""
    found, copies, tags, then = saved
    if tags and tags() == then:
        return []
    out = []
    for (label, table, grows), copy in zip(found, copies, strict=True):
        if len(table) == len(copy) and all(map(_is, table.values(), copy.values())) and all(
                map(_is, table, copy)):
            continue
        lost = [k for k, v in copy.items() if table.get(k, _MISSING) is not v]
        added = [k for k in list(table) if k not in copy]
        if not lost and (grows or not added):
            continue
        out.append(label)
        for key in added if not grows else ():
            del table[key]
        table.update((k, copy[k]) for k in lost)
    return out
