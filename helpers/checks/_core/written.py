"""Which tensors an aten operation writes, and which of its arguments it overwrites without
reading them (an `out=`, `copy_`'s and `fill_`'s self), from its schema: observe.py records each
written tensor once (`torch.add(a, b, out=a)` writes `a` once though it is handed it twice, so
its additions count once), and no dataflow passes through an overwritten argument's old values
(flow.py: `torch.cat(ts, out=buf[:n])` holds `ts` only, whatever `buf[:n]` held)."""
import torch
from torch.utils._pytree import tree_flatten

__all__ = ["Written", "whole", "OVERWRITES"]

# operations whose written argument `self` is overwritten without being read (a `_foreach_`
# twin's self is a list: each of its tensors; torch has no other twin of these)
OVERWRITES = frozenset({"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_",
                        "exponential_", "geometric_", "cauchy_", "log_normal_", "_copy_from",
                        "_foreach_copy_", "_foreach_zero_"})


def whole(t):
    """True when `t` covers every byte of its storage (writing it leaves nothing of before)."""
    try:
        return (t.storage_offset() == 0 and t.is_contiguous()
                and t.numel() * t.element_size() == t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return False


def _leaves(value):
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


class Written:
    """For an operation's `inputs` (its tensors in `tree_flatten((args, kwargs))` order):
    `tensors`, those it writes, each once, in argument order; `targets`, the positions in
    `inputs` of the arguments it overwrites without reading (an out= of any extent);
    `blind`, those of them that cover their whole storage (what the storage held before flows
    nowhere); `fresh`, the ids of the written tensors passed as such an argument."""

    __slots__ = ("tensors", "targets", "blind", "fresh")

    def __init__(self, func, args, kwargs, inputs):
        schema, name = func._schema, func.__name__.split(".")[0]
        by_name = {a.name: a for a in schema.arguments}
        passed = [(schema.arguments[i] if i < len(schema.arguments) else None, t)
                  for i, value in enumerate(args) for t in _leaves(value)]
        passed += [(by_name.get(key), t) for key, value in kwargs.items()
                   for t in _leaves(value)]
        if [id(t) for _, t in passed] != [id(t) for t in inputs]:
            passed = [(None, t) for t in inputs]        # not told apart: read, like any input
            for i, arg in enumerate(schema.arguments):
                value = args[i] if i < len(args) else kwargs.get(arg.name)
                passed += [(arg, t) for t in _leaves(value)
                           if arg.alias_info is not None and arg.alias_info.is_write]
        self.tensors, seen = [], set()
        self.targets, self.blind, self.fresh = set(), set(), set()
        for i, (arg, t) in enumerate(passed):
            if arg is None or arg.alias_info is None or not arg.alias_info.is_write:
                continue
            if id(t) not in seen:
                seen.add(id(t))
                self.tensors.append(t)
            if (arg.kwarg_only or name in OVERWRITES) and i < len(inputs):
                self.targets.add(i)
                self.fresh.add(id(t))
                if whole(t):
                    self.blind.add(i)
