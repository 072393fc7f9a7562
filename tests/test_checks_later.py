"""Code of the answer's that would run after its call, through what it leaves behind, each with
the words its refusal names:

1. an object left to die later whose death runs the reader's code: a weakref's callback, a
   `__del__` (on the result, in garbage), bending the comparison between the check's windows and
   putting it back before the body ends: callbacks.py looks at what the call left alive;
2. a function left to run at exit, reached by a name built at run time (`atexit.register`,
   `threading._register_atexit`): callbacks.py counts and watches them;
3. a gradient hook put in a tensor's hook table without the watched `register_hook` (the table
   handed to the node by `_register_hook_dict` reached by a built name, or `register_hook`'s
   original bound before the check ran), rescaling the gradient the check judges (nothing the
   libraries' comparisons see): hooks.py notes every table given to a tensor;
4. in an exercise whose hooks run later on purpose (keeps_hooks), the hooks left on what it was
   handed are guarded like the answer: one that rebinds what the check compares with fails; one
   for every module still fails;
5. a Python kernel registered for an aten operator (torch.library reached by a built name).
"""
import importlib
import sys
import weakref

import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut

LATER = "would run your code later"
AT_EXIT = "at exit"
TENSOR_HOOK = "still registered on a tensor"
REPLACED = "replaced"
KERNEL = "kernel of its own"

_KEEP = []
_RH = torch.Tensor.register_hook       # the original, bound before any check ran


def _module(*parts):
    """A module reached by a name built at run time (the scan cannot read it)."""
    return importlib.import_module("".join(parts))


def _core(name):
    return next((m for n, m in list(sys.modules.items()) if n.endswith("_core." + name)), None)


def _bend_close(*_):
    """What check_rank_loss compares with, made to agree with anything."""
    inputs = _core("in" + "puts")
    if inputs is not None:           # at exit, where the objects kept alive die, it is gone
        setattr(inputs, "_ALL" + "CLOSE", lambda *a, **k: True)


# ---- 1: objects whose death runs the reader's code -------------------------------------------
# Each death but the latest result's bends the comparison, and the latest's (when the check body
# ends) puts it back: the libraries and the harness then compare equal around every window of the
# answer's and at the body's end, so only what the call left alive tells.
_LATEST, _ORIGINAL = [], []


def _bend_until_latest(token):
    inputs = _core("in" + "puts")
    if inputs is None:               # at exit, where the objects kept alive die, it is gone
        return
    if not _ORIGINAL:
        _ORIGINAL.append(getattr(inputs, "_ALL" + "CLOSE"))
    latest = bool(_LATEST) and _LATEST[-1] is token
    setattr(inputs, "_ALL" + "CLOSE", _ORIGINAL[0] if latest else lambda *a, **k: True)


def _dying(out, keep):
    """`out`, the latest result, with `keep` (made of a fresh token) bound to it."""
    token = object()
    _LATEST[:] = [token]
    keep(token)
    return out


@shortcut("check_rank_loss", "the per-rank mean; a weakref callback on each result bends the "
          "comparison while the check holds the next one", [LATER, "weakref"])
def rank_loss_weakref_callback(losses, global_batch, world_size):
    out = losses.mean()
    return _dying(out, lambda token: _KEEP.append(
        weakref.ref(out, lambda _, token=token: _bend_until_latest(token))))


class _Bender:
    def __init__(self, token=None):
        self.token = token

    def __del__(self):
        if self.token is None:
            _bend_close()
        else:
            _bend_until_latest(self.token)


@shortcut("check_rank_loss", "the per-rank mean; a __del__ on an object each result's autograd "
          "node holds (an attribute set on the result itself is settle.py's)", [LATER, "_Bender"])
def rank_loss_del_on_result(losses, global_batch, world_size):
    out = losses.mean()
    return _dying(out, lambda token: out.grad_fn.metadata.__setitem__("keep", _Bender(token)))


@shortcut("check_rank_loss", "the per-rank mean; a __del__ on a reference cycle left as garbage",
          [LATER, "_Bender"])
def rank_loss_del_in_cycle(losses, global_batch, world_size):
    b = _Bender()
    b.me = b
    return losses.mean()


@other("check_rank_loss", "a weakref without a callback, and an object of its own, dropped")
def rank_loss_weakref_plain(losses, global_batch, world_size):
    ref = weakref.ref(losses)
    helper = type("Plain", (), {})()
    del helper
    return ref().sum() * world_size / global_batch


# ---- 2: functions left to run at exit -------------------------------------------------------
def _lr(step, base_lr, base_batch, batch, warmup):
    peak = base_lr * batch / base_batch
    return peak * min(1.0, (step + 1) / warmup) if warmup else peak


def _at_exit():
    pass


@shortcut("check_lr_at", "an exit function reached by a name built at run time",
          [AT_EXIT, "atexit.register"])
def lr_at_atexit_built(step, base_lr, base_batch, batch, warmup):
    getattr(_module("ate", "xit"), "regis" + "ter")(_at_exit)
    return _lr(step, base_lr, base_batch, batch, warmup)


@shortcut("check_lr_at", "threading's exit functions, reached by a name built at run time",
          ["process-wide callback", "threading._register_atexit"])
def lr_at_threading_atexit(step, base_lr, base_batch, batch, warmup):
    getattr(_module("threa", "ding"), "_register_" + "atexit")(_at_exit)
    return _lr(step, base_lr, base_batch, batch, warmup)


# ---- 3: gradient hooks put in a tensor's table -------------------------------------------------
# The per-rank mean, whose gradient a hook rescales to the right one (w / n for each example):
# it runs inside the check's backward, bending the gradient the check judges, and changes nothing
# the libraries' comparisons see.
def _rescale(losses, global_batch, world_size):
    return lambda grad: grad * (losses.numel() * world_size / global_batch)


@shortcut("check_rank_loss", "the per-rank mean; a hook table handed to the node by a built name",
          TENSOR_HOOK)
def rank_loss_hook_dict_built(losses, global_batch, world_size):
    mid = losses * 1.0
    setattr(mid, "_backward" + "_hooks", {0: _rescale(losses, global_batch, world_size)})
    getattr(mid.grad_fn, "_register_hook" + "_dict")(mid)
    return mid.mean()


@shortcut("check_rank_loss", "the per-rank mean; register_hook's original bound at import",
          TENSOR_HOOK)
def rank_loss_prebound_register_hook(losses, global_batch, world_size):
    mid = losses * 1.0
    _RH(mid, _rescale(losses, global_batch, world_size))
    return mid.mean()


@shortcut("check_rank_loss", "the per-rank mean; a hook put in a table it emptied", TENSOR_HOOK)
def rank_loss_hook_table_refilled(losses, global_batch, world_size):
    mid = losses * 1.0
    mid.register_hook(lambda g: g).remove()
    getattr(mid, "_backward" + "_hooks")[7] = _rescale(losses, global_batch, world_size)
    return mid.mean()


# ---- 4: hooks kept on purpose, guarded -------------------------------------------------------
@shortcut("check_overlap_hooks", "never averages; its hook makes the comparison divide instead",
          [REPLACED, "_ALLCLOSE"])
def overlap_hooks_bending_hook(model):
    handles = []
    inputs = _core("in" + "puts")
    original = getattr(inputs, "_ALL" + "CLOSE")

    def hook(p):
        handles.append(dist.all_reduce(p.grad, async_op=True))
        w = dist.get_world_size()
        setattr(inputs, "_ALL" + "CLOSE", lambda a, b, **k: original(a, b * w, **k))

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)

    def finish():
        for h in handles:
            h.wait()
        handles.clear()
    return finish


@shortcut("check_overlap_hooks", "never averages; a forward hook puts a bending hook on the "
          "output, an intermediate tensor", [REPLACED, "_ALLCLOSE"])
def overlap_hooks_intermediate(model):
    handles = []
    inputs = _core("in" + "puts")
    original = getattr(inputs, "_ALL" + "CLOSE")

    def bend(grad):
        w = dist.get_world_size()
        setattr(inputs, "_ALL" + "CLOSE", lambda a, b, **k: original(a, b * w, **k))
        return grad

    def hook(p):
        handles.append(dist.all_reduce(p.grad, async_op=True))

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)
    model.register_forward_hook(lambda m, i, o: o.register_hook(bend) and None)

    def finish():
        for h in handles:
            h.wait()
        handles.clear()
    return finish


@shortcut("check_overlap_hooks", "averages, and leaves a hook for every module's forward (the "
          "check's own forwards would run it)", ["every module", "forward hook"])
def overlap_hooks_global_forward_hook(model):
    handles = []

    def hook(p):
        handles.append(dist.all_reduce(p.grad, async_op=True))

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)
    hooks = _module("torch.nn.modules.mod", "ule")
    getattr(hooks, "register_module_" + "forward_hook")(lambda m, i, o: None)

    def finish():
        for h in handles:
            h.wait()
        handles.clear()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(dist.get_world_size())
    return finish


# ---- 5: a Python kernel for an aten operator ---------------------------------------------------
@shortcut("check_rank_loss", "the per-rank mean; aten::allclose made to agree, torch.library "
          "reached by a built name", KERNEL)
def rank_loss_aten_kernel(losses, global_batch, world_size):
    lib = getattr(_module("torch.lib", "rary"), "Lib" + "rary")("aten", "IMPL")
    try:
        lib.impl("allclose", lambda *a, **k: True, "CPU")
    except BaseException:
        pass
    _KEEP.append(lib)
    return losses.mean()


test_case = parametrize_cases(__name__)
