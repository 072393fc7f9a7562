"""Operands whose values cannot reach an operation's result. The Recorder's dataflow
(`depends_on`, what a rank received) does not follow such an operand, so a result made of other
data with what arrived added times zero (`mean + 0 * received`) is not made of what arrived.
- `cancelled`: by form, `x * 0`, `0 * x`, `add(y, x, alpha=0)`, `x - x`;
- `unused`: by values, any operation on plain CPU tensors (up to `_PERTURBED` elements) of two
  tensors or more, or of one and a Python number: run again with one floating or boolean
  operand changed (negated and doubled, all zeros made ones; flipped), a result bitwise equal
  to the one it gave does not depend on that operand (`lerp(y, x, 0)`, `where` on an all-false
  mask, `y + x * 1e-30` rounded away, `clamp(x, 0, 0)`). Integer operands are not changed (a
  kernel may index with them unchecked); seeded random operations, moves and injective math
  are not run again; `zeros_like(x)` and its kin read only sizes.
Values are read only from plain CPU tensors (a simulated GPU's have none): a zero held in a
tensor on fake devices is not seen.
"""
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["cancelled", "snapshot", "unused"]

_NOT_RUN = frozenset({"set_", "resize_", "_local_scalar_dense", "equal", "record_stream",
            # every operand's values reach the result (moves, concatenations, injective math)
            "clone", "_to_copy", "copy_", "detach", "alias", "lift_fresh", "lift_fresh_copy",
            "_unsafe_view", "cat", "stack", "neg", "exp", "log", "sqrt", "rsqrt", "reciprocal",
            "tanh", "sigmoid", "sin", "cos", "erf", "exp2", "log1p", "expm1"})
_PERTURBED = 1 << 15         # elements an operation may touch to be run again (beyond: not judged)

_TIMES = frozenset({"mul", "mul_"})
_LIKE = frozenset({"zeros_like", "ones_like", "empty_like", "full_like", "new_zeros", "new_ones",
         "new_empty", "new_full", "new_empty_strided"})
_PLUS = frozenset({"add", "add_", "sub", "sub_"})
_MINUS = frozenset({"sub", "sub_"})
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
    if name in _LIKE and isinstance(a, torch.Tensor):
        return {id(a)}                 # `zeros_like(x)`: its sizes only
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


def _plain(t):
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu"
            and t.layout == torch.strided and not t.is_complex() and not t.is_quantized)


def snapshot(func, args, kwargs):
    """Before an operation runs: None when `unused` will not judge it, else copies of the
    tensors it writes (run again, it must start from what they held)."""
    schema = func._schema
    if (torch.Tag.nondeterministic_seeded in func.tags or not schema.returns
            or func.__name__.split(".")[0] in _NOT_RUN
            or any(r.alias_info is not None and not r.alias_info.is_write
                   for r in schema.returns)):
        return None                                  # random, nothing returned, or a view
    leaves = tree_flatten((args, kwargs))[0]
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    if not tensors or not all(_plain(t) for t in tensors):
        return None
    if len(tensors) == 1 and not _number(schema, args, kwargs):
        return None            # one tensor and no number: `sum`, `amax`, `sign` read it
    if sum(t.numel() for t in tensors) > _PERTURBED:
        return None
    written = {}
    with torch._C._DisableTorchDispatch():
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = args[i] if i < len(args) else kwargs.get(arg.name)
                for t in tree_flatten(value)[0]:
                    if isinstance(t, torch.Tensor):
                        written[id(t)] = t.clone()
    return written


def _number(schema, args, kwargs):
    """A Python number among the values (`x * 1e-30`, `clamp(x, 0, 0)`, `x ** 0`)."""
    for i, arg in enumerate(schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        if (isinstance(value, (int, float)) and not isinstance(value, bool)
                and ("number" in str(arg.type) or str(arg.type) == "Tensor")):
            return True
    return False


def _whole(t):
    return (t.storage_offset() == 0 and t.is_contiguous()
            and t.numel() * t.element_size() == t.untyped_storage().nbytes())


def _changed(t):
    """Floating `t` with its elements changed: `-2t` (signs flip, magnitudes double: a term too
    small to count stays too small), all zeros made ones; booleans flipped."""
    if t.dtype == torch.bool:
        return ~t
    return t.mul(-2) if t.any() else torch.ones_like(t)


def _results(out, written, tensors):
    got = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    return [t for t in got if id(t) not in written] + [t for t in tensors if id(t) in written]


def unused(func, args, kwargs, out, written):
    """The ids of the operands (tensors) whose values do not reach what the operation returned
    or wrote: run again with each one changed, it gives bitwise the same (`snapshot` made
    `written`). An operand it fails on, or that changes the result, is used."""
    if written is None:
        return set()
    leaves, spec = tree_flatten((args, kwargs))
    positions = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
    tensors = [leaves[i] for i in positions]
    found = set()
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        before = _results(out, written, tensors)      # nothing changes them while this runs
        if not before:
            return found            # nothing returned or written (`.item()`, `equal`)
        for i in positions:
            t = leaves[i]
            if t.numel() == 0 or any(t is leaves[j] for j in positions if j != i):
                continue
            if not (t.is_floating_point() or t.dtype == torch.bool):
                continue            # integers index: a kernel may not check them (nll_loss)
            if id(t) in written and not _whole(t):
                continue            # a view written in place: the rest of its storage stays
            again = list(leaves)
            for j in positions:
                if id(leaves[j]) in written:
                    again[j] = written[id(leaves[j])].clone()
            again[i] = _changed(written.get(id(leaves[i]), leaves[i]))
            if id(leaves[i]) in written:
                again[i] = again[i].clone()
            try:
                a, k = tree_unflatten(again, spec)
                res = func(*a, **k)
            except Exception:    # it fails on other values: it reads them
                continue
            fresh = {id(again[j]) for j in positions if id(leaves[j]) in written}
            after = [t for t in tree_flatten(res)[0] if isinstance(t, torch.Tensor)
                     and id(t) not in fresh] + [again[j] for j in positions
                                                if id(leaves[j]) in written]
            if len(after) == len(before) and all(
                    x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
                    for x, y in zip(before, after, strict=True)):
                found.add(id(leaves[i]))
    return found
