"""torch.compile's one-time installs, done before a check's first snapshot when the answer's code
can reach torch.compile. Its first compiled call in the process installs library patches (dynamo
wraps `nn.Module.__init__` and `__setstate__`, torch.jit's tracers; an import decorates networkx's
functions): made during the answer's call, patched.py and guard.py would charge them to the
answer. Run once here, on a function of the harness's own, they are part of every snapshot."""
import types
import warnings

import torch
from torch._dynamo.eval_frame import OptimizedModule

__all__ = ["ready"]

_NAMES = frozenset({"compile", "_dynamo", "dynamo", "OptimizedModule"})
_DONE = []
_DEPTH = 4


def _tiny(x):
    return (x * 2).sum() + x.mean()


def _compiled(obj):
    """A function or module torch.compile returned; read by exact type (nothing of the
    reader's runs before the snapshot)."""
    if type(obj) is types.FunctionType:
        return obj.__dict__.get("_torchdynamo_orig_callable") is not None
    return type(obj) is OptimizedModule


def _reaches(obj, depth, seen):
    """Whether `obj` (a plain function) names torch.compile or dynamo, or holds a compiled
    function, in its code, globals, closure or defaults, `depth` links deep."""
    if _compiled(obj):
        return True
    if depth <= 0 or id(obj) in seen or type(obj) is not types.FunctionType:
        return False
    seen.add(id(obj))
    codes, names = [obj.__code__], set()
    while codes:
        c = codes.pop()
        names.update(c.co_names)
        codes.extend(k for k in c.co_consts if type(k) is types.CodeType)   # exact type
    if names & _NAMES:
        return True
    scope = obj.__globals__
    held = [dict.get(scope, n) for n in names] + list(obj.__defaults__ or ())
    for cell in obj.__closure__ or ():
        try:
            held.append(cell.cell_contents)
        except ValueError:      # an empty cell
            pass
    return any(_reaches(h, depth - 1, seen) for h in held)


def ready(fn):
    """Run torch.compile once in this process (eager and aot_eager backends) when `fn` can reach
    it, before the check's first snapshot."""
    if _DONE or not _reaches(fn, _DEPTH, set()):
        return
    _DONE.append(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for backend in ("eager", "aot_eager"):
            torch.compile(_tiny, backend=backend)(torch.ones(3))
        torch._dynamo.reset()
