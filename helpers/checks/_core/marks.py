"""Who started a thread and which work the harness carried, kept by identity in sets the
harness holds (in closures), never as attributes of the thread or function: a reader's Thread
class can drop an attribute (`__setattr__`), and a cell can preset one on any object it reaches.
"""
import types
import weakref

__all__ = ["registries"]


def _registry():
    """(add, has, drop): `add(obj)` notes `obj` by identity while it lives; `has(obj)` says
    whether it was noted (by `id` and the object itself: no `__eq__`/`__hash__` of the reader's
    is asked); `drop(obj)` forgets it."""
    held = {}

    def add(obj):
        key = id(obj)

        def gone(ref):
            if held.get(key) is ref:
                held.pop(key, None)
        try:
            held[key] = weakref.ref(obj, gone)
        except TypeError:              # not weakly referable: held (its id stays its own)
            held[key] = lambda: obj

    def has(obj):
        ref = held.get(id(obj))
        return ref is not None and ref() is obj

    def drop(obj):
        ref = held.get(id(obj))
        if ref is not None and ref() is obj:
            held.pop(id(obj), None)
    return types.SimpleNamespace(add=add, has=has, drop=drop)


def registries():
    """The harness's marks: threads started while an answer ran (`started`), threads the
    reader's code started before (`reader`), functions submit() wrapped with the answer's modes
    (`carried`), executor work items made while an answer ran (`made`), the rank threads of
    the World running now (`ranks`: observed by its per-rank modes)."""
    return types.SimpleNamespace(started=_registry(), reader=_registry(),
                                 carried=_registry(), made=_registry(), ranks=_registry())
