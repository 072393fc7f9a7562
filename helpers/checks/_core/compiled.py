"""A reference compiled by torch before the check ran is the reference: the Python function a
TorchScript function (`torch.jit.script`, `torch.jit.trace`) or an fx GraphModule
(`torch.fx.symbolic_trace`) was made from, found from what torch records of its origin, so that
references.identity gives both the same key (the copy has no Python bytecode of the reference's,
and the stub on the function object does not reach the compiled graph)."""
import re
import sys
import types

import torch

__all__ = ["compiled_origin"]

_TRACED = re.compile(r" from (.+):\d+ in (\w+)$")     # fx's name for the code it generated


def compiled_origin(obj):
    """The Python function torch compiled `obj` from, or None."""
    if isinstance(obj, torch.jit.ScriptFunction):
        module, _, name = str(obj.qualified_name).removeprefix("__torch__.").rpartition(".")
        return _function(sys.modules.get(module), name)
    if isinstance(obj, torch.fx.GraphModule):
        code = getattr(getattr(type(obj), "forward", None), "__code__", None)
        found = _TRACED.search(getattr(code, "co_filename", ""))
        if found:
            file, name = found.groups()
            for module in list(sys.modules.values()):
                if getattr(module, "__file__", None) == file:
                    return _function(module, name)
    return None


def _function(module, name):
    fn = vars(module).get(name) if module is not None else None
    return fn if isinstance(getattr(fn, "__code__", None), types.CodeType) else None
