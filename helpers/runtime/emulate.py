"""Emulated durations for schedule lessons: the schedule apart from the machine (a busy
2-core CPU cannot time overlap, a modelled duration can show its shape).

A schedule lesson (a pipeline's bubble, DDP's overlap, FSDP's prefetch) measured on two busy
cores shows the cores, not the schedule: ranks wait for a core, not for each other. In emulated
mode every box's math still runs for real (its values are checked), then the rank waits until
the box has lasted its modelled duration, with a timed sleep that costs no CPU, so 2-8 ranks
on 2 cores keep the schedule's shape: the modelled waits, not the cores, set the time.

    rates = Rates.load()                       # the GPU reference run's, else assumed: .source
    clock = Clock(emulate=True, scale=clock_scale(modelled, measured))
    with clock.box("F", rates.compute(flops), micro=j):
        out = stage(h)                         # real math, then the rest of the modelled time
    clock.mark("sent", micro=j)                # a point in time (a message handed over)
    clock.boxes, clock.marks                   # dicts: name, start, end, compute, modelled, ...

`Clock()` (emulate=False) records the same boxes of the real run, so both modes are drawn and
compared by the same code. Wall seconds are kept; `scale` stretches every modelled duration
(a 5 us GPU box cannot be slept on a CPU), so a share of time (a bubble, an overlap) is in
model units what it is in wall units. A loaded machine still wakes a sleeping rank late, so
`model_time` also runs the recorded boxes on the model's clock alone: each rank's boxes in the
order they ran, each its modelled seconds, each after the box it needs (plus the message's
modelled time): the schedule's own timeline, the same on every machine. `waits(boxes)` splits
the idle time before each box into waiting for its input (the schedule) and the delay after the
input was sent (the machine).
"""
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ..devices import rank_clock, sleep_until

__all__ = ["Clock", "Rates", "ASSUMED_RATES", "clock_scale", "waits",
           "model_time"]

Box = dict[str, Any]   # a box's record: name, start, end, compute, modelled, and its info


class Clock:
    """One rank's boxes and marks. emulate=True: a box lasts at least scale * its modelled
    seconds (the real math first, then a sleep for the rest); compute and overrun say how long
    the math took and by how much it outlasted the modelled time (then the box is late).
    device: the rank's device, whose current stream every reading waits for (the rank clock,
    devices.rank_clock, with stream_only: a send in flight does not hold up the next box);
    `now` replaces the clock altogether (tests)."""

    def __init__(self, emulate: bool = False, scale: float = 1.0,
                 now: Callable[[], float] | None = None, sleep: bool = True,
                 device: torch.device | None = None) -> None:
        if not (isinstance(scale, (int, float)) and scale > 0):
            raise ValueError(f"Clock: scale must be a positive number, got {scale!r}")
        self.emulate, self.scale = bool(emulate), float(scale)
        self.now = now or rank_clock(device, stream_only=True)
        self.sleep = bool(sleep)          # False: record the modelled times only (tests)
        self.boxes: list[Box] = []
        self.marks: list[dict[str, Any]] = []

    @contextmanager
    def box(self, name: str, seconds: float | None = None, **info: Any) -> Iterator[Box]:
        """Time the body as one box `name`; in emulated mode wait out `seconds` (modelled, before
        scaling). `info` (micro-batch, stage, ...) is kept in the box's record."""
        if self.emulate and not (isinstance(seconds, (int, float)) and seconds >= 0):
            raise ValueError(f"Clock.box({name!r}): an emulated box needs its modelled seconds "
                             f"(>= 0), got {seconds!r}: pass box(name, seconds)")
        start = self.now()
        record = dict(info, name=name, start=start, modelled=seconds)
        yield record
        done = self.now()
        record["compute"] = done - start
        if self.emulate:
            target = start + seconds * self.scale
            record["overrun"] = max(0.0, done - target)
            if self.sleep:
                sleep_until(target, self.now)
        record["end"] = self.now()
        self.boxes.append(record)

    def mark(self, name: str, **info: Any) -> float:
        """A point in time (a message sent, a collective launched); returns its time."""
        t = self.now()
        self.marks.append(dict(info, name=name, time=t))
        return t

    def overruns(self) -> list[Box]:
        """The boxes whose real math outlasted their modelled time (emulation then stretches the
        schedule: choose a larger scale)."""
        return [b for b in self.boxes if b.get("overrun", 0.0) > 0.0]


def clock_scale(modelled: Iterable[float], measured: Iterable[float] = (), factor: float = 5.0,
                floor: float = 0.01) -> float:
    """A scale for Clock: every box lasts at least `floor` wall seconds, and at least `factor`
    times its real math (`measured[i]` seconds for `modelled[i]`), so that the math and a busy
    machine's delays stay small beside the waits the model sets."""
    modelled = [float(s) for s in modelled]
    if not modelled or min(modelled) <= 0:
        raise ValueError(f"clock_scale: modelled durations must be positive, got {modelled}")
    measured = [float(r) for r in measured] or [0.0] * len(modelled)   # none given: no floor
    if len(measured) != len(modelled):
        raise ValueError(f"clock_scale: {len(measured)} measured durations for "
                         f"{len(modelled)} modelled ones: give one per box, or none")
    scale = floor / min(modelled)
    for s, real in zip(modelled, measured, strict=True):
        scale = max(scale, factor * float(real) / s)
    return max(scale, 1.0)


@dataclass(frozen=True)
class Rates:
    """What a box's duration is modelled from: compute at `flops_per_s`, a message of n bytes
    in alpha + n / beta seconds. `source` says where the figures come from (print it)."""
    flops_per_s: float
    alpha: float
    beta: float
    source: str

    def compute(self, flops: float) -> float:
        """Seconds of `flops` floating-point operations."""
        return flops / self.flops_per_s

    def message(self, nbytes: float) -> float:
        """Seconds of one message of `nbytes` bytes (alpha-beta)."""
        return self.alpha + nbytes / self.beta

    @classmethod
    def load(cls, reference: dict[str, Any] | None = None) -> "Rates":
        """The committed GPU reference run's rates (its "rates" entry: flops_per_s, alpha, beta,
        measured by scripts/gpu_runner.sh), else ASSUMED_RATES. `reference`: a dict as
        helpers.gpu_reference() returns, read from the repository when None."""
        if reference is None:
            from ..reference import gpu_reference
            reference = gpu_reference()
        rates = reference.get("rates") if reference.get("exists") else None
        if not rates:
            return ASSUMED_RATES
        measured = rates.get("measured", ["flops_per_s", "alpha", "beta"])
        where = (f"on an {reference['gpu']} in the GPU reference run of {reference['date']}, "
                 f"torch {reference['torch']}")
        named = dict(flops_per_s="the compute rate", alpha="the latency", beta="the bandwidth")
        said = dict(flops_per_s=lambda v: f"{v / 1e12:.0f} TFLOP/s of compute",
                    alpha=lambda v: f"a message latency alpha = {v * 1e6:.0f} us",
                    beta=lambda v: f"a bandwidth of {v / 1e9:.0f} GB/s")
        assumed = [said[k](getattr(ASSUMED_RATES, k)) for k in said if k not in measured]
        source = f"measured {where}" if not assumed else (
            f"{' and '.join(named[k] for k in measured)} measured {where}; "
            f"{' and '.join(assumed)} assumed")
        return cls(*(float(rates.get(k, getattr(ASSUMED_RATES, k)))
                     for k in ("flops_per_s", "alpha", "beta")), source)


ASSUMED_RATES = Rates(
    flops_per_s=50e12, alpha=10e-6, beta=25e9,
    source="assumed (no GPU reference run records rates yet): 50 TFLOP/s of compute, messages "
           "of alpha = 10 us + bytes / (25 GB/s)")


def waits(boxes: Sequence[Box], step_start: float | None = None) -> dict[str, float]:
    """Where the idle time before each box went. `boxes`: one rank's boxes in the order they ran,
    a box that needed another rank's output carrying `ready` (when that output was sent). For
    each box: idle = start - previous end; input = the part spent before the input was sent
    (the schedule's wait); delay = the rest (the message in flight, then the rank waiting for a
    core: the machine's). Returns dict(idle, input, delay) in seconds, summed over the boxes."""
    total = dict(idle=0.0, input=0.0, delay=0.0)
    prev = step_start if step_start is not None else (boxes[0]["start"] if boxes else 0.0)
    for b in boxes:
        idle = max(0.0, b["start"] - prev)
        ready = b.get("ready")
        wait_input = min(idle, max(0.0, ready - prev)) if ready is not None else 0.0
        total["idle"] += idle
        total["input"] += wait_input
        total["delay"] += idle - wait_input
        prev = max(prev, b["end"])
    return total


def model_time(timelines: Sequence[Sequence[Box]], key: Callable[[Box], Hashable],
               needs: Callable[[Box], Hashable | None],
               message: Callable[[Box], float] | None = None,
               finish: Callable[[Box, float], float] | None = None) -> list[list[Box]]:
    """The recorded boxes on the model's clock: timelines[r] is rank r's boxes in the order they
    ran (each with its "modelled" seconds); key(box) names a box, needs(box) names the box it
    waits for (or None); message(box) is the modelled seconds of the message it waited for when
    that box ran on another rank; finish(box, start), if given, is when a box started at `start`
    ends (default start + its "modelled"). Each box starts when its rank is free and its input
    is there. Returns copies with start and end in model seconds. ValueError on a cycle."""
    where = {key(b): r for r, tl in enumerate(timelines) for b in tl}
    pos, free, end = [0] * len(timelines), [0.0] * len(timelines), {}
    out = [[] for _ in timelines]
    while any(pos[r] < len(tl) for r, tl in enumerate(timelines)):
        moved = False
        for r, tl in enumerate(timelines):
            while pos[r] < len(tl):
                b = tl[pos[r]]
                need = needs(b)
                if need is not None and need not in end:
                    if need not in where:
                        raise ValueError(f"box {key(b)} needs {need}, which never ran")
                    break
                ready = 0.0
                if need is not None:
                    ready = end[need] + (message(b) if message and where[need] != r else 0.0)
                start = max(free[r], ready)
                free[r] = end[key(b)] = (finish(b, start) if finish
                                         else start + b["modelled"])
                out[r].append(dict(b, start=start, end=free[r]))
                pos[r] += 1
                moved = True
        if not moved:
            stuck = next(tl[pos[r]] for r, tl in enumerate(timelines) if pos[r] < len(tl))
            raise ValueError(f"the recorded boxes wait for each other in a cycle: box "
                             f"{key(stuck)} waits forever for {needs(stuck)}")
    return out
