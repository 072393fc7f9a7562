"""helpers.timing: warm-up, repeats, medians with spreads, ratios round by round, "within noise"."""
import itertools
import math

import pytest
import torch

from helpers import timing


class FakeClock:
    """A clock that advances only when a timed function says how long it took."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def spend(self, seconds):
        self.now += seconds


def test_measure_warms_up_then_times_each_repeat():
    clock, calls = FakeClock(), []
    durations = iter([9.0, 1.0, 3.0, 2.0])   # the first call (warm-up) is slow and not kept

    def fn():
        calls.append(1)
        clock.spend(next(durations))
    m = timing.measure(fn, repeats=3, warmup=1, clock=clock)
    assert len(calls) == 4
    assert m.samples == [1.0, 3.0, 2.0]
    assert (m.median, m.lo, m.hi) == (2.0, 1.0, 3.0)
    assert m.to_dict() == {"median": 2.0, "spread": [1.0, 3.0], "samples": [1.0, 3.0, 2.0]}


def test_measure_reads_the_rank_clock_of_the_devices(monkeypatch):
    """Each reading of the clock comes after a wait for the devices (devices.rank_clock), on
    the clock measure is given."""
    clock, seen = FakeClock(), []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: seen.append(("sync", str(d))))

    def fn():
        seen.append("fn")
        clock.spend(1.0)
    m = timing.measure(fn, repeats=2, warmup=0, devices=["cuda:0"], clock=clock)
    assert seen == [("sync", "cuda:0"), "fn", ("sync", "cuda:0")] * 2, seen
    assert m.samples == [1.0, 1.0]


@pytest.mark.parametrize("bad,error", [(0, ValueError), (-1, ValueError), (2.5, TypeError),
                                       (True, TypeError), (None, TypeError)])
def test_bad_counts_are_refused(bad, error):
    with pytest.raises(error, match="repeats.*5 or more for a claim"):
        timing.measure(lambda: None, repeats=bad)
    with pytest.raises(error, match="rounds"):
        timing.interleave({"a": lambda: None}, rounds=bad)


def test_interleave_takes_turns_and_reverses_every_other_round():
    clock, order = FakeClock(), []

    def make(name, seconds):
        def fn():
            order.append(name)
            clock.spend(seconds)
        return fn
    got = timing.interleave({"a": make("a", 2.0), "b": make("b", 1.0)}, rounds=3, warmup=1,
                            clock=clock)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"], order   # warm-up, then ABBAAB
    assert got["a"].samples == [2.0] * 3 and got["b"].samples == [1.0] * 3


def test_turn_order_reverses_every_other_round():
    """The one order of turns (interleave's and the experiments' timed loops): as given in
    even rounds, reversed in odd ones; any iterable (a dict gives its keys), as a new list."""
    names = ("a", "b", "c")
    assert [timing.turn_order(names, r) for r in range(4)] == [
        ["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"], ["c", "b", "a"]]
    assert timing.turn_order({"x": 1, "y": 2}, 1) == ["y", "x"]
    items = ["a", "b"]
    timing.turn_order(items, 1).append("c")
    assert items == ["a", "b"]


def test_ratio_divides_round_by_round():
    base = timing.Measurement([2.0, 4.0, 3.0])
    new = timing.Measurement([1.0, 2.0, 1.0])
    r = timing.ratio(base, new)
    assert r.samples == [2.0, 2.0, 3.0]
    assert (r.median, r.lo, r.hi, r.verdict) == (2.0, 2.0, 3.0, "faster")
    assert "faster" in str(r) and r.word == "faster than"


def test_a_ratio_whose_spread_crosses_one_is_within_noise():
    r = timing.ratio(timing.Measurement([1.0, 1.0, 1.0]), timing.Measurement([0.9, 1.1, 1.0]))
    assert r.lo < 1 < r.hi and r.verdict == "within noise" and "within noise" in str(r)
    slower = timing.ratio(timing.Measurement([1.0, 1.0]), timing.Measurement([2.0, 3.0]))
    assert slower.verdict == "slower" and slower.word == "slower than"


def test_one_round_is_a_figure_not_a_verdict():
    """bench.py --rounds 1 (the first GPU run) called 16.46x "faster" and 0.71x "slower" from one
    sample each: the spread of one sample is that sample. One round cannot tell."""
    for x in (16.46, 0.71, 1.0):
        r = timing.Ratio([x])
        assert r.verdict == "cannot tell" and "one round" in r.word, (x, r.verdict)
        assert r.to_dict()["verdict"] == "cannot tell" and "cannot tell" in str(r)
    assert timing.ratio(2.0, 1.0).verdict == "cannot tell", "two single figures: one round"
    assert timing.verdict_of([16.46, 15.0]) == "faster", "two rounds: a spread, a verdict"
    assert timing.verdict_of([0.7, 0.72]) == "slower"
    assert timing.verdict_of([0.9, 1.1]) == "within noise"


def test_the_spread_leaves_out_stray_hiccups_of_many_samples():
    few = timing.Measurement([1.0, 1.1, 9.0])                # fewer than 10: min to max
    assert (few.lo, few.hi) == (1.0, 9.0)
    many = timing.Measurement([1.0 + i / 100 for i in range(18)] + [0.1, 50.0])
    assert (many.lo, many.hi) == (1.01, 1.16), "the extreme tenth at each end is left out"
    assert timing.Ratio([1.2] * 9 + [0.5]).verdict == "faster", "one hiccup in ten rounds"
    assert timing.Ratio([1.2] * 8 + [0.5, 0.6]).verdict == "within noise"


def test_unpaired_comparison_takes_every_pair():
    base, new = timing.Measurement([2.0, 4.0]), timing.Measurement([1.0, 2.0, 4.0])
    r = timing.ratio(base, new, paired=False)
    assert sorted(r.samples) == sorted(b / n for b, n in itertools.product([2, 4], [1, 2, 4]))
    assert (r.lo, r.hi) == (0.5, 4.0)
    with pytest.raises(ValueError, match="same rounds"):
        timing.ratio(base, new)   # paired samples from different runs: refused, not guessed


def test_measure_really_times_work():
    """On a real clock, more work takes longer: the machinery measures, it does not make up."""
    x = torch.randn(256, 256)
    threads = torch.get_num_threads()
    # One thread: with several busy test workers, a pool's threads wait a scheduler slice
    # (tens of ms) at each barrier, which swamps one small matmul (CI measured 24 ms for it).
    torch.set_num_threads(1)
    try:
        small = timing.measure(lambda: x @ x, repeats=5)
        big = timing.measure(lambda: [x @ x for _ in range(50)], repeats=5)
    finally:
        torch.set_num_threads(threads)
    assert timing.ratio(big, small).median > 5   # medians: one preempted sample cannot flip it
    assert all(s > 0 for s in small.samples)


def test_machine_load_is_a_number_or_none():
    load = timing.machine_load()
    assert load is None or load >= 0


def test_quartiles_word_three_branches():
    from helpers.timing import quartiles_word
    fast, slow = [0.20, 0.21, 0.22, 0.23, 0.24], [0.40, 0.41, 0.42, 0.43, 0.44]
    assert quartiles_word(fast, slow) == "faster than"
    assert quartiles_word(slow, fast) == "slower than"
    # the composed chapter's stored run: medians 2x apart, quartiles overlapping
    assert quartiles_word([0.15, 0.16, 0.22, 0.37, 0.40], [0.33, 0.34, 0.43, 0.61, 0.7]) == \
        "within noise of"
    with pytest.raises(ValueError, match="2 samples of each run"):
        quartiles_word([0.1], fast)


class _TickingClock:
    """A fake clock that moves by `tick` seconds every `every` readings (a coarse clock ticks
    at the scheduler, whatever resolution it reports)."""

    def __init__(self, tick, every=1):
        self.tick, self.every, self.reads = tick, every, 0

    def __call__(self):
        self.reads += 1
        return self.reads // self.every * self.tick


def test_clock_tick_is_the_smallest_step_seen():
    assert timing.clock_tick(_TickingClock(0.0156, every=50), spin_s=0.01) == (
        pytest.approx(0.0156))
    assert timing.clock_tick(lambda: 1.0, spin_s=0.005) == math.inf   # never moved


def test_cpu_clock_takes_the_wall_clock_where_the_thread_clock_is_coarse():
    wall = _TickingClock(1e-7)
    coarse = _TickingClock(0.0156, every=50)       # Windows' GetThreadTimes, in effect
    clock, tick, name = timing.cpu_clock(clock=coarse, wall=wall, spin_s=0.01)
    assert clock is wall and name == "wall" and tick == pytest.approx(1e-7)
    fine = _TickingClock(3e-7)
    clock, tick, name = timing.cpu_clock(clock=fine, wall=wall, spin_s=0.01)
    assert clock is fine and name == "thread" and tick == pytest.approx(3e-7)
    clock, _, name = timing.cpu_clock(clock=lambda: 0.0, wall=wall, spin_s=0.005)
    assert clock is wall and name == "wall"                # a clock that never moves
    clock, tick, name = timing.cpu_clock()                # this machine's
    assert name in ("thread", "wall") and 0 < tick < 1e-3
