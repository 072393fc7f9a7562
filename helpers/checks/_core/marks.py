"""Who started a thread and which work the harness carried, kept by identity in sets the
harness holds (in closures), never as attributes of the thread or function: a reader's Thread
class can drop an attribute (`__setattr__`), and a cell can preset one on any object it reaches.
"""
import types
import weakref

__all__ = ["registries"]


def _registry():
    """(add, has): `add(obj)` notes `obj` by identity while it lives; `has(obj)` says whether it
    was noted (by `id` and the object itself: no `__eq__`/`__hash__` of the reader's is asked)."""
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
    return types.SimpleNamespace(add=add, has=has)


def registries():
    """The harness's marks: threads started while an answer ran (`started`), threads the
    reader's code started before (`reader`), functions submit() wrapped with the answer's modes
    (`carried`), executor work items made while an answer ran (`made`)."""
    return types.SimpleNamespace(started=_registry(), reader=_registry(),
                                 carried=_registry(), made=_registry())
