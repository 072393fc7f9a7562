"""What the launch targets of data_parallel/experiments.py return (Part III's BatchNorm and Join
lessons, Part IV's profile and knobs): small frozen dataclasses whose fields the chapters read
by name (`run.acc`, not `run["acc"]`: a misspelt field fails at once, not as a KeyError after a
launch). Defined at module level, so a rank's result pickles in its process and unpickles in
the notebook's. Maps keyed by data (a BatchNorm variant, a knob's name) stay dicts.
"""
from dataclasses import dataclass

from torch import Tensor

__all__ = ["BnRun", "JoinRun", "DdpTrace", "KnobsRun"]


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
