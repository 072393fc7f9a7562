"""What Part VII's expert-parallel launch targets return: small frozen dataclasses whose fields
the chapter reads by name (`run.dropped`, not `run["dropped"]`: a misspelt field fails at once,
not as a KeyError after a launch). Defined at module level, so a rank's result pickles in its
process and unpickles in the notebook's. Tensors are this rank's tokens, on the CPU; gradients
are named as in the unsplit MoE; bytes are what this rank's all-to-alls sent.
"""
from dataclasses import dataclass

from torch import Tensor

__all__ = ["EqualRun", "ImbalanceRow", "ProductionRun"]


@dataclass(frozen=True)
class EqualRun:
    """ep_equal_run, one capacity factor."""
    factor: float | None         # None: dropless
    y: Tensor                    # this rank's output
    x_grad: Tensor
    grads: dict[str, Tensor]     # this rank's experts' and the (summed) router's
    dropped: int                 # choices dropped by the capacity
    aux_loss: float              # the balancing loss
    fwd_bytes: float
    bwd_bytes: float
    tokens: int                  # this rank's
    received: list[int]          # rows each of its experts computed


@dataclass(frozen=True)
class ImbalanceRow:
    """ep_imbalance_run, one skew of the router and one capacity factor."""
    skew: float
    factor: float | None
    dropped: int
    choices: int                 # this rank's tokens x k
    received: int                # real rows its experts computed
    sent_bytes: float            # forward
    aux_loss: float
    seconds: float               # the forward's, median over the repeats


@dataclass(frozen=True)
class ProductionRun:
    """ep_production_run: EPMoE on an (dp, ep) mesh, dropless."""
    y: Tensor
    x_grad: Tensor
    grads: dict[str, Tensor]     # after reduce_gradients
    sent_bytes: float
    grouped_mm: str              # which grouped GEMM ran
    received: list[int]
    z_loss: float
    first: int                   # this rank's first expert
    local: int                   # experts on this rank
