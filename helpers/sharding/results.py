"""What Part V's launch targets return: one small frozen dataclass per experiment, its fields
named for what they hold, so a chapter reads `run.rel_diff`, not `run["rel_diff"]` (a misspelt
field fails at once, in the editor, not as a KeyError after a launch). Each is defined here, at
module level, so a rank's result pickles in its process and unpickles in the notebook's.
Differences are max |a - b| over every element (`compare.max_diff`) unless named rel_ (distance
over how far training moved the weights: `compare.rel_diff`); bytes are per rank.
"""
from dataclasses import dataclass
from typing import NamedTuple

from torch import Tensor

__all__ = ["OptimizerRun", "Zero1Run", "Zero2Run", "FsdpRun", "Fsdp2Run", "DcpRun",
           "StageMemory", "Zero1CheckpointRun", "AccumulationMode", "AccumulationRun",
           "ClipNorms", "ClipRun", "KnobSetting", "KnobRun", "MixedZeroRun", "OffloadSide",
           "OffloadRun", "QwzRun"]


# ---------------------------------------------------------------- experiments.py
@dataclass(frozen=True)
class OptimizerRun:
    """One sharded optimizer's run (ZeRO-1 by hand, or torch's ZeroRedundancyOptimizer)."""
    diff: float          # the weights against one process
    state_bytes: int     # optimizer state this rank holds


@dataclass(frozen=True)
class Zero1Run:
    """zero1_vs_one_process: ShardedOptimizer and torch's ZeroRedundancyOptimizer."""
    scratch: OptimizerRun        # ShardedOptimizer
    torch: OptimizerRun          # ZeroRedundancyOptimizer
    scratch_vs_torch: float      # the two runs' weights against each other
    param_bytes: int             # the whole model's float32 parameters
    largest: int                 # elements of the largest tensor


@dataclass(frozen=True)
class Zero2Run:
    """zero2_vs_one_process."""
    diff: float
    grad_bytes: int      # gradients held after finish_gradient_synchronization
    state_bytes: int


@dataclass(frozen=True)
class FsdpRun:
    """fsdp_scratch_vs_one_process; the precision gaps (one-process float32 against one-process
    low precision) only when a compute dtype was given."""
    diff: float
    rel_diff: float
    shard_bytes: int             # this rank's parameter shards
    full_bytes: int              # the whole model's parameters
    state_bytes: int
    peak_gathered_bytes: int     # most gathered weights alive at once
    losses: tuple[float, ...]    # this rank's loss per step
    precision_gap: float | None = None
    rel_precision_gap: float | None = None


@dataclass(frozen=True)
class Fsdp2Run:
    """fsdp2_vs_one_process: fully_shard against one process and against FSDPFromScratch."""
    diff: float
    diff_scratch: float          # FSDP2 against FSDPFromScratch
    local_bytes: int             # FSDP2's local shards on this rank
    full_bytes: int
    sent_fsdp2: float            # bytes sent per step
    sent_scratch: float


@dataclass(frozen=True)
class DcpRun:
    """dcp_save_sharded / dcp_load_resharded: at the save (or just after the load) and after
    one step more."""
    full: dict[str, Tensor]      # {name: full parameter}
    optim: dict[str, Tensor]     # {name.state key: full optimizer state}
    local_bytes: int
    after: dict[str, Tensor]     # the full parameters after the next step


@dataclass(frozen=True)
class StageMemory:
    """memory_per_stage, one stage (dp, zero1, zero2, zero3) on this rank."""
    n_params: int
    params_bytes: int
    grads_bytes: int
    optim_bytes: int
    sent_bytes: float
    calls: dict[str, int]        # collectives called, by name
    transient_peak: int          # most bytes created during the step alive at once
    peak_bytes: int              # params + optimizer state + transient_peak
    cuda_peak: int | None        # torch.cuda.max_memory_allocated, on a GPU

    @property
    def held_bytes(self) -> int:
        """Parameters, gradients and optimizer state: what the cost model's total counts."""
        return self.params_bytes + self.grads_bytes + self.optim_bytes


@dataclass(frozen=True)
class Zero1CheckpointRun:
    """zero1_checkpoint: resumed runs against the uninterrupted one."""
    resumed_diff: float          # a fresh ShardedOptimizer loaded from the checkpoint
    plain_diff: float            # plain AdamW on one process loaded from it
    entries_after_load: int      # tensors this rank holds state for after loading
    owned: int                   # tensors this rank owns
    saved_entries: int           # tensors in the consolidated checkpoint


# ---------------------------------------------------------------- knobs_experiments.py
@dataclass(frozen=True)
class AccumulationMode:
    diff: float
    sent: float                  # bytes per step
    calls: dict[str, int]


@dataclass(frozen=True)
class AccumulationRun:
    """zero2_accumulation: a reduce-scatter per micro-batch, or no_sync."""
    every: AccumulationMode
    no_sync: AccumulationMode
    dp_sent: float               # the cost model's DDP all-reduce per step
    micro: int                   # micro-batches per step


@dataclass(frozen=True)
class ClipNorms:
    local_norms: tuple[float, ...]   # torch's clip_grad_norm_ on this rank's shards, per step
    norms: tuple[float, ...]         # the wrapper's global norm, per step
    diff: float


@dataclass(frozen=True)
class ClipRun:
    """clip_over_shards."""
    one_process_norms: tuple[float, ...]
    zero2: ClipNorms
    fsdp: ClipNorms


class KnobSetting(NamedTuple):
    """fsdp_knobs' key: a wrapper and its knobs, a tuple (`knobs[("fsdp2", False, False)]`
    finds it) that prints as "fsdp2:reshard=False:prefetch=False"."""
    impl: str                    # "scratch" (FSDPFromScratch) or "fsdp2" (fully_shard)
    reshard: bool                # reshard_after_forward
    prefetch: bool

    def __str__(self):
        return f"{self.impl}:reshard={self.reshard}:prefetch={self.prefetch}"

    def __format__(self, spec):
        return format(str(self), spec)


@dataclass(frozen=True)
class KnobRun:
    """fsdp_knobs, one setting; the gathered peak and the timeline by hand only."""
    diff: float
    gathers: float               # all-gathers per step
    sent: float                  # bytes per step
    transient_peak: int
    peak_gathered: int | None = None
    events: tuple[tuple, ...] | None = None   # (time, "gather"/"wait"/"compute", unit)


@dataclass(frozen=True)
class MixedZeroRun:
    """mixed_precision_zero."""
    per_param: dict[str, float]  # bytes per parameter held, by kind
    n_params: int
    transient_peak: int
    diff: float
    rel_diff: float
    rel_precision_gap: float     # bfloat16 against float32 training, one process


# ---------------------------------------------------------------- variants_experiments.py
@dataclass(frozen=True)
class OffloadSide:
    """offload_run, one side (on the device, or offloaded): where each state lives."""
    weights: str
    grads: str
    optimizer: str
    device: str
    shard_bytes: int
    state_bytes: int
    n_params: int
    h2d_per_step: float          # bytes handed to all-gathers
    d2h_per_step: float          # bytes taken from reduce-scatters
    gathers_per_step: float


@dataclass(frozen=True)
class OffloadRun:
    on_device: OffloadSide
    offload: OffloadSide
    diff: float                  # the two runs' weights


@dataclass(frozen=True)
class QwzRun:
    """qwz_vs_all_gather."""
    diff: float                  # qwZ's gather against float32's
    bound: float                 # the rounding bound
    numel: int
    plain_sent: float
    qwz_sent: float
    block: int
