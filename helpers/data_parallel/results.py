"""What data_parallel's launch targets return (experiments.py: Part III's BatchNorm and Join
lessons, Part IV's profile and knobs; scratch_experiments.py and overlap_experiments.py:
DDPFromScratch against one process and torch's DDP, and its overlap; speed_experiments.py and
fast_experiments.py: the timed workers): small frozen dataclasses whose fields the chapters read
by name (`run.acc`, not `run["acc"]`: a misspelt field fails at once, not as a KeyError after a
launch). Defined at module level, so a rank's result pickles in its process and unpickles in
the notebook's. Maps keyed by data (a BatchNorm variant, a knob's name) stay dicts.
"""
from dataclasses import dataclass

from torch import Tensor

from ..timing import Measurement, Ratio

__all__ = ["BnRun", "JoinRun", "DdpTrace", "KnobsRun", "DdpCase", "UnusedCase", "NoSyncCase",
           "Refusal", "ScratchRefusals", "ExposedMode", "ExposedRun", "GradientTimeline",
           "OverlapSteps", "TraceMode", "ScratchTrace", "EmulatedMode", "EmulatedRun",
           "WorkerTimes", "WorkerSweep", "RankSums", "EpochRun", "Collective", "SyncBnTraffic",
           "SyncBnCost", "DpVsDdp"]


@dataclass(frozen=True)
class BnRun:
    """bn_vs_syncbn, one variant ("bn" or "syncbn") on this rank."""
    stats: dict                  # bn_stats: the BatchNorm layers' running statistics
    acc: float                   # test accuracy
    total: int                   # test images
    state: dict[str, Tensor]     # the model's state dict, on the CPU


@dataclass(frozen=True)
class JoinRun:
    """uneven_inputs_join, one rank."""
    steps: int                   # batches this rank trained on
    finished: bool               # False: it timed out waiting (without Join)
    weight: Tensor               # the replica's weight at the end


@dataclass(frozen=True)
class DdpTrace:
    """ddp_trace, one rank: its Chrome trace and the step's events read from it."""
    trace: str                   # the trace file's path
    events: list[dict]           # helpers.trace_events of it
    device: str
    backend: str
    activities: list[str]        # the profiler's (CPU, and CUDA on a GPU)


@dataclass(frozen=True)
class KnobsRun:
    """ddp_knobs, one rank: each knob by its name."""
    step_s: dict[str, list[float]]       # seconds per step, the knobs timed in turns
    exposed_s: dict[str, list[float]]    # communication left after backward's compute, per step
    max_diff: dict[str, float]           # parameters against the default's
    traced: dict[str, dict]              # the traced knobs: helpers.exposed_ms and steps


class _Modes:
    """A run with an "overlap" field (the all-reduces launched from the hooks) and an "after"
    field (all launched in finish), each the same kind of result."""

    def modes(self):
        """{"overlap": ..., "after": ...}: the two modes, for a loop over both."""
        return {"overlap": self.overlap, "after": self.after}


# ---------------------------------------------------------------- scratch_experiments.py
@dataclass(frozen=True)
class DdpCase:
    """ddp_vs_one_process, one (model kind, bucket_mb): max |difference| to one process."""
    kind: str
    bucket_mb: float | None
    scratch: float               # DDPFromScratch against one process
    torch: float                 # torch's DDP against one process
    calls: int                   # DDPFromScratch's all-reduces in the last step
    num_buckets: int
    sizes: list[int]             # parameters per bucket
    num_trainable: int           # trainable parameters of the model


@dataclass(frozen=True)
class UnusedCase:
    """unused_vs_torch, one (optimizer, bucket_mb or "torch": DDP(find_unused_parameters))."""
    optim: str
    bucket_mb: float | str | None
    never_none: bool             # the layer no rank uses kept .grad None
    diff: float                  # against one process
    state: dict[str, Tensor]     # the parameters at the end


@dataclass(frozen=True)
class NoSyncCase:
    """accumulation_vs_torch, one (k micro-batches, how: "last", "all" or "torch")."""
    k: int
    how: str
    diff: float                  # against one process on the whole batch
    calls: int                   # all-reduces in the last step
    num_buckets: int | None      # None for torch's DDP


@dataclass(frozen=True)
class Refusal:
    """The error a refused case raised."""
    kind: str                    # the exception's type name
    has_words: bool              # its message holds every word that names the fix
    message: str


@dataclass(frozen=True)
class ScratchRefusals:
    """scratch_refusals: each case by its name (None: nothing was raised), and the all-reduces
    of a second finish and of a finish on one rank only."""
    refused: dict[str, Refusal | None]
    extra_finish_calls: int


@dataclass(frozen=True)
class ExposedMode:
    """exposed_comm_times, one mode: one sample per round."""
    exposed: list[float]         # the rest of finish: the all-reduces waited for, the copies back
    compute: list[float]         # backward to the last gradient, plus every launch made after it
    launches: list[float]        # seconds spent launching buckets (copy in, queue the all-reduce)
    pending: list[int]           # all-reduces not yet completed at the last gradient


@dataclass(frozen=True)
class ExposedRun(_Modes):
    """exposed_comm_times."""
    overlap: ExposedMode
    after: ExposedMode
    num_buckets: int


# ---------------------------------------------------------------- overlap_experiments.py
@dataclass(frozen=True)
class GradientTimeline:
    """gradient_timeline: seconds since loss.backward() started, on the model's clock."""
    events: list[tuple[float, str, int]]     # (seconds, "grad"/"launch"/"done", index)
    backward_s: float                        # when backward returned
    finish_s: float                          # when finish returned
    num_buckets: int
    device: str


@dataclass(frozen=True)
class OverlapSteps(_Modes):
    """overlap_step_times: seconds of backward + finish, one sample per round."""
    overlap: list[float]
    after: list[float]
    done_before_backward_end: int    # all-reduces of the last overlapped step
    num_buckets: int


@dataclass(frozen=True)
class TraceMode:
    """ddp_scratch_trace, one mode: the trace's events and, summed over the steps, ms."""
    events: list[tuple[str, float, float]]   # (lane, start_ms, dur_ms)
    comm_ms: float                   # some all-reduce running
    hidden_ms: float                 # of that, during backward
    launches_in_backward: int
    step_ms: float                   # forward start to finish end
    steps: int


@dataclass(frozen=True)
class ScratchTrace(_Modes):
    """ddp_scratch_trace."""
    overlap: TraceMode
    after: TraceMode


@dataclass(frozen=True)
class EmulatedMode:
    """emulated_overlap, one mode: modelled seconds since backward started."""
    step: float                      # the step's end
    backward: float                  # backward's end
    comm: list[tuple[float, float]]  # each all-reduce's (start, end)
    modelled: float                  # the step with no delay (modelled_step)


@dataclass(frozen=True)
class EmulatedRun(_Modes):
    """emulated_overlap."""
    overlap: EmulatedMode
    after: EmulatedMode
    margin_s: float      # overlap's modelled saving times scale, in real seconds
    source: str          # where the rates came from
    scale: float
    model_batch: int


# ------------------------------------------------ speed_experiments.py, fast_experiments.py
@dataclass(frozen=True)
class WorkerTimes:
    """dp_timing_worker, one run at one worker count: rank 0's seconds per step, one sample per
    kept repeat (sample i of every run and count comes from the same repeat: they pair up)."""
    step_s: list[float]
    compute_s: list[float]       # forward + backward
    comm_s: list[float]          # the all-reduce: wait_s + after_s
    update_s: list[float]
    compute_cpu_s: list[float]   # this thread's CPU time during compute
    wait_s: list[float]          # in the all-reduce, until the last rank arrived
    after_s: list[float]         # from that arrival to the all-reduce's end
    params: list | None = None   # the trained parameters as lists (the run's return_params)


@dataclass(frozen=True)
class WorkerSweep:
    """dp_timing_worker (rank 0), what time_data_parallel returns: every run at every worker
    count, the counts and runs timed in turns in one set of processes."""
    times: dict[int, dict[str, WorkerTimes]]     # {workers: {run name: its times}}
    cores: list[int]             # the core each rank was pinned to
    threads: int                 # torch's threads in rank 0


@dataclass(frozen=True)
class RankSums:
    """allreduce_compare_worker (rank 0): every rank's inputs and torch's sums, on the CPU."""
    inputs: list[list[Tensor]]   # [rank][tensor]
    sums: list[Tensor]


@dataclass(frozen=True)
class EpochRun:
    """One trainer's epochs across processes (bench_worker, per wrapper; train_fast_rank)."""
    epoch_times: list[float]     # seconds, barrier to barrier: the slowest rank's
    test_acc: float
    param_sum: float             # sum of |params| in float64: equal on every rank
    peak_mem_mib: float | None = None    # on a GPU (bench_worker)
    compiled: bool | None = None         # train_fast_rank: whether torch.compile ran
    params: list | None = None           # train_fast_rank's return_params: lists


@dataclass(frozen=True)
class Collective:
    """One collective syncbn_traffic recorded: what this rank handed over, what it then held."""
    op: str                      # "all_gather" or "all_reduce"
    sent: Tensor
    got: Tensor                  # all_gather: the ranks' tensors stacked


@dataclass(frozen=True)
class SyncBnTraffic:
    """syncbn_traffic, one rank: one forward and backward of BatchNorm2d and of SyncBatchNorm."""
    count: int                   # values per channel in this rank's shard
    bn_calls: list[Collective]   # per-device BatchNorm's (none)
    sync_calls: list[Collective]
    shard_mean: Tensor           # the shard's own statistics, per channel
    shard_var: Tensor


@dataclass(frozen=True)
class SyncBnCost:
    """syncbn_cost_times, one rank: seconds of `steps` steps, one sample a round, per variant
    ("bn", "control", "syncbn": a map keyed by the variant)."""
    times: dict[str, list[float]]
    collectives: int             # the synchronised layers' collectives per step
    steps: int


@dataclass(frozen=True)
class DpVsDdp:
    """time_dp_vs_ddp (one process, not a launch target): seconds a step, one sample a round."""
    dp: Measurement              # nn.DataParallel
    ddp: Measurement             # DDP, one process per GPU
    ratio: Ratio                 # DataParallel's time / DDP's, round by round (above 1: DDP faster)
    batch: int
    steps: int
