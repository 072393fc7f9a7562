"""While an answer runs, torch's dispatch switches (`_DISPATCH_OFF_NAMES`, which references.py
also refuses by name: `_DisableTorchDispatch`, `_disable_current_modes`, ...) are guarded in
every loaded torch module: called from the reader's code (the first frame past the standard
library), one is refused, so a switch reached by a name built at run time
(`getattr(torch._C, "_Disable" + "TorchDispatch")`) fails like one named in the code (which
references.scan refuses before the answer runs); torch's own calls go through to the original.
Used by guard.answering.
"""
import itertools
import operator
import sys

from . import versions
from .guard import _passes_on, refuse
from .run import ReferenceUsed, is_reader_code, stand_in

# what switches off torch's dispatch interception, which the Recorder and the ranks' ownership
# watch through: under it an answer's operations would run unseen (references.py refuses names)
_DISPATCH_OFF_NAMES = frozenset({"_DisableTorchDispatch", "_ExcludeDispatchKeyGuard",
                       "_disable_current_modes", "_pop_torch_dispatch_stack",
                       "_unset_dispatch_mode", "_pop_mode",
                       "_pop_mode_temporarily", "_DisablePythonDispatcher",
                       "_disable_infra_mode", "_pop_torch_function_stack"})

__all__ = ["guard_switches", "restore_switches"]

_PATCHED = []       # (module, name, original)


def _guarded(name, original):
    @stand_in(original)
    def switch(*args, **kwargs):
        frame = sys._getframe(1)
        while frame is not None and _passes_on(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None and is_reader_code(frame.f_code.co_filename):
            message = (f"your code switches off torch's dispatch ({name}): the check watches "
                       "your operations through it, so an answer must run them in plain view")
            refuse(message)
            raise ReferenceUsed(message)
        return original(*args, **kwargs)
    return switch


def _torch_spaces(_list=list, _len=len, _all=all, _map=map, _is=operator.is_,
                  _cache={"loaded": [], "spaces": ()}):   # noqa: B006 (the cache, on purpose)
    """(module, its namespace dict) of every loaded torch module: rebuilt only when sys.modules
    holds other modules than at the last call (compared by identity, in C). The cache is a
    default argument, no module attribute: code of the reader's that reached this module by a
    name built at run time cannot make it list no module (no switch guarded at its next call)."""
    modules = dict.copy(sys.modules)   # at once, in C: another rank's thread may import
    loaded = _list(modules.values())
    if _len(loaded) != _len(_cache["loaded"]) or not _all(_map(_is, loaded, _cache["loaded"])):
        found = []
        for mod_name, module in modules.items():
            if module is None or not mod_name.startswith("torch"):
                continue
            space = getattr(module, "__dict__", None)
            if isinstance(space, dict):
                found.append((module, space))
        _cache["loaded"], _cache["spaces"] = loaded, tuple(found)
    return _cache["spaces"]


def _make_named():
    """named(spaces): (module, its names among the switches') of each of `spaces` holding one.
    A module's names are read again only when its dict's version tag (versions.py: any key or
    value added, replaced or removed gives a new one) is not the one read before its last read;
    with no tags, every time. The tags and names are kept in this closure: no module attribute
    leads to them, so no code of the reader's can mark a module read."""
    kept = {"spaces": None, "tags": None, "seen": [], "names": []}

    def named(spaces, _ne=operator.ne, _compress=itertools.compress, _len=len, _range=range,
              _list=list, _map=map, _tuple=tuple):
        if kept["spaces"] is not spaces:    # (the tuple _torch_spaces rebuilds: held here)
            kept.update(spaces=spaces, tags=versions.reader(_tuple(s for _, s in spaces)),
                        seen=[None] * _len(spaces), names=[()] * _len(spaces))
        tags, seen, names = kept["tags"], kept["seen"], kept["names"]
        now = tags() if tags is not None else (None,) * _len(spaces)
        stale = _range(_len(spaces)) if tags is None else _compress(
            _range(_len(spaces)), _map(_ne, now, seen))
        for i in _list(stale):       # (the tag read before the names: a change meanwhile
            names[i] = _tuple(spaces[i][1].keys() & _DISPATCH_OFF_NAMES)   # reads them again)
            seen[i] = now[i]
        return [(spaces[i][0], spaces[i][1], names[i]) for i in _compress(
            _range(_len(spaces)), names)]
    return named


_named = _make_named()


def guard_switches(*, _PATCHED=_PATCHED):
    """Put the guarded switches in place of the originals, in every loaded torch module (each
    module's names looked up by the switches' names: a dict view's `&` with the small set, read
    again only for a module changed since: `_named`)."""
    originals = {}
    for module, space, names in _named(_torch_spaces()):
        for name in names:
            value = space[name]
            if not callable(value) or not str(getattr(value, "__module__", "")).startswith(
                    "torch"):
                continue
            if id(value) not in originals:
                originals[id(value)] = _guarded(name, value)
            _PATCHED.append((module, name, value))
            setattr(module, name, originals[id(value)])


def restore_switches(*, _PATCHED=_PATCHED):
    for module, name, value in reversed(_PATCHED):
        setattr(module, name, value)
    _PATCHED.clear()


del _PATCHED
