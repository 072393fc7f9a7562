"""What Part VI's pipeline launch targets return: small frozen dataclasses whose fields the
chapter reads by name (`run.peak_live`, not `run["peak_live"]`: a misspelt field fails at once,
not as a KeyError after a launch). Defined at module level, so a rank's result pickles in its
process and unpickles in the notebook's. A timeline is one step's boxes as helpers.Clock
records them (dicts with phase, start, end, ...); gradients are keyed by stage index.
"""
from dataclasses import dataclass

from torch import Tensor

__all__ = ["PipelineRun", "PipeliningRun", "PingPong"]


@dataclass(frozen=True)
class PipelineRun:
    """pipeline_run, one rank: a hand-built schedule (GPipe, 1F1B, zero bubble)."""
    schedule: str
    m: int                               # micro-batches
    timelines: list[list[dict]]          # one per step: this rank's boxes
    loss: float | None                   # the first step's (the last rank's; else None)
    grads: dict[int, list[Tensor]]       # {stage: its gradients after the first step}
    peak_live: int                       # most micro-batches' activations held at once
    peak_bytes: int                      # their bytes
    bytes_sent: float                    # per step


@dataclass(frozen=True)
class PipeliningRun:
    """pipelining_run, one rank: one of torch.distributed.pipelining's schedules."""
    schedule: str                        # the class name
    m: int
    timelines: list[list[dict]]
    loss: float | None
    grads: dict[int, list[Tensor]]       # {stage: ...}: two stages per rank when looped
    peak_live: int                       # in the last step
    peak_bytes: int
    cuts: list[int]
    stages: list[int]                    # this rank's stage indices


@dataclass(frozen=True)
class PingPong:
    """pingpong_run: half of each round trip of a message (rank 0's; others' empty)."""
    seconds: list[float]
