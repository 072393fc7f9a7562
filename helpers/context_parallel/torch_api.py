"""Part VII: PyTorch's own context parallelism, `context_parallel` from
torch.distributed.tensor.experimental (a prototype API): inside the context it shards the
given buffers along their sequence dimension (in place, with its head-and-tail load balancer:
our zig-zag) and replaces F.scaled_dot_product_attention by a ring attention over the mesh,
computing half blocks as our ring does. `set_rotate_method("alltoall")` passes the K/V blocks
around the ring; the default, "allgather", gathers them all at once.

Its ring is written for the SDPA kernels that exist on CUDA (flash, memory-efficient, cuDNN);
on a CPU, SDPA dispatches to a CPU kernel that DTensor has no rule for. So it runs here only
with a CUDA GPU per rank (one is enough: a world of 1 runs the same code path).
"""
import torch

__all__ = ["context_parallel_status", "torch_context_parallel", "ROTATE_METHODS"]

NEEDS = ("CUDA GPUs, one per rank (its ring replaces the flash, memory-efficient or cuDNN "
         "SDPA kernels, which exist only on CUDA; one GPU runs it at world 1)")
ROTATE_METHODS = ("allgather", "alltoall")


def context_parallel_status(device=None):
    """(runnable, reason): whether this torch has context_parallel and `device` is CUDA."""
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
    except ImportError as e:
        return False, f"torch {torch.__version__} has no context_parallel ({e})"
    if device is not None and torch.device(device).type != "cuda":
        return False, f"torch {torch.__version__} has context_parallel, but it needs {NEEDS}"
    return True, f"torch {torch.__version__} has context_parallel"


def torch_context_parallel(attn, X, mesh, grad_out, rotate="allgather"):
    """Run `attn` (a helpers.SmallAttention: its SDPA call is what context_parallel replaces) on
    the sequence X (B, T, width), split over `mesh` by torch's context_parallel, its K/V moved by
    `rotate` ("allgather" or "alltoall", set_rotate_method). Returns dict(ran, error, out,
    grads): this rank's output tokens (in the head-and-tail order) and its weight gradients, or
    the error that stopped it."""
    if rotate not in ROTATE_METHODS:
        raise ValueError(f"rotate must be one of {ROTATE_METHODS}, not {rotate!r}")
    ok, reason = context_parallel_status(X.device)
    if not ok:
        return dict(ran=False, error=reason)
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    x, g = X.detach().clone(), grad_out.detach().clone()
    try:
        set_rotate_method(rotate)
        with context_parallel(mesh, buffers=[x, g], buffer_seq_dims=[1, 1],
                              no_restore_buffers={x, g}):
            out = attn(x)
            out.backward(g)
    except Exception as e:   # reported to the reader, who sees the reason
        return dict(ran=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    finally:
        set_rotate_method("allgather")                  # torch's default, for whoever is next
    grads = {n: p.grad.detach().cpu().clone() for n, p in attn.named_parameters()}
    return dict(ran=True, error=None, out=out.detach().cpu().clone(), grads=grads)
