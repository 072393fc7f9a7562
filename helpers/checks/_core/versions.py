"""Version tags of the watched namespaces' dicts. CPython 3.11 to 3.13 keeps in every dict a tag
that changes at each change of its keys or values (PEP 509's `ma_version_tag`, read here through
ctypes): a namespace whose tag is the one read before an answer ran is unchanged, with no
comparison of its names (about 17,000 in the watched libraries, each compared at each call).
Where a Python keeps no such tag (3.14 on, a free-threaded build, another implementation) or the
self-test below finds another layout, `reader` gives None and patched.py compares every name."""
import ctypes
import itertools
import operator
import sys
import sysconfig

from .keys import proxied, str_keys

__all__ = ["reader", "copies", "unverified", "moved", "same", "clean_keys"]

# Bound at import, before any reader's code runs: ctypes' Python classes can be changed later
# (`ctypes.c_uint64.value = property(...)` would make every tag read alike); the C getter and
# the C constructor below cannot.
_U64 = ctypes.c_uint64
_AT = type(_U64).__dict__["from_address"]           # PyCSimpleType's, a C method
_VALUE = ctypes._SimpleCData.__dict__["value"].__get__
_USED = ctypes.c_ssize_t
_id, _map, _tuple, _dict, _range, _len, _list = id, map, tuple, dict, range, len, list


def _offset():
    """Where a dict keeps its tag (after PyObject_HEAD and `ma_used`), or None: only where a
    read of the count finds the length, and inserting, replacing, deleting, clearing and updating
    each give the dict a new tag, a class's attribute set through `setattr` too."""
    if sys.implementation.name != "cpython" or not (3, 11) <= sys.version_info[:2] <= (3, 13) \
            or sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    head = object.__basicsize__
    at = head + ctypes.sizeof(_USED)
    d = {"a": 1}
    used, tag = _AT(_USED, _id(d) + head), _AT(_U64, _id(d) + at)
    if _VALUE(used) != 1:
        return None
    seen = [_VALUE(tag), _VALUE(tag)]
    if seen[0] != seen[1]:
        return None
    for change in (lambda: d.__setitem__("a", 2), lambda: d.__setitem__("b", 3),
                   lambda: d.__delitem__("b"), d.clear, lambda: d.update(c=3)):
        change()
        seen.append(_VALUE(tag))
    if _VALUE(used) != 1 or len(set(seen)) != len(seen) - 1:
        return None

    class Probe:
        pass
    inner = proxied(Probe.__dict__)
    before = _VALUE(_AT(_U64, _id(inner) + at))
    Probe.x = 1
    return at if _VALUE(_AT(_U64, _id(inner) + at)) != before else None


_OFFSET = _offset()


def reader(spaces):
    """A function giving the tags of `spaces` (dicts or classes' mappingproxies) as one tuple of
    ints, read in C; None where this Python keeps no tags. The dicts are held by it."""
    if _OFFSET is None:
        return None
    dicts = _tuple(_map(proxied, spaces))
    cells = _tuple(_AT(_U64, _id(d) + _OFFSET) for d in dicts)

    def tags(_cells=cells, _held=dicts):
        return _tuple(_map(_VALUE, _cells))
    return tags


def _make_clean():
    """clean_keys, its record of clean scans in this closure: no module attribute leads to it,
    so code of the reader's that reached this module by a name built at run time cannot mark a
    dict scanned."""
    scanned = {}    # id(dict) -> (the dict, its tag's cell, the tag read before a clean scan)

    def clean_keys(space, _type=type, _dict=dict, _len=len):
        """keys.str_keys(space), skipped for a plain dict while its version tag is the one read
        before its last scan that found only exact strs: any key added since (a change of its
        keys or values) gave it another tag. The dict is held, so its address is its own."""
        if _OFFSET is None or _type(space) is not _dict:
            return str_keys(space)
        hit = scanned.get(_id(space))
        if hit is not None and hit[0] is space:
            cell = hit[1]
            tag = _VALUE(cell)
            if tag == hit[2]:
                return True
        else:
            cell = _AT(_U64, _id(space) + _OFFSET)
            tag = _VALUE(cell)
        if not str_keys(space):
            return False
        if _len(scanned) >= 4096:
            scanned.clear()
        scanned[_id(space)] = (space, cell, tag)
        return True
    return clean_keys


clean_keys = _make_clean()


def copies(views, now, kept, _ne=operator.ne, _compress=itertools.compress):
    """A plain copy of each of `views`, the one in `kept` (its "tags" and "held" copies, updated)
    where its tag in `now` (read before: a change while copying leaves the tag kept older than
    the dict's) is the one it was copied at, the tags compared in C; `now` None: every one
    copied afresh."""
    if now is None:
        return _tuple(_map(_dict, views))
    if "held" not in kept:
        kept.update(tags=[None] * _len(views), held=[None] * _len(views))
    tags, held = kept["tags"], kept["held"]
    for i in _list(_compress(_range(_len(now)), _map(_ne, now, tags))):
        tags[i], held[i] = now[i], _dict(views[i])
    return _tuple(held)


def unverified(spaces, views, cache, read):
    """Of the watched `spaces` and `views`, those whose tag is not the one of their last scan
    that found only str keys (`cache["verified"]`: {index: tag}); `read` gets (the reader, the
    tags, the indices picked), for the caller to mark them scanned once the scan is done."""
    tags = cache["tags"]
    if tags is None:
        return spaces, views
    now = tags()
    verified = cache["verified"]
    every = _range(_len(now))
    pick = _list(itertools.compress(every, _map(operator.ne, now, _map(verified.get, every))))
    read.append((tags, now, pick))
    return _tuple(spaces[i] for i in pick), _tuple(views[i] for i in pick)


def moved(tags, then, n):
    """The indices of the `n` namespaces whose tag is not the one read before (all, without
    tags)."""
    return [i for i in _range(n) if tags is None or tags[i] != then[i]]


def same(saved, now, _all_spaces=False, _list=list, _len=len, _all=all, _map=map,
          _is=operator.is_, _chain=itertools.chain.from_iterable,
          _values=operator.methodcaller("values")):
    """Whether `now` holds the very keys and values `saved` copied, in the same order (with
    `_all_spaces`, every namespace against its copy, in one pass): compared by identity in C, no
    __eq__ of anything run, so an unchanged namespace costs no Python loop; any difference (or a
    namespace changed while it was read) goes to the name-by-name comparison. The builtins it
    uses are bound at import: a replaced `builtins.all` must not make everything look unchanged."""
    if not _all_spaces:
        saved, now = (saved,), (now,)
    try:
        return _list(_map(_len, saved)) == _list(_map(_len, now)) and _all(
            _map(_is, _chain(saved), _chain(now))) and _all(
            _map(_is, _chain(_map(_values, saved)), _chain(_map(_values, now))))
    except RuntimeError:        # another thread's import added a name while it was read
        return False
