"""Nothing of the answer's code runs after its call returned, and what the verdicts read stays the
harness's, each with the words its refusal names:

1. process-wide callbacks (an audit hook, which cannot be removed; gc callbacks, finalizers,
   sys's and threading's hooks, signal handlers, import hooks) that would run the reader's code
   while the check judges it, after patched.py's comparison: refused when the answer's code
   names them (references.py), when installed (guard.py) or when left set (callbacks.py);
2. gradient hooks on any tensor of the returned graph (an intermediate one, not only those handed
   in), which the check's own backward would run: hooks.py notes them while the answer runs;
3. operators of the answer's own (torch.library): the work inside one runs with the Recorder
   popped, so it is refused by name (references.py) and when called (observe.py);
4. the harness's own tables (`inputs._ROUNDOFF`, `observe._NOT_WORK`): immutable, and a module
   global of the harness rebound is put back and fails (patched.py).
"""
import builtins
import gc
import importlib
import signal
import sys
import threading
import weakref

import torch
from check_cases import other, parametrize_cases, shortcut

LATER = "after your function returned"
INSTALLS = "process-wide callback"
TENSOR_HOOK = "still registered on a tensor"
OPERATOR = "operator of its own"
REPLACED = "replaced"


def _lr(step, base_lr, base_batch, batch, warmup):
    peak = base_lr * batch / base_batch
    return peak * min(1.0, (step + 1) / warmup) if warmup else peak


def _bend_abs(*args):
    builtins.abs = lambda x: 0.0


def _module(*parts):
    """A module reached by a name built at run time (the scan cannot read it)."""
    return importlib.import_module("".join(parts))


# ---- 1: process-wide callbacks ----------------------------------------------------------------
@shortcut("check_lr_at", "an audit hook (it cannot be removed) rebinds abs after the call",
          [INSTALLS, "sys.addaudithook"])
def lr_at_audit_hook(step, base_lr, base_batch, batch, warmup):
    getattr(_module("s", "ys"), "add" + "audithook")(_bend_abs)
    return 0.0


@shortcut("check_lr_at", "an audit hook named in the code", [LATER, "addaudithook"])
def lr_at_audit_hook_named(step, base_lr, base_batch, batch, warmup):
    sys.addaudithook(_bend_abs)
    return 0.0


@shortcut("check_lr_at", "a gc callback named in the code", [LATER, "gc.callbacks"])
def lr_at_gc_callback(step, base_lr, base_batch, batch, warmup):
    gc.callbacks.append(_bend_abs)
    return 0.0


@shortcut("check_lr_at", "a gc callback reached by a name built at run time", "gc.callbacks")
def lr_at_gc_callback_built(step, base_lr, base_batch, batch, warmup):
    getattr(_module("g", "c"), "call" + "backs").append(_bend_abs)
    return 0.0


@shortcut("check_lr_at", "sys.excepthook set by a name built at run time", "sys.excepthook")
def lr_at_excepthook(step, base_lr, base_batch, batch, warmup):
    setattr(_module("s", "ys"), "except" + "hook", _bend_abs)
    return 0.0


@shortcut("check_lr_at", "a trace function for threads started later", "threading.settrace")
def lr_at_thread_trace(step, base_lr, base_batch, batch, warmup):
    getattr(_module("thread", "ing"), "set" + "trace")(_bend_abs)
    return 0.0


@shortcut("check_lr_at", "a signal handler of its own", "signal.signal")
def lr_at_signal(step, base_lr, base_batch, batch, warmup):
    getattr(_module("sig", "nal"), "sig" + "nal")(signal.SIGUSR2, _bend_abs)
    return 0.0


class _Finder:
    def find_spec(self, name, path=None, target=None):
        _bend_abs()


@shortcut("check_lr_at", "an import hook that runs when the check imports", "sys.meta_path")
def lr_at_import_hook(step, base_lr, base_batch, batch, warmup):
    getattr(_module("s", "ys"), "meta" + "_path").insert(0, _Finder())
    return 0.0


@shortcut("check_merge_attention", "no merge; a finalizer on an argument rebinds allclose",
          [LATER, "weakref.finalize"])
def merge_attention_finalizer(o1, lse1, o2, lse2):
    weakref.finalize(lse2, _bend_abs)
    return o1, lse1


@shortcut("check_merge_attention", "no merge; a finalizer reached by a name built at run time",
          "weakref.finalize")
def merge_attention_finalizer_built(o1, lse1, o2, lse2):
    getattr(_module("weak", "ref"), "fin" + "alize")(lse2, _bend_abs)
    return o1, lse1


# ---- 2: gradient hooks on any tensor of the returned graph ------------------------------------
def _bend_allclose(grad):
    torch.allclose = lambda *a, **k: True
    return grad


@shortcut("check_rank_loss", "the per-rank mean, through an intermediate tensor's gradient hook",
          TENSOR_HOOK)
def rank_loss_intermediate_hook(losses, global_batch, world_size):
    mid = losses * 1.0
    mid.register_hook(_bend_allclose)
    return mid.mean()


@shortcut("check_rank_loss", "the per-rank mean, through torch's multi-grad hook", TENSOR_HOOK)
def rank_loss_multi_grad_hook(losses, global_batch, world_size):
    mid = losses * 1.0
    torch.autograd.graph.register_multi_grad_hook((mid,), lambda grads: _bend_allclose(None))
    return mid.mean()


@other("check_rank_loss", "a gradient hook registered and removed inside the call")
def rank_loss_hook_removed(losses, global_batch, world_size):
    mid = losses * 1.0
    handle = mid.register_hook(lambda g: g)
    handle.remove()
    return mid.sum() * world_size / global_batch


# ---- 3: operators of the answer's own ---------------------------------------------------------
_CTX = {}


@torch.library.custom_op("after_the_call::dim", mutates_args=())
def _unused_inside() -> torch.Tensor:
    model, loss = _CTX["model"], _CTX["loss"]
    names, params = zip(*model.named_parameters(), strict=True)
    grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
    _CTX["unused"] = sorted(n for n, g in zip(names, grads, strict=True) if g is None)
    return torch.zeros(())


@shortcut("check_unused_parameters", "a backward pass inside a custom operator named dim",
          [OPERATOR, "after_the_call"])
def unused_in_custom_op(model, loss):
    _CTX.update(model=model, loss=loss)
    torch.ops.after_the_call.dim()
    return _CTX["unused"]


@shortcut("check_unused_parameters", "the custom operator's object called directly", OPERATOR)
def unused_in_custom_op_object(model, loss):
    _CTX.update(model=model, loss=loss)
    _unused_inside()
    return _CTX["unused"]


@shortcut("check_unused_parameters", "a custom operator reached by a name built at run time, its "
          "refusal caught", [OPERATOR, "after_the_call::dim"])
def unused_in_custom_op_built(model, loss):
    _CTX.update(model=model, loss=loss)
    try:
        getattr(getattr(torch.ops, "after_the" + "_call"), "d" + "im")()
    except BaseException:
        pass
    return _CTX.get("unused", [])


# ---- 4: the harness's own tables --------------------------------------------------------------
def _core(name):
    return next(m for n, m in list(sys.modules.items()) if n.endswith("_core." + name))


@shortcut("check_dp_step_seconds", "no overlap; widens the unit-roundoff table in place",
          "does not support item assignment")
def dp_step_roundoff_widened(compute_s, k, comm_s):
    getattr(_core("in" + "puts"), "_ROUND" + "OFF")[torch.float64] = 0.06
    return compute_s / k + comm_s


@shortcut("check_dp_step_seconds", "no overlap; rebinds the unit-roundoff table",
          [REPLACED, "_ROUNDOFF"])
def dp_step_roundoff_rebound(compute_s, k, comm_s):
    setattr(_core("in" + "puts"), "_ROUND" + "OFF", {torch.float64: 0.06})
    return compute_s / k + comm_s


def _naive_allreduce(data):
    total = data[0].clone()
    for t in data[1:]:
        total.add_(t.to(total.device))
    for t in data:
        t.copy_(total.to(t.device))


@shortcut("check_allreduce_spread", "every addition on device 0; additions made not work",
          "no attribute 'update'")
def allreduce_not_work_widened(data):
    getattr(_core("ob" + "serve"), "_NOT" + "_WORK").update({"add", "add_"})
    _naive_allreduce(data)


@shortcut("check_allreduce_spread", "every addition on device 0; the not-work set rebound",
          [REPLACED, "_NOT_WORK"])
def allreduce_not_work_rebound(data):
    mod = _core("ob" + "serve")
    setattr(mod, "_NOT" + "_WORK", getattr(mod, "_NOT" + "_WORK") | {"add", "add_"})
    _naive_allreduce(data)


@other("check_lr_at", "the plain formula, beside the checks above")
def lr_at_plain(step, base_lr, base_batch, batch, warmup):
    return _lr(step, base_lr, base_batch, batch, warmup)


test_case = parametrize_cases(__name__)


def test_nothing_is_left_behind(monkeypatch):
    """After the refusals, the process is as it was: no gc callback, import hook, excepthook,
    thread trace or signal handler of this module's, and the harness's tables untouched."""
    import helpers.checks
    from helpers.checks._core import inputs, observe
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    for fn in (lr_at_gc_callback_built, lr_at_excepthook, lr_at_thread_trace, lr_at_signal,
               lr_at_import_hook):
        assert helpers.checks.check_lr_at(fn).status == "failed"
    for fn in (dp_step_roundoff_widened, dp_step_roundoff_rebound):
        assert helpers.checks.check_dp_step_seconds(fn).status == "failed"
    assert helpers.checks.check_lr_at(lr_at_plain).status == "passed"
    assert not [f for f in gc.callbacks if f is _bend_abs]
    assert not [f for f in sys.meta_path if isinstance(f, _Finder)]
    assert sys.excepthook is not _bend_abs and threading.gettrace() is not _bend_abs
    assert signal.getsignal(signal.SIGUSR2) is not _bend_abs
    assert inputs.unit_roundoff(torch.float64) == 2.0**-53 and "add" not in observe._NOT_WORK
