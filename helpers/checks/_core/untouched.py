"""What a check hands an answer stays as it was handed. A check computes its expected value after
the call, from the same objects (so that nothing the answer can reach holds it beforehand); an
answer that changed them (`t.resize_(0)`, a layer replaced by `nn.Identity`, `forward`
reassigned) would move the target to meet its own result. Exercises whose lesson is to change
their inputs in place (an all-reduce into the gradients, an optimizer step) declare it:
`@check(..., changes_inputs=True)`.

A fingerprint is taken before the call and compared after it: for a tensor its class, sizes,
strides, dtype, storage size, version counter (every in-place write bumps it) and, on the CPU,
its bytes (a write through `.data` or another alias bumps no counter); for a module every
submodule (by identity and class, with a `forward` of its own if one was set) and every
parameter and buffer; containers item by item. Other objects by identity and class.

Classes are kept even where the inputs may change (`classes`, `expect_same_classes`): an answer
that reassigns `X.__class__` (or a parameter's, a gradient's, a module's, a handed object's) to
a class of its own would run its code in the check's later operations on them."""
import torch
from torch.utils._python_dispatch import _disable_current_modes

from .run import CheckFailed
from .settle import reader_class

__all__ = ["fingerprint", "expect_untouched", "classes", "expect_same_classes"]

_DEPTH = 4
_MAX_COPY = 1 << 22   # elements: values copied up to 16 MiB of float32


class _TensorPrint:
    """A tensor as handed: its metadata and version, and a copy of its bytes where it has
    values (a write through `.data` or another alias leaves the version counter alone)."""

    def __init__(self, t):
        try:
            nbytes = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):   # no storage (fake, meta)
            nbytes = None
        self.meta = (id(t), type(t), tuple(t.shape), tuple(t.stride()), t.dtype, nbytes, t._version)
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
    parts = []
    for name, sub in m.named_modules(remove_duplicate=False):
        own = sub.__dict__.get("forward")
        parts.append((name, id(sub), type(sub), id(own) if own is not None else None))
    for name, t in list(m.named_parameters(remove_duplicate=False)) + \
            list(m.named_buffers(remove_duplicate=False)):
        parts.append((name, _TensorPrint(t)))
    return ("module", tuple(parts))


def fingerprint(value):
    """A comparable record of `value` as the answer was handed it (see the module docstring),
    taken outside every dispatch mode: no Recorder, provenance or FakeGPUs sees its copies."""
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        return _print(value, _DEPTH)


def _print(value, depth):
    if isinstance(value, torch.Tensor):
        return _TensorPrint(value)
    if isinstance(value, torch.nn.Module):
        return _module(value)
    if depth and isinstance(value, (list, tuple)):
        return (type(value), id(value), tuple(_print(v, depth - 1) for v in value))
    if depth and isinstance(value, dict):
        return (dict, id(value), tuple((k, _print(v, depth - 1))
                                       for k, v in value.items()))
    return ("object", id(value), type(value))


def classes(value):
    """Every object in `value` as handed (tensors and their gradients, modules, their
    submodules, parameters and buffers, containers' items, other objects) with its class."""
    seen, found = set(), []

    def note(x):
        if id(x) not in seen:
            seen.add(id(x))
            found.append((x, type(x)))
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


def expect_same_classes(name, before):
    """CheckFailed if an object the answer was handed (`before = classes(...)` taken before the
    call) is of another class now (`X.__class__ = Sub`); a library's subclass of the class it
    had, which runs none of the reader's code (`fully_shard`, a parametrization), is kept."""
    changed = [(x, cls) for x, cls in before if type(x) is not cls and not (
        issubclass(type(x), cls) and not reader_class(type(x)))]   # torch's (fully_shard's)
    if changed:
        x, cls = changed[0]
        raise CheckFailed(f"{name} changed the class of what it was handed (a {cls.__name__} "
                          f"became a {type(x).__name__}): compute the answer from what it is "
                          "handed, and leave its inputs' classes as they were")


def expect_untouched(name, before, args, kwargs):
    """CheckFailed naming the argument the answer changed, if it changed one; `before` is
    `fingerprint(args), fingerprint(kwargs)` taken before the call."""
    b_args, b_kwargs = before
    a_args, a_kwargs = fingerprint(args), fingerprint(kwargs)
    with _disable_current_modes(), torch._C.DisableTorchFunction():   # compared unseen too
        if (a_args, a_kwargs) == (b_args, b_kwargs):
            return
        changed = [f"argument {i + 1}" for i, (b, a) in enumerate(zip(b_args[2], a_args[2],
                                                                      strict=True)) if b != a]
        changed += [f"`{k}`" for (k, b), (_, a) in zip(b_kwargs[2], a_kwargs[2], strict=True)
                    if b != a]
    what = ", ".join(changed) or "its arguments"
    raise CheckFailed(f"{name} changed its inputs ({what}: resized, written in place, or a "
                      "module's layers or forward replaced): compute the answer from what it is "
                      "handed, and leave that as it was")
