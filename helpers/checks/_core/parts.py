"""The parts of the reader's function the harness reads (its name, module globals, closure),
read by exact type: the plain function behind a partial, a bound method or an `Answer`, never an
attribute of an object of the reader's class (a `__name__` property or a `__getattr__` would
run the reader's code between the answer's watched windows)."""
import functools
import types

import torch

from .keys import str_keys
from .settle import Guarded
from .versions import clean_keys

__all__ = ["plain_function", "function_globals", "function_closure", "function_name",
           "module_name", "plain_globals", "class_mro", "class_attribute", "own_dict",
           "instance_dict", "dict_pairs", "module_tree", "base_items", "descriptor",
           "own_methods", "wrapped_by"]

_DEPTH = 8
class_mro = type.__dict__["__mro__"].__get__     # a class's MRO, from `type` (no metaclass runs)
_CLASS_DICT = type.__dict__["__dict__"].__get__
_PLAIN_CLASS_PARTS = (str, type(None), types.FunctionType, types.GetSetDescriptorType,
                      types.MemberDescriptorType)


def class_attribute(cls, name):
    """`name` as the classes of `cls`'s MRO define it, read from their dicts (None if none):
    no metaclass `__getattribute__` runs."""
    for c in class_mro(cls):
        held = _CLASS_DICT(c)
        if not str_keys(held):      # a class made by `type(name, bases, {odd_key: ...})`
            held = {k: v for k, v in held.items() if type(k) is str}
        if name in held:
            return held[name]
    return None


def descriptor(value):
    """Whether `value`'s class defines `__get__`, `__set__` or `__delete__` (a property, a
    classmethod, any descriptor): set on a class, it runs code when the name is read. Read from
    the MRO's dicts: nothing of the reader's runs."""
    cls = type(value)
    return any(class_attribute(cls, name) is not None
               for name in ("__get__", "__set__", "__delete__"))


def own_methods(cls):
    """The plain functions in `cls`'s own dict, if `cls` derives from `object` alone and its dict
    holds nothing else but text and C slots (`__dict__`, `__slots__` members); else []. Read from
    `type`'s slots: no metaclass runs."""
    held, mro = list(_CLASS_DICT(cls).values()), class_mro(cls)
    if len(mro) != 2 or mro[1] is not object or not all(
            any(type(v) is t for t in _PLAIN_CLASS_PARTS) for v in held):
        return []
    return [v for v in held if type(v) is types.FunctionType]


def wrapped_by(fn):
    """The `__wrapped__` a plain function holds in its own dict (functools.wraps), or None."""
    held = fn.__dict__ if type(fn) is types.FunctionType else None
    return dict.get(held, "__wrapped__") if type(held) is dict and str_keys(held) else None


def plain_function(fn, answers=True):
    """The plain function `fn` calls, unwrapped by exact type (through a partial, a bound
    method and, with `answers`, the harness's Answer); None for any other callable."""
    for _ in range(_DEPTH):
        cls = type(fn)
        if cls is types.FunctionType:
            return fn
        if cls is functools.partial:
            fn = fn.func                      # a member of the exact type: no code of the reader's
        elif cls is types.MethodType:
            fn = fn.__func__
        elif answers and issubclass(cls, Guarded):
            fn = object.__getattribute__(fn, "fn")   # the harness's Answer (no __getattr__)
        else:
            return None
    return None


def plain_globals(fn):
    """Whether the plain function behind `fn` (if any) has a plain dict as its globals, keyed by
    exact strs: a function made with a dict subclass (`types.FunctionType(code, MyDict())`,
    `exec`) would run the reader's `get`, `__getitem__` or `values` wherever the harness reads
    them, and a key of the reader's class its `__eq__` (str_keys; read again only once they
    changed: versions.clean_keys)."""
    f = plain_function(fn)
    return f is None or (type(f.__globals__) is dict and clean_keys(f.__globals__))


def function_globals(fn):
    """The module globals of the plain function behind `fn`, if a plain dict keyed by exact
    strs; else None."""
    f = plain_function(fn)
    g = f.__globals__ if f is not None else None
    return g if type(g) is dict and clean_keys(g) else None


def module_name(g):
    """The `__name__` a module's globals hold, if a plain str (else "")."""
    name = dict.get(g, "__name__", "") if type(g) is dict and clean_keys(g) else ""
    return name if type(name) is str else ""


def function_closure(fn):
    """The closure cells of the plain function behind `fn` (a tuple, maybe empty)."""
    f = plain_function(fn)
    return (f.__closure__ or ()) if f is not None else ()


def function_name(fn, default):
    """The name of the plain function behind `fn`, if a plain str; else `default`."""
    f = plain_function(fn)
    name = f.__name__ if f is not None else None
    return name if type(name) is str else default


def instance_dict(obj):
    """`obj`'s instance dict as the getter Python made for the first class of its MRO that has
    one gives it (a `__dict__` property or `__getattribute__` of the reader's class never runs);
    None if it has no plain dict."""
    for c in reversed(class_mro(type(obj))):
        getter = class_attribute(c, "__dict__") if c is not object else None
        if type(getter) is types.GetSetDescriptorType:
            try:
                held = getter.__get__(obj)
            except TypeError:          # another class's getter, put there by the reader
                return None
            return held if type(held) is dict else None
    return None


def own_dict(obj):
    """instance_dict with only its exact-str keys (no key's `__eq__` runs on a lookup); {} for
    an object without one."""
    held = instance_dict(obj)
    if held is None:
        return {}
    return held if str_keys(held) else {k: v for k, v in dict.items(held) if type(k) is str}


_ITEMS = ((list, list.__iter__), (tuple, tuple.__iter__), (set, set.__iter__),
          (frozenset, frozenset.__iter__), (dict, dict.values))


def base_items(v):
    """The items of a list, tuple, set or frozenset, a dict's values (a subclass's read by the
    base type's own method: its `__iter__` or `values` never runs); None for anything else."""
    read = next((r for base, r in _ITEMS if issubclass(type(v), base)), None)
    return None if read is None else list(read(v))


def dict_pairs(d):
    """(key, value) of a dict, a subclass's read by dict's own method (its `items` never runs),
    a key that is not an exact str named "?"; () for anything else."""
    if not issubclass(type(d), dict):
        return ()
    return [(k if type(k) is str else "?", v) for k, v in dict.items(d)]


def module_tree(m):
    """(submodules, tensors) of module `m`, named and ordered as `named_modules` and
    `named_parameters` + `named_buffers` list them (each submodule once), read from the instance
    dicts by exact types: no method, property or container method of the reader's runs."""
    subs, tensors, seen = [], [], set()

    def walk(mod, name):
        if id(mod) in seen:
            return
        seen.add(id(mod))
        subs.append((name, mod))
        for key, sub in dict_pairs(own_dict(mod).get("_modules")):
            if issubclass(type(sub), torch.nn.Module):
                walk(sub, f"{name}.{key}" if name else key)
    walk(m, "")
    for kind in ("_parameters", "_buffers"):
        for name, mod in subs:
            for key, t in dict_pairs(own_dict(mod).get(kind)):
                if issubclass(type(t), torch.Tensor):
                    tensors.append((f"{name}.{key}" if name else key, t))
    return subs, tensors
