"""What Part VI's tensor-parallel launch targets return: small frozen dataclasses whose fields
the chapters read by name (`run.x_grad`, not `run["x_grad"]`: a misspelt field fails at once,
not as a KeyError after a launch). Defined at module level, so a rank's result pickles in its
process and unpickles in the notebook's. Maps keyed by data stay dicts: gradients and shapes by
parameter name, groups by mesh dimension, and the collectives by dimension, then by op, as
[calls, wire bytes]. fwd, bwd and log are helpers.Transfer records (op, payload, wire, ...).
"""
from dataclasses import dataclass

from torch import Tensor

from ..runtime.traffic import Transfer

__all__ = ["BlockRun", "VocabRun", "Mesh2DRun", "HsdpRun"]


@dataclass(frozen=True)
class BlockRun:
    """tp_worker, one module's forward and backward on this rank (its output and input
    gradient: the positions it holds under sequence parallelism)."""
    out: Tensor
    x_grad: Tensor
    grads: dict[str, Tensor]             # this rank's slices, by parameter name
    fwd: list[Transfer]                  # the collectives in forward
    bwd: list[Transfer]                  # and in backward
    saved: int | None = None             # bytes autograd saved in forward (sp_runs)
    comm_counts: dict[str, int] | None = None    # DTensor's CommDebugMode, by op
    ln_grad_placements: dict[str, str] | None = None   # the layer norms' gradients (DTensor)


@dataclass(frozen=True)
class VocabRun:
    """tp_worker with lm: the TinyTPLM with its vocabulary split, by hand or with DTensor."""
    loss: float
    grads: dict[str, Tensor]
    logits_bytes: int                    # the logits this rank holds
    fwd: list[Transfer] | None = None    # by hand: forward and backward apart
    bwd: list[Transfer] | None = None
    log: list[Transfer] | None = None    # DTensor: the whole step's
    placements: dict[str, tuple[str, str]] | None = None   # DTensor: (parameter, gradient)


@dataclass(frozen=True)
class Mesh2DRun:
    """mesh2d_worker, one rank of the dp x tp mesh."""
    weights: dict[str, Tensor] | None    # the full weights on rank 0, else None
    losses: list[float]
    local_shapes: dict[str, tuple[int, ...]]
    coords: tuple[int, int]              # (dp, tp)
    traffic: dict[str, dict[str, list]]  # the last step's {dim: {op: [calls, wire bytes]}}
    groups: dict[str, list[int]]


@dataclass(frozen=True)
class HsdpRun:
    """hsdp_worker, one rank of the (replicate, shard) mesh."""
    losses: list[float]
    traffic: dict[str, dict[str, list]]
    groups: dict[str, list[int]]
    weights: dict[str, Tensor] | None
    local_shapes: dict[str, tuple[int, ...]]
    placements: str                      # a parameter's DTensor placements
    odd_local: dict[str, tuple[int, ...]]    # nn.Linear(5, 3)'s local shapes (rows: 2 and 1)
    odd_equal: bool                      # its full_tensor() equals the unsharded weights
