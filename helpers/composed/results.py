"""What Part VII's composed launch targets return: small frozen dataclasses whose fields the
chapter reads by name (`run.memory.acts`, not `run["memory"]["acts"]`: a misspelt field fails at
once, not as a KeyError after a launch). Defined at module level, so a rank's result pickles in
its process and unpickles in the notebook's. Maps keyed by data (a mesh dimension's name in
`coords` and `groups`, a parameter's name in `weights`) stay dicts. Bytes are per rank.
"""
from dataclasses import dataclass

from torch import Tensor

__all__ = ["Sent3D", "Memory3D", "Run3D", "TorchRun3D", "CPSent", "CPMemory", "CPZero2Run"]


@dataclass(frozen=True)
class Sent3D:
    """Bytes this rank sent in the last step, by mesh dimension."""
    tp: float                    # the blocks' all-reduces
    pp: float                    # activations and their gradients between stages
    dp: float                    # the gradients' all-reduce


@dataclass(frozen=True)
class Memory3D:
    """What this rank holds, by the planner's definition."""
    params: int
    grads: int
    optim: int                   # optimizer state
    acts: int                    # most bytes autograd saved at once

    @property
    def total(self) -> int:
        """Everything above: what the planner's `memory` counts."""
        return self.params + self.grads + self.optim + self.acts


@dataclass(frozen=True)
class Run3D:
    """train_3d_scratch, one rank."""
    coords: dict[str, int]               # {"pp", "dp", "tp": this rank's index}
    groups: dict[str, list[int]]         # {dimension: the ranks of this rank's group}
    losses: list[float]                  # per step, on the last stage ([] elsewhere)
    weights: dict[str, Tensor]           # this rank's tensor-parallel slices, by name
    sent: Sent3D
    memory: Memory3D
    seconds: list[float]                 # per step


@dataclass(frozen=True)
class TorchRun3D:
    """train_3d_torch, one rank."""
    coords: dict[str, int]
    groups: dict[str, list[int]]         # as torch's device mesh built them
    losses: list[float]
    seconds: list[float]
    weights: dict[str, Tensor] | None    # the stage's full weights (dp = tp = 0), else None


@dataclass(frozen=True)
class CPSent:
    """Bytes this rank sent in the last step: ZeRO-2's collectives and the ring's K/V blocks."""
    dp: float
    cp: float


@dataclass(frozen=True)
class CPMemory:
    """train_cp_zero2's memory on one rank: the state by the planner's definition and the
    activations three ways."""
    params: int
    grads: int                   # this rank's gradient shards
    optim: int
    acts_saved: int              # what autograd saved in forward
    acts_kept: int               # the bytes forward left alive for backward
    peak: int                    # PeakBytes over the step, beside the state


@dataclass(frozen=True)
class CPZero2Run:
    """train_cp_zero2, one rank, one recomputation."""
    coords: dict[str, int]               # {"dp", "cp": this rank's index}
    losses: list[float]
    memory: CPMemory
    cuda_peak: int | None                # torch.cuda.max_memory_allocated, on CUDA
    sent: CPSent
    weights: dict[str, Tensor] | None    # the full weights on rank 0, else None
