"""Part VII: PyTorch's own context parallelism, `context_parallel` from
torch.distributed.tensor.experimental (a prototype API): inside the context it shards the
given buffers along their sequence dimension (in place) and replaces
F.scaled_dot_product_attention by a ring attention over the mesh.

Its ring is written for the SDPA kernels that exist on CUDA (flash, memory-efficient, cuDNN); on
a CPU, SDPA dispatches to a CPU kernel that DTensor has no rule for, and the call raises. We
attempt it wherever we are and report what happened, rather than assume.
"""
import torch

__all__ = ["context_parallel_status", "torch_context_parallel"]

NEEDS = ("CUDA GPUs, one per rank (its ring replaces the flash, memory-efficient or cuDNN "
         "SDPA kernels, which exist only on CUDA), and a torch that has "
         "torch.distributed.tensor.experimental.context_parallel (checked when it runs)")


def context_parallel_status():
    """(importable, reason): whether this torch has context_parallel at all."""
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
    except ImportError as e:
        return False, f"torch {torch.__version__} has no context_parallel ({e})"
    return True, f"torch {torch.__version__} has context_parallel"


def torch_context_parallel(attn, X, mesh, grad_out):
    """Run `attn` (a helpers.SmallAttention: its SDPA call is what context_parallel replaces) on
    the sequence X (B, T, width), split over `mesh` by torch's context_parallel with its load
    balancing (the same head-and-tail split as our zig-zag). Returns dict(ran, error, out,
    grads): this rank's output tokens (in the zig-zag order) and its weight gradients, or the
    error that stopped it."""
    ok, reason = context_parallel_status()
    if not ok:
        return dict(ran=False, error=reason)
    from torch.distributed.tensor.experimental import context_parallel
    x, g = X.detach().clone(), grad_out.detach().clone()
    try:
        with context_parallel(mesh, buffers=[x, g], buffer_seq_dims=[1, 1],
                              no_restore_buffers={x, g}):
            out = attn(x)
            out.backward(g)
    except Exception as e:   # noqa: BLE001 - reported to the reader, who sees the reason
        return dict(ran=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    grads = {n: p.grad.detach().cpu().clone() for n, p in attn.named_parameters()}
    return dict(ran=True, error=None, out=out.detach().cpu().clone(), grads=grads)
