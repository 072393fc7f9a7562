"""The default arguments of the functions patched.py watches, compared by their contents. A
function's `__kwdefaults__` is a dict, and a mutable item of its `__defaults__` (a list, a dict, a
set) an object, that the answer can change in place (`AdamW.__init__.__kwdefaults__["maximize"]
= True`): no binding changes, the function stays the same object, and no audit event is raised
(guard.py refuses only a new `__kwdefaults__` or `__defaults__`), yet the check's reference built
after the call (`torch.optim.AdamW([q], lr=lr)`) would take the answer's keyword. So the contents
are copied with the bindings and compared wherever patched.py and late.py compare those, each
changed one put back.

Which functions: those bound in a watched namespace (a module's or a class's dict: methods,
static and class methods, properties' accessors, a partial's keywords) and the originals their
`functools.wraps` wrappers name; the reader's own functions are not judged (guard.py's rule). A
mutable default that is also a global of its function's module is the module's state (logging
keeps its handlers in one), not a default, and is left out; so is one of the harness's own
functions (its code genuine, from helpers/checks): its state, which its own calls change, held
there so that no module attribute leads to it (patched.py's kept copies)."""
import functools
import operator
import os
import types
import weakref

from . import versions
from .keys import str_keys
from .run import is_reader_function
from .whose import genuine

__all__ = ["held", "tags", "copy", "changed"]

_DEPTH = 8                  # how many `__wrapped__` links are followed
_MUTABLE = (dict, list, set)
_KEPT = []                  # what a put-back took out of a container: held, so none of it dies
_OWN = weakref.WeakKeyDictionary()   # a function -> (its defaults' objects, what they hold)
_CHECKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_KINDS = frozenset({types.FunctionType, staticmethod, classmethod, types.MethodType, property,
                    functools.partial})


def held(namespaces):
    """(label, mutable object) for every default-argument container of the functions bound in
    `namespaces` ((dotted name, namespace dict) pairs), each object once; read without running
    any code of the objects it meets (no getattr on them, exact types only)."""
    found, seen = [], set()

    def note(label, obj):
        if type(obj) in _MUTABLE and id(obj) not in seen:
            seen.add(id(obj))
            found.append((label, obj))

    def function(fn):
        for _ in range(_DEPTH):
            if type(fn) is not types.FunctionType or id(fn) in seen:
                return
            seen.add(id(fn))
            for label, obj in _own(fn):
                note(label, obj)
            fn = fn.__dict__.get("__wrapped__")

    for space, namespace in namespaces:
        for key, value in list(namespace.items()):
            kind = type(value)
            if kind not in _KINDS:
                continue
            if kind in (staticmethod, classmethod, types.MethodType):
                value = value.__func__
            elif kind is property:
                for part in (value.fget, value.fset, value.fdel):
                    function(part)
                continue
            elif kind is functools.partial:
                note(f"{space}.{key} (its keywords)", value.keywords)
                value = value.func
            function(value)
    return tuple(found)


def _own(fn):
    """(label, container) of `fn`'s own default arguments, kept while they are the same objects
    (the namespaces are read again whenever a module is imported)."""
    kw, pos = fn.__kwdefaults__, fn.__defaults__
    hit = _OWN.get(fn)
    if hit is not None and hit[0] is kw and hit[1] is pos:
        return hit[2]
    mutable = [(i, v) for i, v in enumerate(pos or ()) if type(v) in _MUTABLE]
    out = []
    if (kw is not None or mutable) and not is_reader_function(fn, None):
        name = f"{fn.__module__}.{fn.__qualname__}"
        if kw is not None:
            out.append((f"{name} (its __kwdefaults__)", kw))
        if not _harness(fn.__code__):          # the harness's state, not a default
            out += [(f"{name} (its __defaults__[{i}])", v) for i, v in mutable
                    if not any(g is v for g in fn.__globals__.values())]   # the module's state
    _OWN[fn] = (kw, pos, tuple(out))
    return _OWN[fn][2]


def _harness(code):
    name = code.co_filename
    return type(name) is str and os.path.abspath(name).startswith(_CHECKS) and genuine(code)


def _make():
    """tags, copy and changed, what they know of the last `objects` kept in this closure (no
    module attribute leads to it, so no code of the reader's can mark a dict scanned)."""
    kept = [None]

    def know(objects):
        """(objects, their containers, the positions of the lists and sets, the dicts' tags'
        reader, [the tags of the last clean copy]): one tuple, read at once, so ranks calling
        at once each get one whole (a new `objects`, after an import, makes a new one)."""
        known = kept[0]
        if known is None or known[0] is not objects:  # (held: the dicts' addresses their own)
            at = tuple(i for i, (_, obj) in enumerate(objects) if type(obj) is dict)
            known = kept[0] = (
                objects, tuple(obj for _, obj in objects),
                tuple(i for i, (_, obj) in enumerate(objects) if type(obj) is not dict),
                versions.reader(tuple(objects[i][1] for i in at)), [None])
        return known

    def tags(objects):
        """The version tags (versions.py) of the dicts of `objects` (from `held`), in order, read
        in C; None where this Python keeps none. Read before `copy`."""
        read = know(objects)[3]
        return read() if read is not None else None

    def copy(objects, then=None, _copy=operator.methodcaller("copy")):
        """What each container of `objects` holds now; of a dict, its items keyed by exact strs
        only (copying one whose keys are not all strs could run a key's `__eq__`: the dict then
        differs from its copy, and is put back to it). `then`: the dicts' tags read before; the
        same as at a copy that found only exact strs, every dict is as it was then, and all are
        copied in C (by their exact types' own `copy`) with no scan."""
        _, items, _, _, clean_at = know(objects)
        if then is not None and then == clean_at[0]:
            return tuple(map(_copy, items))
        out, clean = [], True
        for _, obj in objects:
            if type(obj) is not dict or str_keys(obj):
                out.append(type(obj)(obj))
            else:
                clean = False
                out.append(dict([(k, v) for k, v in dict.items(obj) if type(k) is str]))
        if clean and then is not None:
            clean_at[0] = then
        return tuple(out)

    def changed(objects, copies, then=None):
        """The labels of the containers whose contents differ from `copies` (each put back in
        place: the same object keeps its contents, so the function never gets a new one).
        `then`: the dicts' tags read before `copies`; the same now, and those of a copy with
        nothing left out, every dict is unchanged: only the lists and sets are compared."""
        _, _, others, _, clean_at = know(objects)
        fast = then is not None and then == clean_at[0] and tags(objects) == then
        out = []
        for i in others if fast else range(len(objects)):
            (label, obj), saved = objects[i], copies[i]
            if _alike(obj, saved):
                continue
            out.append(label)
            _KEPT.append(list(dict.items(obj)) if type(obj) is dict else list(obj))  # no __del__
            if type(obj) is list:
                obj[:] = saved
            else:
                obj.clear()
                obj.update(saved)
        return out
    return tags, copy, changed


tags, copy, changed = _make()


def _alike(obj, saved):
    """The same contents: a dict's keys and values and a list's items by identity, in order (no
    `__hash__` or `__eq__` of the reader's objects runs), a set's members by identity."""
    if len(obj) != len(saved):
        return False
    if type(obj) is dict:
        return all(ka is kb and va is vb for (ka, va), (kb, vb) in zip(
            obj.items(), saved.items(), strict=True))
    if type(obj) is list:
        return all(a is b for a, b in zip(obj, saved, strict=True))
    return all(any(a is b for b in saved) for a in obj)     # a set's members, by identity
