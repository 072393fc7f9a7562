"""What an answer returned, settled before its guarded call ends (declare.Answer): nothing of the
reader's code may run once the check converts or compares it.

After the call, the references are back, the guard is off and no Recorder watches: an object of
the reader's own class whose `__eq__`, `__iter__`, `__float__`, `__index__`, `__array__` or
`__torch_function__` computes (or calls the course's answer, or reads the check's expected
value) would do its work there. So, still inside the call:

- values the reader's code cannot run in pass as they are, decided by exact type: Python and
  numpy numbers, strings, bytes, None, dtypes, devices, enum members, ranges; the plain types
  that hold other objects (torch.Size, slice, Fraction's two slots) pass when what they hold
  does (`torch.Size([MyInt(3)])` keeps the reader's int, whose `__int__` the check would call);
- tensors and arrays of torch's and numpy's own classes pass with nothing set in their instance
  `__dict__` but plain data or torch's own (a fake tensor's mode) under names their class does
  not use (`t.to = f` would shadow Tensor.to, which the comparisons call), a leaf's `.grad`
  likewise, and so do a returned module's parameters and buffers and an optimizer's state;
  library containers (an OrderedDict's `items`) and objects of the course's classes pass with
  no method shadowed by an instance attribute;
- containers (lists, tuples, dicts, sets, deques) are walked; one of the reader's own container
  classes (a namedtuple, a list subclass) is rebuilt as the plain container, here;
- an iterator (a generator) is run to its end here, under the check's observers, and comes
  back as a list; functions, bound methods and partials come back guarded: each later call runs
  as the answer's, through a new `Answer` (`guarded`);
- modules and optimizers of torch's classes are walked: a module of the reader's own class is
  refused, the functions set on them or registered as hooks are guarded in place;
- anything else (an object of the reader's own class, a weakref proxy, a mock) is refused.
"""
import collections
import decimal
import enum
import fractions
import functools
import itertools
import numbers
import os
import sys
import types
import weakref
from collections.abc import Iterator

import numpy as np
import torch

from .run import CheckFailed, is_reader_code

__all__ = ["settle", "reader_class", "Guarded"]

# exact types with nothing of Python's inside (a range's bounds are made plain ints)
_ATOMS = frozenset({type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis),
                    torch.dtype, torch.device, torch.layout, torch.memory_format,
                    decimal.Decimal, np.dtype})
# exact types that keep the objects they were built from: passed when what they hold is
_HOLDERS = frozenset({slice, torch.Size, fractions.Fraction})
_PLAIN = (*_ATOMS, *_HOLDERS)
_SLOTS = (fractions.Fraction.__dict__["_numerator"], fractions.Fraction.__dict__["_denominator"])
_BARE = frozenset({dict, list, tuple, set, frozenset, collections.deque})
_COURSE = frozenset({"helpers", __name__.split(".")[0]})    # and the fresh copy's (fresh.py)
_CALLABLES = (types.FunctionType, types.MethodType, functools.partial, types.BuiltinFunctionType,
              types.BuiltinMethodType, types.MethodWrapperType, types.WrapperDescriptorType,
              types.MethodDescriptorType)
_HOOKS = ("_backward_hooks", "_post_accumulate_grad_hooks")     # a tensor's, run by autograd
_MAX_DEPTH = 64
_MAX_ITEMS = 100_000


def _code_file(v):
    """The file of the Python code behind `v` (a function, a method, a property ...) or None."""
    for attr in ("__func__", "fget", "func", "__wrapped__"):
        inner = getattr(v, attr, None) if not isinstance(v, type) else None
        if inner is not None and inner is not v:
            found = _code_file(inner)
            if found:
                return found
    code = getattr(v, "__code__", None)
    return code.co_filename if isinstance(code, types.CodeType) else None


_TORCH = os.path.dirname(torch.__file__) + os.sep
_IMMUTABLE = 1 << 8     # Py_TPFLAGS_IMMUTABLETYPE: a C type, which no class statement makes


def _library_class(c):
    """Whether `c` is torch's own: the functions it holds were all compiled from torch's files
    (a class of the reader's that claims torch's module, `C.__module__ = "torch"`, holds none)."""
    files = {_code_file(v) for v in vars(c).values()} - {None}
    return c.__module__.split(".")[0] == "torch" and bool(files) and all(
        f.startswith(_TORCH) for f in files)


# The classes whose methods are not walked, by identity (taken at import: torch's tensors,
# modules and optimizers; a class reached later by a name that claims a module is walked).
_LIBRARY = frozenset(c for c in (
    torch.Tensor, torch.nn.Parameter, getattr(torch.nn, "Buffer", torch.Tensor),
    torch.nn.Module, torch.optim.Optimizer, *(
        c for space in (torch.nn, torch.optim) for c in vars(space).values()
        if isinstance(c, type) and issubclass(c, (torch.nn.Module, torch.optim.Optimizer))))
    if _library_class(c))


_MODULE_OF = type.__dict__["__module__"].__get__


def reader_class(cls, _depth=2):
    """Whether `cls` or a class it derives from is the reader's: defined in the reader's module,
    or holding a function (or a callable object of a class of the reader's) whose code is in
    the reader's files, whatever `__module__` says; only C types and `_LIBRARY` go unwalked."""
    for c in cls.__mro__:
        if c is object or c in _LIBRARY or c.__flags__ & _IMMUTABLE:
            continue
        module = _MODULE_OF(c)      # type's own getter: a str, or the reader's object
        if type(module) is not str:     # (whose `__hash__`/`__eq__` a lookup would run)
            return True
        where = getattr(sys.modules.get(module), "__file__", None)
        if module == "__main__" or (where and is_reader_code(where)):
            return True
        for v in vars(c).values():
            file = _code_file(v)
            if file and is_reader_code(file):
                return True
            if file is None and _depth and callable(v) and reader_class(
                    v if isinstance(v, type) else type(v), _depth - 1):
                return True
    return False


def _refuse(name, x, where):
    cls = x if isinstance(x, type) else type(x)
    raise CheckFailed(
        f"{name} returned {where}a {cls.__name__}, an object of your own class (or one that runs "
        "code of yours when the check reads it): return a tensor, a number, a list of numbers or "
        "what the exercise asks for, not an object of your own class; the check converts and "
        "compares plain values itself")


class _Settler:
    def __init__(self, name, guarded):
        self.name, self.guarded, self.path = name, guarded, set()

    def __call__(self, x, depth=0):
        if type(x) in _ATOMS:
            return x
        if type(x) in _HOLDERS:
            return self._holder(x, depth)
        if isinstance(x, np.generic) and not reader_class(type(x)):
            if x.dtype.hasobject:
                _refuse(self.name, x, "a numpy scalar of objects: ")
            return x
        if depth > _MAX_DEPTH:
            raise CheckFailed(f"{self.name} returned values nested more than {_MAX_DEPTH} deep")
        if isinstance(x, (weakref.ProxyType, weakref.CallableProxyType)):
            _refuse(self.name, x, "a weakref proxy to ")
        if isinstance(x, type):
            if reader_class(x):
                _refuse(self.name, x, "the class itself: ")
            return x
        cls = type(x)
        if reader_class(cls):
            return self._own(x, depth)
        if id(x) in self.path:                      # a cycle: seen already on this path
            return x
        self.path.add(id(x))
        try:
            return self._library(x, cls, depth)
        finally:
            self.path.discard(id(x))

    def _own(self, x, depth):
        """An object of the reader's class: containers rebuilt plain (inside the call), else
        refused."""
        if isinstance(x, torch.Tensor):
            raise CheckFailed(f"{self.name} returned a {type(x).__name__}, a tensor subclass of "
                              "your own: return plain tensors, which the check compares itself")
        for base in (dict, list, tuple, set, frozenset):
            if isinstance(x, base):
                return self(base(x), depth)
        if isinstance(x, _CALLABLES):       # a bound method of the reader's object, say
            return self.guarded(x)
        _refuse(self.name, x, "")

    def _holder(self, x, depth):
        """A torch.Size, slice or Fraction: what it holds must be plain (or the harness's)."""
        if type(x) is slice:
            items = (x.start, x.stop, x.step)
        elif type(x) is torch.Size:
            items = tuple.__iter__(x)
        else:
            items = (_SLOTS[0].__get__(x), _SLOTS[1].__get__(x))
        for v in items:
            if type(v) not in _ATOMS and reader_class(type(v)):
                _refuse(self.name, v, f"a {type(x).__name__} holding ")
            self(v, depth + 1)
        return x

    def _library(self, x, cls, depth):
        if isinstance(x, torch.Tensor):
            self._hooks(x)
            self._own_attrs(x, "a tensor", strict=True)
            if x.is_leaf and x.grad is not None:
                self(x.grad, depth + 1)
            return x
        if isinstance(x, np.ndarray):
            self._own_attrs(x, "an array", strict=True)
            if x.dtype == object:
                for v in x.view(np.ndarray).ravel():
                    self(v, depth + 1)
            return x
        if isinstance(x, enum.Enum):
            return x
        if isinstance(x, numbers.Number) and _course_class(cls):
            self._own_attrs(x, "a number", strict=True)     # the ranks' tagged numbers
            return x
        if isinstance(x, (list, tuple, set, frozenset, collections.deque, dict)):
            return self._container(x, cls, depth)
        if isinstance(x, (types.MappingProxyType, collections.abc.KeysView,
                          collections.abc.ValuesView)):
            for v in x:
                self(v, depth + 1)
            return x
        if isinstance(x, torch.nn.Module):
            for m in x.modules():
                if reader_class(type(m)):
                    _refuse(self.name, m, "a module holding ")
                self._attrs(m)
                for t in (*m._parameters.values(), *m._buffers.values()):
                    self(t, depth + 1)
            return x
        if isinstance(x, torch.optim.Optimizer):
            self._attrs(x)
            self(x.param_groups, depth + 1)
            for p, state in list(x.state.items()):
                self(p, depth + 1)
                self(state, depth + 1)
            return x
        if isinstance(x, _CALLABLES):
            return self.guarded(x) if _runs_reader_code(x) else x
        if isinstance(x, Iterator):
            return self(_drain(self.name, x), depth + 1)
        if _course_class(cls):
            self._own_attrs(x, f"a {cls.__name__}", strict=False)
            return x
        _refuse(self.name, x, "")

    def _own_attrs(self, x, what, strict):
        """Refuse an instance attribute that would run in the check's later use of `x`: one that
        shadows its class's (`t.to = f`: Tensor's methods are non-data descriptors) or, when
        `strict` (tensors, arrays, numbers: a right answer sets none), any but plain data."""
        try:
            held = object.__getattribute__(x, "__dict__")
        except AttributeError:
            return
        if type(held) is not dict:
            _refuse(self.name, x, f"{what} whose __dict__ is ")
        for k, v in list(held.items()):
            if type(k) is str and not _shadows(type(x), k, strict) and (
                    not strict or _inert(v) or _torch_data(v)):
                continue
            name = k if type(k) is str else "an attribute"
            raise CheckFailed(
                f"{self.name} returned {what} with .{name} set on it: an attribute of your own "
                "on what you return would run when the check uses it (its comparisons call the "
                "object's own methods); return plain values, with nothing set on them")

    def _container(self, x, cls, depth):
        if cls not in _BARE:
            self._own_attrs(x, f"a {cls.__name__}", strict=False)
        if isinstance(x, dict):
            for k in list(x):
                self(k, depth + 1)
                v = x[k]
                new = self(v, depth + 1)
                if new is not v:
                    x[k] = new
            factory = getattr(x, "default_factory", None)
            if factory is not None:
                x.default_factory = self.guarded(factory)
            return x
        items = list(x)
        new = [self(v, depth + 1) for v in items]
        if all(a is b for a, b in zip(new, items, strict=True)):
            return x
        if cls is list:
            x[:] = new
            return x
        if cls in (tuple, set, frozenset):
            return cls(new)
        return list(new) if isinstance(x, (list, collections.deque)) else tuple(new)

    def _attrs(self, obj):
        """Functions set on a module or optimizer, and those in its hook dicts: guarded."""
        for k, v in list(vars(obj).items()):
            if isinstance(v, _CALLABLES) and _runs_reader_code(v):
                setattr(obj, k, self.guarded(v))
            elif isinstance(v, dict) and "hook" in k:
                self._guard_values(v)
            elif not isinstance(v, (dict, list, tuple, torch.Tensor, *_PLAIN)) and not isinstance(
                    v, (torch.nn.Module, weakref.ref)) and reader_class(type(v)):
                _refuse(self.name, v, f"an object whose .{k} is ")

    def _hooks(self, t):
        for name in _HOOKS:
            hooks = getattr(t, name, None)
            if isinstance(hooks, dict):
                self._guard_values(hooks)

    def _guard_values(self, hooks):
        for k, v in list(hooks.items()):
            if not isinstance(v, Guarded) and _runs_reader_code(v):
                hooks[k] = self.guarded(v)


def _runs_reader_code(f):
    """Whether calling `f` may run the reader's code: its code is in the reader's files, it is
    bound to an object of the reader's class, or it is a partial (its arguments could be)."""
    file = _code_file(f)
    if file and is_reader_code(file):
        return True
    owner = getattr(f, "__self__", None)
    return isinstance(f, functools.partial) or (
        owner is not None and not isinstance(owner, types.ModuleType)
        and reader_class(owner if isinstance(owner, type) else type(owner)))


def _shadows(cls, name, strict):
    """Whether an instance attribute `name` hides one of `cls`'s: any (`strict`), or one that
    runs when read (a method, a non-data descriptor, a callable)."""
    for c in cls.__mro__:
        if name in c.__dict__:
            held = c.__dict__[name]
            return strict or callable(held) or hasattr(type(held), "__get__")
    return False


def _inert(v, depth=0):
    """Plain data of exact builtin types (tuples and frozensets of them included)."""
    if type(v) in _ATOMS:
        return True
    return type(v) in (tuple, frozenset) and depth < 4 and all(_inert(u, depth + 1) for u in v)


def _torch_data(v):
    """torch's or the course's data (a fake tensor's mode): not callable, not the reader's."""
    cls = type(v)
    return (str(getattr(cls, "__module__", "")).split(".")[0] in ("torch", *_COURSE)
            and not callable(v)
            and not reader_class(cls))


class Guarded:
    """Marks what `guarded` returned (declare.Answer), so it is not wrapped twice."""


def _course_class(cls):
    """The course's own classes (helpers): their code is the course's."""
    return str(cls.__module__).split(".")[0] in _COURSE and not reader_class(cls)


def _drain(name, it):
    """An iterator's items (a generator's), taken now, while the answer's call is watched."""
    items = list(itertools.islice(it, _MAX_ITEMS + 1))
    if len(items) > _MAX_ITEMS:
        raise CheckFailed(f"{name} returned an iterator of more than {_MAX_ITEMS} items: return "
                          "a list")
    return items


def settle(result, name, guarded):
    """`result` with nothing of the reader's code left to run in it (see the module's
    docstring); `guarded(fn)` makes a callable that runs as the answer's. Refuses the rest."""
    return _Settler(name, guarded)(result)
