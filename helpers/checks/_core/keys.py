"""Keys of the dicts the reader's code can write into (its module's globals, the libraries'
namespaces, `sys.modules`), read before the harness looks a name up in one: a key of the
reader's class whose `__hash__` copies a name's would have each lookup of that name run its
`__eq__` (CPython compares keys of equal hash), inside the harness, between the answer's
windows. A dict whose keys are all exact strs is looked up with no Python-level comparison."""
import gc
import itertools
import operator

__all__ = ["str_keys", "plain_keys", "drop_odd_keys", "taken_out", "proxied", "odd_keys_message"]

_STRS = itertools.repeat(str)    # (one endless iterator, read in C)
_DROPPED = []    # what drop_odd_keys took out of a namespace: held, so no `__del__` runs


def str_keys(space, _all=all, _map=map, _is=operator.is_, _type=type,
             _str=_STRS, _chain=itertools.chain.from_iterable, _tries=range(100)):
    """Whether every key of `space` (a plain dict or a class's mappingproxy; a tuple of them:
    each one's) is an exact str, tested in C: no key hashed, no `__eq__` or attribute of one
    read, the callables bound at import (a replaced `builtins.all` changes nothing here). Read
    again when another thread changed a dict while it was read (a collection started by an
    iterator's allocation can run a finalizer, which lets another rank's lazy import in)."""
    for _ in _tries:
        keys = _chain(space) if _type(space) is tuple else space
        try:
            return _all(_map(_is, _map(_type, keys), _str))
        except RuntimeError:    # "dictionary changed size during iteration"
            continue
    return False                # (then each namespace is read on its own)


def plain_keys(space, _type=type, _keys=dict.keys):
    """Whether every key of the plain dict `space` is an exact str or int, or an exact tuple of
    those (a cache's `(n, k)`): keys that are compared in C."""
    for k in _keys(space):
        kind = _type(k)
        if not (kind is str or kind is int or (kind is tuple and all(
                _type(x) is str or _type(x) is int for x in k))):
            return False
    return True


def drop_odd_keys(space, _items=dict.items, _clear=dict.clear, _update=dict.update,
                  _type=type):
    """Take every key that is not an exact str out of the plain dict `space` with no lookup:
    its items read in order, the dict emptied and refilled with the others (`del` and `pop`
    would run the odd key's `__eq__`); what was taken is held, so no `__del__` of it runs."""
    items = list(_items(space))
    kept = [(k, v) for k, v in items if _type(k) is str]
    _DROPPED.append(items)
    _clear(space)
    _update(space, kept)


def taken_out(modules, spaces, scan=str_keys):
    """The names of the namespaces holding a key that is not an exact str, each such key taken
    out: `modules` (`sys.modules`, read by `scan`: versions.clean_keys skips it while it is
    unchanged since a clean scan) first, then those of `spaces()` (patched.py's (name, owner,
    namespace, _) of each, and the namespaces: a module's dict or a class's mappingproxy)."""
    odd = []
    if not scan(modules):
        drop_odd_keys(modules)
        odd.append("sys.modules")
    spaces, views = spaces()    # (read once `modules` is clean: it is read by name)
    if not str_keys(views):
        for name, _, space, _ in spaces:
            if not str_keys(space):
                odd.append(name)
                drop_odd_keys(proxied(space))
    return odd


def proxied(space):
    """The dict itself: a module's, or the one a class's mappingproxy shows (a key gets there
    only through the collector's referents: type's setattr takes strs only)."""
    if type(space) is dict:
        return space
    return next(r for r in gc.get_referents(space) if type(r) is dict)


def odd_keys_message(name, odd):
    """The failure for a key that is not a str put into the namespace `odd[0]`."""
    return (f"{name} put a key that is not a str into {odd[0]}: the check looks names up there "
            "after your function returns, and each lookup would run that key's code (it is "
            "taken out). Bind only names there, or nothing: compute with your own objects")
