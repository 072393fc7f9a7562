"""Torch's global and thread-local switches around the answer's call: grad mode, inference mode,
the default dtype, anomaly mode, deterministic algorithms, autocast, autograd's multithreading,
saved-tensor hooks. A switch the answer leaves changed (`torch.set_grad_enabled(False)`, a
default dtype of float64 with `torch.Storage` put back) would bend the check's own computations
afterwards and the reader's later cells, and binds no name patched.py compares: noted when the
answer is called, compared after it returns (or raises), put back, and the answer fails naming
the switch."""
import torch

from .run import CheckFailed

__all__ = ["switches", "expect_same_switches"]

_C = torch._C
_SAVED_HOOKS_ON = getattr(_C._autograd, "_saved_tensors_hooks_is_enabled", None)


def _inference(on):
    """Inference mode is a C++ guard, not a flag: a guard for the wanted state entered and
    kept for the rest of the process (what the answer's left-open guard would have done)."""
    guard = _C._InferenceMode(on)
    _KEPT.append(guard)


_KEPT = []
_AUTOCAST = ("cpu", "cuda")


def _saved_hooks(on):
    if on:
        _C._autograd._saved_tensors_hooks_enable()
    else:
        _C._autograd._saved_tensors_hooks_disable("disabled by the reader's code")


# (name, read, put back, how to restore it in the message); inference mode before grad mode,
# which it switches off too
_SWITCHES = (
    ("inference mode (torch.is_inference_mode_enabled())", torch.is_inference_mode_enabled,
     _inference, "use `with torch.inference_mode():` and leave it"),
    ("grad mode (torch.is_grad_enabled())", torch.is_grad_enabled, torch.set_grad_enabled,
     "use `with torch.no_grad():` or `with torch.enable_grad():` instead of "
     "torch.set_grad_enabled(...)"),
    ("the default dtype (torch.get_default_dtype())", torch.get_default_dtype,
     torch.set_default_dtype, "pass dtype= to what you create, or set it back before returning"),
    ("anomaly mode (torch.is_anomaly_enabled())",
     lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
     lambda v: torch.set_anomaly_enabled(*v),
     "use `with torch.autograd.detect_anomaly():`"),
    ("deterministic algorithms (torch.are_deterministic_algorithms_enabled())",
     lambda: (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled()),
     lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
     "set it back before returning"),
    ("autocast (torch.is_autocast_enabled)",
     lambda: tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _AUTOCAST),
     lambda v: [(torch.set_autocast_enabled(d, on), torch.set_autocast_dtype(d, dt))
                for d, (on, dt) in zip(_AUTOCAST, v, strict=True)],
     "use `with torch.autocast(...):`"),
    ("autograd's multithreading (torch.autograd.set_multithreading_enabled)",
     _C._is_multithreading_enabled, _C._set_multithreading_enabled,
     "use `with torch.autograd.set_multithreading_enabled(...):`"),
)
if _SAVED_HOOKS_ON is not None:
    _SWITCHES += (("saved-tensor hooks (torch.autograd.graph.disable_saved_tensors_hooks)",
                   _SAVED_HOOKS_ON, _saved_hooks,
                   "use `with torch.autograd.graph.disable_saved_tensors_hooks(...):`"),)


def switches():
    """The calling thread's switches, in _SWITCHES' order."""
    return tuple(read() for _, read, _, _ in _SWITCHES)


def expect_same_switches(name, before):
    """Put back every switch the answer left changed; fail naming the first."""
    changed = []
    for (what, read, put, fix), was in zip(_SWITCHES, before, strict=True):
        now = read()
        if now != was:
            put(was)
            changed.append((what, was, now, fix))
    if changed:
        what, was, now, fix = changed[0]
        raise CheckFailed(f"{name} left {what} changed ({was} when called, {now} after): it "
                          f"would bend the check's own computations and your later cells; "
                          f"restore it ({fix})")
