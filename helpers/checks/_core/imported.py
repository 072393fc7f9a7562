"""The table of imported modules (`sys.modules`) as patched.py and late.py judge it: a copy taken
before the reader's code runs, and after it the entries replaced or removed (each put back).
The copy carries the table's version tag read before it (versions.py): a table whose tag is the
same afterwards holds the very keys and values it held then, with no comparison of its entries
(about 2,500, compared after every call of an answer)."""
import itertools
import operator
import sys

from . import versions

__all__ = ["MODULES", "copy", "changed"]

MODULES = sys.modules   # the import system's table, bound at import (`sys.modules` can be rebound)
_MISSING = object()
_TAG = versions.reader((MODULES,))      # None where this Python keeps no tags


def copy():
    """(the table's tag, read first, or None; a plain copy of it)."""
    return (_TAG()[0] if _TAG is not None else None), MODULES.copy()


def changed(saved, _is=operator.is_, _all=all, _map=map, _len=len,
            _islice=itertools.islice):
    """The entries of `sys.modules` (`saved`: a `copy()`) that hold another module object now,
    or none (a removed entry included), each put back; so is `sys.modules` itself if rebound.
    Compared by identity in C (no `__eq__` of a module of the reader's runs); entries added
    since the copy are new imports, and pass."""
    out = []
    if sys.modules is not MODULES:
        out.append("sys.modules itself")
        sys.modules = MODULES
    tag, saved = saved
    if tag is not None and _TAG()[0] == tag:     # not changed since the copy
        return out
    n = _len(saved)
    try:        # unchanged: the copied entries are still the first n, in order, by identity
        if _len(MODULES) >= n and _all(_map(_is, saved, _islice(MODULES, n))) and _all(
                _map(_is, saved.values(), _islice(MODULES.values(), n))):
            return out
    except RuntimeError:        # another thread's import added an entry while it was read
        pass
    now = MODULES.copy()
    for key, value in saved.items():
        new = now.get(key, _MISSING)
        if new is not value:
            out.append(f"sys.modules[{key!r}]" + (" (removed)" if new is _MISSING else ""))
            MODULES[key] = value
    return out
