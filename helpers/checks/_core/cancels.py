"""Arithmetic that cancels an operand: its values cannot reach the result (`x * 0`, `0 * x`,
`add(y, x, alpha=0)`, `x - x`). The Recorder's dataflow (`depends_on`, what a rank received)
does not follow such an operand, so a result made of other data with what arrived added times
zero (`mean + 0 * received`) is not made of what arrived. Values are read only from plain CPU
tensors (a simulated GPU's have none): a zero held in a tensor on fake devices is not seen.
"""
import torch

__all__ = ["cancelled"]

_TIMES = {"mul", "mul_"}
_PLUS = {"add", "add_", "sub", "sub_"}
_MINUS = {"sub", "sub_"}
_LARGEST = 1 << 20           # elements read to tell a zero tensor (beyond: not judged)


def _zero(v):
    """True when `v` is the number zero or a plain CPU tensor holding only zeros."""
    if isinstance(v, (bool, int, float)):
        return v == 0
    if type(v) not in (torch.Tensor, torch.nn.Parameter) or v.device.type != "cpu":
        return False
    if v.numel() == 0 or v.numel() > _LARGEST or v.is_complex():
        return False
    with torch._C._DisableTorchDispatch():      # the check's own read, not the answer's
        return not bool(v.any())


def _same(a, b):
    """`a` and `b` are the same elements of the same storage (so `a - b` is zero)."""
    if a is b:
        return True
    if not all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in (a, b)):
        return False        # a FakeTensor or other subclass: its data pointer is not to be read
    try:
        return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                and a.storage_offset() == b.storage_offset() and a.shape == b.shape
                and a.stride() == b.stride() and a.dtype == b.dtype
                and a.device == b.device and a.untyped_storage().data_ptr() != 0)
    except (RuntimeError, NotImplementedError):
        return False


def cancelled(name, args, kwargs):
    """The ids of the tensors among an operation's operands whose values cannot reach what it
    writes or returns."""
    out = set()
    a = args[0] if args else kwargs.get("self")
    b = args[1] if len(args) > 1 else kwargs.get("other")
    if name in _TIMES:
        if _zero(b) and isinstance(a, torch.Tensor):
            out.add(id(a))
        if _zero(a) and isinstance(b, torch.Tensor):
            out.add(id(b))
    elif name in _PLUS:
        alpha = args[2] if len(args) > 2 else kwargs.get("alpha", 1)
        if isinstance(b, torch.Tensor) and isinstance(alpha, (bool, int, float)) and alpha == 0:
            out.add(id(b))
        if (name in _MINUS and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and alpha == 1 and _same(a, b)):
            out.update((id(a), id(b)))
    return out
