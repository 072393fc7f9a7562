"""What a check hands an answer stays as it was handed. A check computes its expected value after
the call, from the same objects (so that nothing the answer can reach holds it beforehand); an
answer that changed them (`t.resize_(0)`, a layer replaced by `nn.Identity`, `forward`
reassigned, `requires_grad` turned off) would move the target to meet its own result. Exercises
whose lesson is to change their inputs in place (an all-reduce into the gradients, an optimizer
step) declare it: `@check(..., changes_inputs=True)`.

A fingerprint is taken before the call and compared after it: for a tensor its class, sizes,
strides, dtype, storage size, version counter (every in-place write bumps it), `requires_grad`
and, on the CPU, its bytes (a write through `.data` or another alias bumps no counter); for a module
every submodule (by identity and class), every parameter and buffer, and its instance attributes
(plain values by value, tensors as tensors, others by identity): all of them for torch's and the
harness's classes (`training`, a conv's `stride`, `_compiled_call_impl`, which nn.Module's
`__call__` runs instead of the module), nn.Module's own and those that shadow a method for the
course's classes (whose methods keep their own state there); containers item by item. Other
objects by identity and class.

Kept even where the inputs may change (`classes`, `expect_same_classes`): every object's class
(an answer that reassigns `X.__class__` to a class of its own would run its code in the check's
later operations on them) and what calling it runs: an instance attribute that shadows a method
of its class (`forward` or `_call_impl` on a module, `t.sum = f` on a tensor, `opt.step = f`) or
a module's `_compiled_call_impl`."""
import types
import weakref

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .composite import version_of
from .keys import drop_odd_keys, str_keys
from .parts import instance_dict, module_tree
from .run import CheckFailed
from .settle import reader_class

__all__ = ["fingerprint", "expect_untouched", "InputsChanged", "classes", "expect_same_classes",
           "expect_named_attributes", "grad_spared"]

_DEPTH = 4
_MAX_COPY = 1 << 22   # elements: values copied up to 16 MiB of float32
_WALKED = frozenset({"_parameters", "_buffers", "_modules",   # fingerprinted item by item
                     "_is_full_backward_hook"})   # set by a full backward hook, kept when removed
_MODULE_OWN = frozenset(vars(torch.nn.Module())) - _WALKED    # `training`, the hook tables
_PLAIN = frozenset({bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device,
                    torch.layout, torch.memory_format})
_DESCRIPTORS = (types.FunctionType, staticmethod, classmethod, property)
_ROUTES = weakref.WeakKeyDictionary()    # a module class -> the names its call may run
_COMPARED = weakref.WeakKeyDictionary()  # a module class -> the attribute names compared


class InputsChanged(CheckFailed):
    """The answer changed what it was handed (expect_untouched): kept_hooks.py adds what a
    tensor hook should do instead."""


class _Same:
    """An attribute's value compared by identity (held: its address is not reused), so no
    `__eq__` of an object of the reader's runs."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return type(other) is _Same and other.obj is self.obj

    __hash__ = None


def _value(v):
    """Plain data (a number, a string, a dtype, a tuple of those) by value, a tensor as a
    tensor (one held outside the parameters and buffers), anything else by identity and class."""
    if type(v) in _PLAIN or (type(v) is tuple and all(type(x) in _PLAIN for x in v)):
        return (type(v), repr(v))
    if type(v) in (torch.Tensor, torch.nn.Parameter):
        return _TensorPrint(v)
    return (_Same(v), type(v))


class _Key(_Same):
    """A key that is not a plain str or int, compared (and hashed) by identity: no `__eq__` or
    `__hash__` of a key of the reader's runs when two records are compared."""
    __slots__ = ()

    def __eq__(self, other):
        return type(other) is _Key and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)


def _key(k):
    return k if type(k) is str or type(k) is int else _Key(k)


def _routes(cls):
    """The instance attributes through which using an object of class `cls` runs code: the
    names of every method and property of the class (an instance attribute shadows a method:
    `t.sum = f` on a tensor, `opt.step = f`) and, for a module, nn.Module's class attributes
    (`_compiled_call_impl`, which its `__call__` runs instead of the module)."""
    names = _ROUTES.get(cls)
    if names is None:
        module = issubclass(cls, torch.nn.Module)
        names = frozenset(vars(torch.nn.Module) if module else ()).union(
            k for c in cls.__mro__ for k, v in vars(c).items()
            if isinstance(v, _DESCRIPTORS) or callable(v))
        _ROUTES[cls] = names
    return names


def _attributes(m, names):
    """(name, value) of m's instance attributes among `names` (all but the walked containers
    where `names` is None); None for an object without a `__dict__`."""
    own = instance_dict(m)      # never a `__dict__` property of the reader's class
    if own is None:
        return None
    return tuple((k, _value(v)) if type(k) is str else (_Key(k), _value(v))
                 for k, v in list(dict.items(own))
                 if type(k) is not str or (k not in _WALKED and (names is None or k in names)))


def _compared(cls):
    """The attribute names compared for a module of class `cls`: all of them for torch's and the
    harness's classes; nn.Module's own and the routes for the course's, whose methods change
    their own state (a bucket's log, a step count) while the answer calls them."""
    if cls not in _COMPARED:
        _COMPARED[cls] = None if str(cls.__module__).startswith(
            ("torch.", "helpers.checks.")) and not reader_class(cls) else _MODULE_OWN | _routes(cls)
    return _COMPARED[cls]


class _TensorPrint:
    """A tensor as handed: its metadata and version, and a copy of its bytes where it has
    values (a write through `.data` or another alias leaves the version counter alone)."""

    def __init__(self, t):
        try:
            nbytes = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):   # no storage (fake, meta)
            nbytes = None
        self.meta = (id(t), type(t), tuple(t.shape), tuple(t.stride()), t.dtype, nbytes,
                     version_of(t), t.requires_grad)
        self.bytes = None
        if nbytes is not None and t.device.type == "cpu" and t.numel() <= _MAX_COPY \
                and t.is_contiguous() and t.layout == torch.strided:
            try:
                self.bytes = t.detach().view(torch.uint8).clone()
            except (RuntimeError, TypeError):          # a dtype without a byte view
                self.bytes = None

    def __eq__(self, other):
        if not isinstance(other, _TensorPrint) or self.meta != other.meta:
            return False
        if self.bytes is None or other.bytes is None:
            return self.bytes is other.bytes
        return torch.equal(self.bytes, other.bytes)

    __hash__ = None


def _module(m):
    subs, tensors = module_tree(m)      # read from the instance dicts: no method of a module's
    parts = [(name, id(sub), type(sub), _attributes(sub, _compared(type(sub))))
             for name, sub in subs]
    return ("module", tuple(parts + [(name, _print(t, 0)) for name, t in tensors]))


def grad_spared(args):
    """`args` to fingerprint for a hook the autograd engine runs on a parameter's AccumulateGrad
    node (the Horovod idiom, `p.expand_as(p).grad_fn.next_functions[0][0].register_hook`): the
    gradient it hands shares its storage with p.grad, which its all-reduce writes as the
    exercise asks (a leaf's .grad is never fingerprinted: `register_post_accumulate_grad_hook`'s
    write passes); left out. Any other node's gradients, and every other argument, are kept."""
    node = torch._C._current_autograd_node()
    grad = node.variable.grad if type(node) is torch._C._functions.AccumulateGrad else None
    if type(grad) is not torch.Tensor:
        return args
    key = grad.untyped_storage()._cdata

    def spare(value, depth):
        if type(value) is tuple and depth:
            return tuple(spare(v, depth - 1) for v in tuple.__iter__(value))
        same = type(value) is torch.Tensor and value.untyped_storage()._cdata == key
        return None if same else value
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        return spare(args, 2)


def fingerprint(value):
    """A comparable record of `value` as the answer was handed it (see the module docstring),
    taken outside every dispatch mode: no Recorder, provenance or FakeGPUs sees its copies."""
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        return _print(value, _DEPTH)


def _print(value, depth):
    """Read by exact types and the base types' own methods (after the call the answer may have
    put objects of its own in a container: no `__class__` property or `__iter__` of theirs runs);
    a tensor of the reader's class by identity and class."""
    cls = type(value)
    if issubclass(cls, torch.Tensor) and (cls in (torch.Tensor, torch.nn.Parameter)
                                          or not reader_class(cls)):
        return _TensorPrint(value)
    if issubclass(cls, torch.nn.Module):
        return _module(value)
    if depth and issubclass(cls, (list, tuple)):
        items = list.__iter__(value) if issubclass(cls, list) else tuple.__iter__(value)
        return (cls, id(value), tuple(_print(v, depth - 1) for v in list(items)))
    if depth and issubclass(cls, dict):
        return (dict, id(value), tuple((_key(k), _print(v, depth - 1))
                                       for k, v in list(dict.items(value))))
    return ("object", id(value), cls)


def classes(value):
    """Every object in `value` as handed (tensors and their gradients, modules, their
    submodules, parameters and buffers, containers' items, other objects) with its class, and
    the instance attributes that shadow a method of its class (`_routes`)."""
    seen, found = set(), []

    def note(x):
        if id(x) not in seen:
            seen.add(id(x))
            cls = type(x)
            found.append((x, cls, _attributes(x, _routes(cls))))
            grad = x.grad if isinstance(x, torch.Tensor) and x.is_leaf else None
            if isinstance(grad, torch.Tensor):
                note(grad)

    def walk(x, depth):
        note(x)
        if isinstance(x, torch.nn.Module):
            for m in x.modules():
                note(m)
            for t in list(x.parameters(recurse=True)) + list(x.buffers(recurse=True)):
                note(t)
        elif depth and isinstance(x, (list, tuple)):
            for v in x:
                walk(v, depth - 1)
        elif depth and isinstance(x, dict):
            for v in x.values():
                walk(v, depth - 1)

    with _disable_current_modes(), torch._C.DisableTorchFunction():
        walk(value, _DEPTH)
    return tuple(found)


def expect_named_attributes(name, before):
    """CheckFailed if an object the answer was handed (`before = classes(...)`) holds an
    instance attribute under a key that is not an exact str (each taken out unlooked-up): the
    check reads their attributes after the call, and each lookup of a colliding name would run
    that key's `__eq__`. Called inside the call, before anything reads them."""
    odd = [cls for x, cls, _ in before if type(x) is cls and _odd_dict(x)]
    if odd:
        raise CheckFailed(f"{name} gave a {odd[0].__name__} it was handed an attribute named by "
                          "something that is not a str: the check reads that object's "
                          "attributes after your function returns. Leave what you are handed "
                          "as it was")


def _odd_dict(x):
    """Whether x's instance dict held a key that is not an exact str (taken out)."""
    try:
        own = object.__getattribute__(x, "__dict__")
    except (AttributeError, TypeError):
        return False
    if type(own) is not dict or str_keys(own):
        return False
    drop_odd_keys(own)
    return True


def expect_same_classes(name, before):
    """CheckFailed if an object the answer was handed (`before = classes(...)` taken before the
    call) is of another class now (`X.__class__ = Sub`); a library's subclass of the class it
    had, which runs none of the reader's code (`fully_shard`, a parametrization), is kept."""
    changed = [(x, cls) for x, cls, _ in before if type(x) is not cls and not (
        issubclass(type(x), cls) and not reader_class(type(x)))]   # torch's (fully_shard's)
    if changed:
        x, cls = changed[0]
        raise CheckFailed(f"{name} changed the class of what it was handed (a {cls.__name__} "
                          f"became a {type(x).__name__}): compute the answer from what it is "
                          "handed, and leave its inputs' classes as they were")
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        routes = [(cls, _differs(kept, _attributes(x, _routes(cls)) or ()))
                  for x, cls, kept in before if kept is not None]
    for cls, key in routes:
        if key:
            raise CheckFailed(
                f"{name} changed its inputs (`{key}` set on a {cls.__name__} it was handed: the "
                "check uses it after your function returns, and calling it would run what you "
                "put there): compute the answer from what it is handed, and leave that as it was")


def _differs(before, after):
    """The first attribute name whose value differs between two `_attributes` records."""
    b, a = dict(before), dict(after)
    return next((k for k in [*b, *a] if b.get(k) != a.get(k)), None)


def expect_untouched(name, before, args, kwargs):
    """CheckFailed naming the argument the answer changed, if it changed one; `before` is
    `fingerprint(args), fingerprint(kwargs)` taken before the call."""
    b_args, b_kwargs = before
    a_args, a_kwargs = fingerprint(args), fingerprint(kwargs)
    with _disable_current_modes(), torch._C.DisableTorchFunction():   # compared unseen too
        if (a_args, a_kwargs) == (b_args, b_kwargs):
            return
        pairs = [(f"argument {i + 1}", b, a) for i, (b, a) in enumerate(
            zip(b_args[2], a_args[2], strict=True))]
        pairs += [(f"`{k}`", b, a) for (k, b), (_, a) in zip(b_kwargs[2], a_kwargs[2],
                                                              strict=True)]
        changed = [(what, _how(b, a)) for what, b, a in pairs if b != a]
    what = ", ".join(f"{w}{h and f': {h}'}" for w, h in changed) or "its arguments"
    hint = " (for a gradient of your own: `x.detach().requires_grad_()`)" * (
        "requires_grad" in what)
    raise InputsChanged(f"{name} changed its inputs ({what}; resized, written in place, "
                      "requires_grad switched, or a module's layers, attributes or forward "
                      "replaced): compute the answer from what it is handed, and leave that as it "
                      f"was{hint}")


def _how(before, after):
    """What changed between two fingerprints of one argument, in words, where it is an
    attribute or a tensor's requires_grad ("" otherwise)."""
    if isinstance(before, _TensorPrint) and isinstance(after, _TensorPrint):
        if before.meta[:-1] == after.meta[:-1] and before.meta[-1] != after.meta[-1]:
            return f"requires_grad turned {'on' if after.meta[-1] else 'off'}"
        return ""
    if not (isinstance(before, tuple) and isinstance(after, tuple)) or len(before) != len(after):
        return ""
    if len(before) == 4 and isinstance(before[2], type) and before[:3] == after[:3]:
        key = _differs(before[3], after[3])          # a submodule's (name, id, class, attributes)
        return f"`{key}` of {before[0] or 'the module'}" if key else ""
    if len(before) == 2 and isinstance(before[0], str) and isinstance(before[1], _TensorPrint):
        how = _how(before[1], after[1])          # a parameter's or buffer's (name, print)
        return how and f"{before[0]}: {how}"
    for b, a in zip(before, after, strict=True):
        if b != a:
            return _how(b, a)
    return ""
