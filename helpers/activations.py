"""The course's one measure of activation memory: the bytes of the tensors autograd saves for
backward, seen as they pass through torch.autograd.graph.saved_tensors_hooks."""
import torch
from torch import nn

__all__ = ["saved_tensor_bytes", "local_tensor"]


def local_tensor(t):
    """A DTensor's local tensor (this rank's storage); any other tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def _storage_key(t):
    """Which storage t uses: its address, or on the meta device (no addresses) the tensor it is
    a view of."""
    t = local_tensor(t)
    if t.device.type == "meta":
        return "meta", id(t._base if t._base is not None else t)
    return t.untyped_storage().data_ptr()


def saved_tensor_bytes(fn, *args, params=(), seen=None):
    """(bytes, fn(*args)): the bytes of the storages autograd saves for backward while fn runs.
    Each storage counts once, with its size when first saved (a tensor saved by two operations,
    or a view of one counted, adds nothing); the storages of `params`, and of fn's parameters
    when fn is a module, are left out (weights, not activations). `seen` ({storage: tensor}),
    shared by several calls, counts a storage in the first call that saves it only."""
    params = [*params, *(fn.parameters() if isinstance(fn, nn.Module) else ())]
    skip = {_storage_key(p) for p in params}
    seen = {} if seen is None else seen
    total = 0

    def pack(t):
        nonlocal total
        key = _storage_key(t)
        if key not in skip and key not in seen:
            seen[key] = t          # held: its address is not reused while the count goes on
            total += local_tensor(t).untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return total, out
