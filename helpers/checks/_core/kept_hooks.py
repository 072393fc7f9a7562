"""A hook an exercise keeps (`@check(..., keeps_hooks=True)`: hooks.py) returns only what torch's
autograd takes from it; anything else fails the answer, naming what the hook returned and the fix.

Torch judges a hook's return value in C++ once the hook has returned, inside the check's own
backward, where no frame of the reader's is left: a node hook returning a bare tensor raised
there (run.py blamed the check), and a post-accumulate-grad hook's value is handed to the
parameter's next hook, the check's own, in place of the parameter. So each kept hook runs as
the answer (`guard`) and what it returns is judged here by torch's documented rules:
- a tensor's gradient hook (`t.register_hook`): None, or a tensor of the gradient's shape, dtype
  and device, which replaces the gradient (legitimate: judged as any answer);
- a post-accumulate-grad hook: None (or the parameter itself): it works on `p.grad` in place;
- a node's hook (`grad_fn.register_hook(fn(grad_inputs, grad_outputs))`) or pre-hook
  (`register_prehook(fn(grad_outputs))`): None, or a tuple of as many values as the gradients it
  replaces, each None or a tensor as above (replacement gradients: legitimate).
A module's or an optimizer's hook (its first argument the module or optimizer) is not judged.
A check that judges what the answer's state holds later (held.py) reads the hooks kept in its
thread while `recording()` is open: a hook's closure is state that only the hook may hold.
"""
import contextlib
import threading

import torch

from .run import CheckFailed
from .settle import Guarded
from .untouched import InputsChanged

__all__ = ["keeping", "recording"]

_BASE = vars(torch._C.TensorBase)        # read by the base's getters: no property of a subclass
_META = tuple(_BASE[name].__get__ for name in ("shape", "dtype", "device", "layout"))
_ACCUMULATE = torch._C._functions.AccumulateGrad


_OPEN = threading.local()      # this thread's open records: lists of (table, key, kept hook)


def keeping(guard):
    """Guard in place the hook at `key` of the hook table `hooks` (`guard`: run a hook as the
    answer), for the hooks an exercise keeps: each is judged too, and noted where recorded."""
    def keep(hooks, key):
        kept = _Kept(guard(dict.__getitem__(hooks, key)))
        dict.__setitem__(hooks, key, kept)
        for record in getattr(_OPEN, "records", ()):
            record.append((hooks, key, kept))
    return keep


@contextlib.contextmanager
def recording():
    """While open, a callable giving the hooks kept in this thread that are still registered
    (one removed since holds nothing the answer still runs)."""
    record, records = [], _OPEN.__dict__.setdefault("records", [])
    records.append(record)
    try:
        yield lambda: [kept for hooks, key, kept in record if dict.get(hooks, key) is kept]
    finally:
        records[:] = [r for r in records if r is not record]


class _Kept(Guarded):
    """A kept hook, run as the answer; what it returns judged (see the module docstring)."""
    __slots__ = ("_hook", "__name__")

    def __init__(self, hook):
        self._hook, self.__name__ = hook, hook.__name__

    def __call__(self, *args, **kwargs):
        try:
            out = self._hook(*args, **kwargs)
        except InputsChanged as e:
            if _tensor_hook(args):
                raise InputsChanged(f"{e}. A hook registered with register_hook runs before "
                                    "the gradient is accumulated into .grad, and torch takes "
                                    "what it returns: return a new tensor instead of writing "
                                    "its argument, or register the hook with "
                                    "register_post_accumulate_grad_hook and all-reduce p.grad "
                                    "there") from None
            raise
        if out is not None and not kwargs:
            wrong = _wrong(args, out)
            if wrong:
                raise CheckFailed(f"your hook `{self.__name__}`, {wrong}")
        return out


def _tensor_hook(args):
    """Whether a hook torch called with `args` is a tensor's register_hook (not a
    post-accumulate-grad hook, whose node is the parameter's AccumulateGrad)."""
    if len(args) != 1 or not issubclass(type(args[0]), torch.Tensor):
        return False
    node = torch._C._current_autograd_node()
    return not (type(node) is _ACCUMULATE and node.variable is args[0])


def _wrong(args, out):
    """What is wrong with `out`, returned by a hook torch called with `args`, or None."""
    if len(args) == 2 and all(type(a) is tuple for a in args):
        return _replaced(args[0], out, "register_hook", "grad_inputs")
    if len(args) != 1:
        return None
    if type(args[0]) is tuple:
        return _replaced(args[0], out, "register_prehook", "grad_outputs")
    if not issubclass(type(args[0]), torch.Tensor):
        return None
    node = torch._C._current_autograd_node()
    if type(node) is _ACCUMULATE and node.variable is args[0]:
        return None if out is args[0] else (
            f"registered with register_post_accumulate_grad_hook, returned {_what(out)}: torch "
            "takes None from such a hook, which works on the parameter's .grad in place (a "
            "returned value is handed to the parameter's next hook in place of the parameter, "
            "then backward raises \"Tensor post accumulate grad hooks should return None\"). "
            "Return nothing: all-reduce p.grad itself")
    wrong = _single(args[0], out)
    return wrong and (
        f"registered on a tensor with register_hook, returned {wrong}: such a hook returns "
        "None, or a tensor of the gradient's shape, dtype and device that replaces it (torch's "
        "backward raises otherwise). Return the new gradient as such a tensor, or nothing")


def _replaced(grads, out, how, which):
    """What is wrong with `out`, returned by a node's hook (`how`) in place of its gradients
    `grads` (`which`), or None."""
    head = (f"registered on an autograd node with {how}, returned {_what(out)}: such a hook "
            f"replaces the node's {which} ({len(grads)} here) with a tuple of as many values, "
            "each None or a tensor of its gradient's shape, dtype and device, or keeps them when "
            "it returns None; torch's backward raises otherwise")
    if type(out) is not tuple:
        return (f"{head} (\"expected tuple, but hook returned '{type(out).__name__}'\"). "
                f"Return a tuple, ({'g, ' * len(grads)})".replace(", )", ",)") + ", or nothing")
    if len(out) != len(grads):
        return f"{head}. Return {len(grads)} values, or nothing"
    for i, (grad, new) in enumerate(zip(grads, out, strict=True)):
        wrong = _single(grad, new)
        if wrong:
            return f"{head}, and its value {i} is {wrong}. Return such tensors, or nothing"
    return None


def _single(grad, new):
    """What is wrong with `new` in place of the gradient `grad` (a tensor or None), or None."""
    if new is None:
        return None
    if grad is None:
        return f"{_what(new)} where the gradient is None (torch replaces no None gradient)"
    if not issubclass(type(new), torch.Tensor):
        return f"{_what(new)}, not a tensor"
    got, want = _meta(new), _meta(grad)
    if got != want:
        return f"{_what(new)} where the gradient is {_what(grad)}"
    return None


def _meta(t):
    shape, dtype, device, layout = (get(t) for get in _META)
    return tuple(shape), dtype, device.type, layout


def _what(v):
    if issubclass(type(v), torch.Tensor):
        shape, dtype, device, _ = _meta(v)
        return f"a tensor of shape {shape} ({dtype}, {device})"
    return f"a {type(v).__name__}"
