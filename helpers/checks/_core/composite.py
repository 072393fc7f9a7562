"""One set of operation names in and out of inference mode. Normally a composite operation
(`.item()`, `.to()`, `conv2d`) is split into its parts before any TorchDispatchMode sees it;
under `torch.inference_mode()` the mode is handed the composite whole (`item`, not
`_local_scalar_dense`), so a refusal, a transfer count or a placeholder keyed on the parts would
miss it. Each of the harness's modes splits such an operation itself, with the mode re-entered,
so it and every mode below it see the parts, as they do outside inference mode."""
import torch

__all__ = ["split_composite", "version_of"]

_KEY = torch._C.DispatchKey.CompositeImplicitAutograd
_HAS = {}


def split_composite(mode, func, args, kwargs, *, _HAS=_HAS):
    """func's parts run under `mode` (the result), or NotImplemented when func has none."""
    if func not in _HAS:
        _HAS[func] = _KEY in getattr(func, "py_kernels", {}) or _registered(func)
    if not _HAS[func]:
        return NotImplemented
    with mode:
        return func.decompose(*args, **kwargs)


def _registered(func):
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _KEY)
    except RuntimeError:        # an operator the dispatcher does not list (prim::device)
        return False


def version_of(t):
    """A tensor's version counter; None for an inference tensor, which has none (reading it
    raises)."""
    return None if t.is_inference() else t._version


del _HAS
