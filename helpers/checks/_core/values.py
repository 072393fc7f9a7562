"""Which reads of a Recorder's record hold the same values, told from the operations alone (no
data read, so fake tensors on simulated devices answer too), and which operations make a
constant of what they read (`x / x`, `x.sum() - x.sum()`, `x ** 0`, `x * zeros`): flow.py
does not follow an input's elements through such a constant, so an operand made of one is not
the inputs' data in a product (`W @ (x / x)` is W's elements). Also which additions add a zero
(`adds_zero`): observe.py counts them as copies, neither work nor additions."""
import torch
from torch.utils._pytree import tree_flatten

__all__ = ["consts", "Values", "adds_zero", "makes_zeros"]

_SEEDED = torch.Tag.nondeterministic_seeded
# copies: the result holds the values read (its device or dtype aside)
_COPIES = frozenset({"clone", "_to_copy", "contiguous", "lift_fresh_copy"})
# an operation of two operands that gives a constant when both hold the same values
_SELF = frozenset({"div", "div_", "sub", "sub_", "rsub", "true_divide", "true_divide_",
                   "floor_divide", "floor_divide_", "remainder", "remainder_", "fmod", "fmod_",
                   "eq", "ne", "lt", "le", "gt", "ge", "eq_", "ne_", "lt_", "le_", "gt_", "ge_",
                   "logical_xor", "logical_xor_", "bitwise_xor", "bitwise_xor_", "atan2",
                   "atan2_"})
_ZERO_SELF = frozenset({"sub", "sub_", "rsub", "remainder", "remainder_", "fmod", "fmod_",
                        "bitwise_xor", "bitwise_xor_"})     # x - x, x % x: zeros
_ZEROS = frozenset({"zeros", "zeros_like", "new_zeros"})
_FILLED = frozenset({"full", "full_like", "new_full", "scalar_tensor"})   # the value: a const
_TIMES = frozenset({"mul", "mul_"})
_FILLS = frozenset({"fill", "fill_"})       # a tensor filled in place with a constant
# additions that add nothing when one operand is zero: `0 + t` (Python's sum() starts from 0),
# `t - 0`, `zeros_like(t) + g` (a sum started from a tensor of zeros)
_ZERO_ADDS = frozenset({"add", "add_", "sub", "sub_"})


def adds_zero(op):
    """Whether the Recorder's `op` is a copy of one operand: an addition of a Python 0 (`t + 0`,
    `0 + t`, `t - 0`) or of a tensor of zeros the answer made and has not written since
    (`op.zeros`: `total = zeros_like(c); total += g`, `sum(gs, zeros_like(c))`); `zeros - g`
    and `add(zeros, g, alpha=2)` compute, so count."""
    if op.name not in _ZERO_ADDS or op.consts is None:
        return False
    leaves, named = op.consts
    if len(op.reads) == 1:
        return leaves[:1] == (0,)
    return len(op.reads) == 2 and (1 in op.zeros or 0 in op.zeros and op.name[:3] == "add"
                                   and all(v == (1,) for k, v in named if k == "alpha"))


def makes_zeros(op):
    """Whether the tensors `op` made or wrote hold zeros: zeros, zeros_like, new_zeros, a full
    of 0, a tensor zeroed in place (`empty(n).zero_()`, `fill_(0)`), a product by a Python 0
    (`g * 0`, `g.mul_(0)`: zeros where g is finite), or a copy of zeros
    (`torch.zeros(n).to(d)`)."""
    leaves = op.consts[0] if op.consts else ()
    return (op.name in _ZEROS or op.name in _FILLED and 0 in leaves[-1:]
            or op.name == "zero_" or op.name in _FILLS and leaves[-1:] == (0,)
            or op.name in _TIMES and leaves[-1:] == (0,) and len(op.reads) == 1
            or op.name in _COPIES and op.zeros == (0,) and len(op.reads) == 1)


def consts(args, kwargs):
    """An operation's operands that are not tensors, hashable (run again on the same tensors
    with the same of these, an operation gives the same values), or None when one is not."""
    out = (_plain(args), tuple(sorted((k, _plain(v)) for k, v in kwargs.items())))
    try:
        hash(out)
    except TypeError:
        return None
    return out


def _plain(tree):
    return tuple(v for v in tree_flatten(tree)[0] if not isinstance(v, torch.Tensor))


def _contiguous(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class Values:
    """Value numbering over a record: each storage version an out-of-place operation made gets
    a token of the operation, the tokens of its reads and its other operands (seeded random
    operations and writes in place get none: their own); a read's token is its storage's with
    its offset, sizes and strides, and the whole of a copy's result reads as what it copied
    (`x.clone()`, `x.to(d)`), so two reads of one token hold the same values. Tokens are small
    ints (`ids`), so comparing two never walks a chain of operations."""

    def __init__(self):
        self.made = {}      # (storage key, version) -> (how: "copy", "op", "zero"; token, shape)
        self.ids = {}       # what a token stands for -> the token

    def _id(self, what):
        return self.ids.setdefault(what, len(self.ids))

    def token(self, r):
        how, token, shape = self.made.get((r.key, r.version), ("storage", None, None))
        if how == "copy" and r.shape == shape and r.layout == (0, _contiguous(r.shape)):
            return token
        base = (how, token) if how != "storage" else (how, r.key, r.version)
        return self._id((base, r.layout, r.shape, r.dtype))

    def zero(self, r):
        return self.made.get((r.key, r.version), ("",))[0] == "zero"

    def constant(self, op):
        """"zero", "constant" (of what `op` reads it makes a constant) or None."""
        reads = [r for i, r in enumerate(op.reads) if i not in op.blind and i not in op.targets]
        leaves, named = op.consts or ((), ())
        if op.name in _ZEROS or (op.name in _FILLED and op.consts and 0 in leaves[-1:]):
            return "zero"
        if op.name in _TIMES and any(self.zero(r) for r in reads):
            return "zero"
        if op.name in _SELF and len(reads) == 2 and op.consts is not None and all(
                v == (1,) for k, v in named if k == "alpha"):
            if self.token(reads[0]) == self.token(reads[1]):
                return "zero" if op.name in _ZERO_SELF else "constant"
        if op.name in ("pow", "pow_") and len(reads) == 1 and leaves[-1:] in ((0,), (0.0,)):
            return "constant"                                    # x ** 0
        if (op.name in ("clamp", "clamp_") and len(leaves) == 2 and leaves[0] is not None
                and leaves[0] == leaves[1]):
            return "constant"                                    # clamp(x, c, c)
        return None

    def record(self, op):
        """Note the tokens of what `op` made; what `constant` says of it."""
        kind = self.constant(op)
        if op.consts is None or op.writes or _SEEDED in op.func.tags:
            return kind
        reads = tuple(self.token(r) for r in op.reads)
        for i, o in enumerate(op.outputs):
            if kind == "zero":
                self.made[(o.key, o.version)] = ("zero", self._id("zero"), None)
            elif op.name in _COPIES and len(reads) == 1:
                self.made[(o.key, o.version)] = ("copy", reads[0], o.shape)
            else:
                self.made[(o.key, o.version)] = ("op", self._id(
                    (op.name, reads, op.consts, i, o.shape, o.dtype)), None)
        return kind
