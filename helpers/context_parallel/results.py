"""What Part VII's context-parallel launch targets return: small frozen dataclasses whose fields
the chapter reads by name (`run.live_fwd`, not `run["live_fwd"]`: a misspelt field fails at
once, not as a KeyError after a launch). Defined at module level, so a rank's result pickles in
its process and unpickles in the notebook's. Tensors are this rank's tokens, on the CPU; bytes
are what this rank sent.
"""
from dataclasses import dataclass

from torch import Tensor

__all__ = ["RingRun", "UlyssesRun", "SavedAt", "RotateRun", "TorchCPRun"]


@dataclass(frozen=True)
class RingRun:
    """cp_attention_run, one layout: ring attention's output, q/k/v gradients and costs."""
    out: Tensor
    dq: Tensor
    dk: Tensor
    dv: Tensor
    blocks: list[dict]           # ring_attention's stats: one dict per block computed
    fwd_bytes: float
    bwd_bytes: float
    sends: int
    live_fwd: float              # most K/V blocks' worth of buffers alive at once, forward
    live_bwd: float              # and backward


@dataclass(frozen=True)
class UlyssesRun:
    """cp_ulysses_run: all-to-all attention on this rank's tokens (contiguous split)."""
    out: Tensor
    dq: Tensor
    dk: Tensor
    dv: Tensor
    sent: float                  # bytes its all-to-alls sent
    calls: int                   # all-to-alls


@dataclass(frozen=True)
class SavedAt:
    """cp_activation_memory, one sequence length."""
    T: int
    saved_bytes: int             # saved for backward on this rank
    max_diff: float              # output and gradients against the unsplit layer


@dataclass(frozen=True)
class RotateRun:
    """cp_torch_run, one rotate method: whether it ran, why not, and (when it ran) how far the
    weights' gradients are from the unsplit layer's."""
    ran: bool
    error: str | None
    max_diff: float | None = None


@dataclass(frozen=True)
class TorchCPRun:
    """cp_torch_run: torch's context_parallel on a SmallAttention layer."""
    torch_version: str
    device: str
    world: int
    runs: dict[str, RotateRun]   # by rotate method
