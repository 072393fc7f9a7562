"""Timing done right: warm-up, repeats, the median and its spread, and ratios that say
"within noise" when the spread of the ratio crosses 1.

    m = measure(fn, repeats=5, warmup=1)     # fn() timed 5 times after 1 untimed call
    m.median, m.lo, m.hi, m.samples          # seconds; the spread lo-hi: min to max of the
                                             # samples (without the extreme tenths from 10 on)
    rounds = interleave({"a": f, "b": g}, rounds=5)   # ABAB...: each round times each once
    r = ratio(rounds["a"], rounds["b"])      # how many times as fast b is as a, per round
    r.median, r.lo, r.hi, r.verdict          # verdict: "faster", "slower" or "within noise"
                                             # ("cannot tell" from one round: no spread)

A machine's speed drifts (other programs, clock boosts, caches), so two things timed one after
the other are not timed under the same conditions. `interleave` times them in turns, round after
round, and `ratio` divides them round by round: a ratio's spread is then the spread of ratios
measured side by side, not of two separate runs. A ratio whose spread crosses 1.0 is reported as
"within noise": the run cannot tell the two apart. GPUs run asynchronously: pass `devices` and
the clock is read only after they have finished (devices.rank_clock).
"""
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .devices import rank_clock, synchronize
from .validate import validate_positive_int
from .words import plural

__all__ = ["Measurement", "Ratio", "measure", "interleave", "turn_order", "ratio",
           "machine_load", "MIN_ROUNDS", "verdict_of", "quartiles_word", "clock_tick",
           "cpu_clock"]

MIN_ROUNDS = 2   # a spread needs two samples at least: one round is a figure, not a verdict


@dataclass
class Measurement:
    """Repeated timings of one thing (seconds, or any unit): median, min and max, samples."""
    samples: list[float] = field(default_factory=list)
    unit: str = "s"

    def __post_init__(self) -> None:
        self.samples = [float(s) for s in self.samples]
        if not self.samples:
            raise ValueError("a Measurement needs at least one sample")

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def lo(self) -> float:
        return _trimmed(self.samples)[0]

    @property
    def hi(self) -> float:
        return _trimmed(self.samples)[-1]

    @property
    def spread(self) -> tuple[float, float]:
        """(lo, hi): min and max of the samples, leaving out the most extreme tenth at each end
        when there are 10 or more (a stray hiccup of a shared machine touches one sample)."""
        return self.lo, self.hi

    def __str__(self) -> str:
        scale, unit = (1e3, "ms") if self.unit == "s" and self.hi < 1 else (1, self.unit)
        return (f"{self.median * scale:.3g} {unit} ({self.lo * scale:.3g}-{self.hi * scale:.3g},"
                f" {plural(len(self.samples), 'sample')})")

    def to_dict(self) -> dict:
        return {"median": self.median, "spread": [self.lo, self.hi], "samples": self.samples}


@dataclass
class Ratio:
    """How many times as fast `new` is as `base` (base time / new time), one sample per round.

    verdict: "faster" when the whole spread (lo, hi: as Measurement's) is above 1, "slower" when
    it is below 1, else "within noise" (the run cannot tell them apart); "cannot tell" from
    fewer than MIN_ROUNDS samples (one round has no spread: its ratio is a figure, no verdict)."""
    samples: list[float]

    def __post_init__(self) -> None:
        self.samples = [float(s) for s in self.samples]
        if not self.samples:
            raise ValueError("a Ratio needs at least one sample")

    median = Measurement.median
    lo = Measurement.lo
    hi = Measurement.hi

    @property
    def verdict(self) -> str:
        return verdict_of(self.samples)

    @property
    def word(self) -> str:
        """The verdict as a comparison: 'faster than', 'slower than', 'within noise of' (or,
        from one round, 'not told apart (one round, no spread) from')."""
        return {"faster": "faster than", "slower": "slower than",
                "cannot tell": "not told apart (one round, no spread) from"}.get(
                    self.verdict, "within noise of")

    def spread_text(self) -> str:
        """'1.76x (1.67-1.98, 10 rounds)': the ratio and its spread, without the verdict."""
        return (f"{self.median:.2f}x ({self.lo:.2f}-{self.hi:.2f}, "
                f"{plural(len(self.samples), 'round')})")

    def __str__(self) -> str:
        return f"{self.spread_text()}: {self.verdict}"

    def to_dict(self) -> dict:
        return {"median": self.median, "spread": [self.lo, self.hi], "samples": self.samples,
                "verdict": self.verdict}


def verdict_of(samples: Sequence[float]) -> str:
    """The verdict of ratio samples (how many times as fast, one per round): "faster" when the
    whole spread is above 1, "slower" below 1, "within noise" across it, "cannot tell" from
    fewer than MIN_ROUNDS samples (a spread of one sample is that sample)."""
    if len(samples) < MIN_ROUNDS:
        return "cannot tell"
    lo, hi = _trimmed(samples)[0], _trimmed(samples)[-1]
    return "faster" if lo > 1 else "slower" if hi < 1 else "within noise"


def quartiles_word(a: Sequence[float], b: Sequence[float]) -> str:
    """Seconds of two runs that were not timed in turns (steps of two launches), compared by
    their interquartile ranges: 'faster than' when a's upper quartile lies below b's lower,
    'slower than' the other way round, else 'within noise of'. Each needs 2 samples at least."""
    if min(len(a), len(b)) < MIN_ROUNDS:
        raise ValueError(f"quartiles_word needs {MIN_ROUNDS} samples of each run, got "
                         f"{len(a)} and {len(b)}")
    (a_lo, _, a_hi), (b_lo, _, b_hi) = (statistics.quantiles(x, n=4)
                                        for x in (a, b))
    return "faster than" if a_hi < b_lo else "slower than" if b_hi < a_lo else "within noise of"


def _trimmed(samples):
    """The samples sorted, without the lowest and highest tenth when there are 10 or more."""
    s, cut = sorted(samples), len(samples) // 10
    return s[cut:len(s) - cut]


def _timed(fn, devices, clock):
    now = rank_clock(devices, clock=clock)
    t0 = now()
    fn()
    return now() - t0


def _validate_counts(repeats, warmup, what="repeats"):
    validate_positive_int(repeats, what, fix="5 or more for a claim")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")


def measure(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, devices=(),
            clock: Callable[[], float] | None = None) -> Measurement:
    """Time fn() `repeats` times after `warmup` untimed calls (first calls pay for caches,
    allocations, compilation); the devices are synchronised around each call."""
    _validate_counts(repeats, warmup)
    for _ in range(warmup):
        fn()
        synchronize(devices)
    return Measurement([_timed(fn, devices, clock) for _ in range(repeats)])


def turn_order(items: Iterable, r: int) -> list:
    """The order `items` take their turns in round r: as given in even rounds, reversed in odd
    ones (AB, BA, AB, ...), so that none always runs first or always after the same one."""
    return list(items) if r % 2 == 0 else list(items)[::-1]


def interleave(fns: Mapping[str, Callable[[], object]], rounds: int = 5, warmup: int = 1,
               devices=(), clock: Callable[[], float] | None = None
               ) -> dict[str, Measurement]:
    """Time every fn of the dict `fns` once per round, in turns (ABAB..., the order reversed
    every other round so that none always runs first), after `warmup` untimed rounds.
    Returns {name: Measurement}; sample i of every name comes from round i."""
    _validate_counts(rounds, warmup, "rounds")
    if not fns:
        raise ValueError("interleave needs at least one function to time")
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
        synchronize(devices)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for name in turn_order(names, r):
            samples[name].append(_timed(fns[name], devices, clock))
    return {name: Measurement(s) for name, s in samples.items()}


def ratio(base: Measurement | float, new: Measurement | float, paired: bool = True) -> Ratio:
    """How many times as fast `new` is as `base`: a Ratio of base time / new time.

    paired=True (Measurements from the same rounds of `interleave`): divided round by round.
    paired=False (timed apart): every sample of one divided by every sample of the other, so
    the spread is the widest the two allow (base.lo / new.hi to base.hi / new.lo)."""
    if isinstance(base, (int, float)):
        base = Measurement([base])
    if isinstance(new, (int, float)):
        new = Measurement([new])
    if paired and len(base.samples) == len(new.samples):
        return Ratio([b / n for b, n in zip(base.samples, new.samples, strict=True)])
    if paired and len(base.samples) > 1 and len(new.samples) > 1:
        raise ValueError(f"paired samples must come from the same rounds: {len(base.samples)} "
                         f"against {len(new.samples)}; use ratio(..., paired=False)")
    return Ratio([b / n for b in base.samples for n in new.samples])


def machine_load() -> float | None:
    """How busy this machine is: the 1-minute load average per core (about 0 when idle, 1 when
    every core is in use; above 1 processes wait for a core), or None where unknown."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return None


def clock_tick(clock: Callable[[], float] = time.thread_time, spin_s: float = 0.02) -> float:
    """The smallest nonzero step `clock` took while read over and over for `spin_s` seconds of
    wall time (inf where it never moved): the tick the clock really has, which the resolution
    it reports need not be (Windows reports 1e-7 s for a thread clock that moves far more
    coarsely)."""
    step, last = math.inf, clock()
    end = time.perf_counter() + spin_s
    while time.perf_counter() < end:
        now = clock()
        if now != last:
            step, last = min(step, now - last), now
    return step


def cpu_clock(fine: float = 1e-5, clock: Callable[[], float] = time.thread_time,
              wall: Callable[[], float] = time.perf_counter, spin_s: float = 0.02
              ) -> tuple[Callable[[], float], float, str]:
    """(clock, tick, name): this thread's CPU clock ('thread') where its observed tick is at most
    `fine` seconds, else the wall clock ('wall'), on which a short timing never reads 0."""
    tick = clock_tick(clock, spin_s)
    if tick <= fine:
        return clock, tick, "thread"
    return wall, clock_tick(wall, spin_s), "wall"
