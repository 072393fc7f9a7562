"""Operators defined in Python outside torch (torch.library): refused while a Recorder
watches (observe.py) and by name (references.py); guard.py re-exports them."""
import torch.library

from .guard import refuse
from .run import ReferenceUsed

__all__ = ["TORCH_OPERATORS", "own_operator"]

# torch's own operator namespaces (those its Python defines too); an operator defined in Python
# in another (torch.library) runs its implementation with the dispatch modes popped: the work
# inside it would go unrecorded
TORCH_OPERATORS = frozenset({
    "aten", "prim", "prims", "c10d", "_c10d_functional", "c10d_functional",
    "_c10d_functional_autograd", "_dtensor", "higher_order", "profiler", "_native", "coor",
    "debug_mode_ops", "debugprims", "export", "rngprims", "fsdp", "inductor", "streams",
    "_inductor_test", "_quantized", "quantized", "mkldnn", "onednn", "sparse", "mtia", "_test"})


def own_operator(name):
    """Refuse an operator defined in Python outside torch (a custom op) while a Recorder
    watches: raised as the guard's refusal, so an answer's `except` cannot hide it."""
    if name not in getattr(torch.library, "_defs", ()):
        return
    message = (f"your code calls an operator of its own ({name}, torch.library): the work "
               "inside one is invisible to the check, so an answer must run torch's own "
               "operations in plain view")
    refuse(message)
    raise ReferenceUsed(message)
