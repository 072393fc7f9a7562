"""Checks for the exercises of Part IV's profile chapter (fixes: fixes.py, scaling: scaling.py).

A timer is judged on simulated GPUs that run asynchronously: fn() only queues work, and the work
is done when a synchronize of its device returns, so the check sees whether and when the answer
waited, and what the calls really took. Formulas get fresh inputs, numbers of any real type, and
tolerances from float rounding.
"""
import math
import os
import statistics

import torch

from ._async_gpus import AsyncGPUs
from ._core import (
    as_number,
    check,
    describe_device,
    expect,
    fresh_generator,
    number_words,
    randint,
    same_number,
    uniform,
)

__all__ = ["check_time_it", "check_time_shares", "check_predicted_speedup"]


# --- profile.ipynb ----------------------------------------------------------------------------
APART = 5      # how many times more work one trial's calls do than the other's (_levels)


def _levels(g, reps):
    """Each call's work, a multiple of the median call's, repeating every `reps` calls (5 to 7):
    a fast and a slow outlier, the others well below or far above the median (unevenly, so that
    the means of the middle calls, plain or geometric, the calls next to the median and, for odd
    reps, the median of reps - 1 calls are far from it too), and the median's in the middle of
    the period (twice for an even count), so that any `reps` calls in a row hold the same work
    and, after no or one warm-up call, neither the first nor the last timed call is the
    median's. Over both trials (APART times more work in one), every call of the other trial
    but its slowest (or its fastest) falls on one side of the median, so a median that mixes
    them in is far from it."""
    middle = 1 + (reps % 2 == 0)
    n = (reps - 3) // 2
    below = [uniform(g, 0.25, 0.3)] + [uniform(g, 0.4, 0.5) for _ in range(n)]
    above = [10.0] + [uniform(g, 3.5, 4.0) for _ in range(n)]
    others = below + above
    order = sorted(range(len(others)), key=lambda _: uniform(g, 0, 1))
    others = [others[i] for i in order]
    at = (reps - middle) // 2
    return others[:at] + [1.0] * middle + others[at:]


def _timed(sim, levels, scale, gpus):
    """The fn handed to time_it: a closure, so nothing it holds is reachable as an attribute
    (no __defaults__ leading to the simulation's records). Call i does levels[i % reps] times
    the median call's work, so the timed calls hold every level however many warm-up calls
    came first."""
    def fn():
        level = levels[len(sim.starts) % len(levels)]
        sim.call({d: scale * 0.006 * level if d == gpus[-1] else scale * 0.002 * min(level, 1)
                  for d in gpus})
    return fn


TRIES = 4   # trials of one draw at most, until the calls' real durations set the median apart


def _wrong_statistics(real):
    """{name: value} of what a wrong time_it returns, over the timed calls' real durations."""
    ordered, reps = sorted(real), len(real)
    lo, hi = (reps - 1) // 2, reps // 2
    return {"the mean": statistics.fmean(real), "the fastest call": min(real),
            "the first timed call": real[0], "the last timed call": real[-1],
            "the mean without the slowest call": statistics.fmean(ordered[:-1]),
            "the mean without the fastest and the slowest call": statistics.fmean(ordered[1:-1]),
            "the geometric mean": statistics.geometric_mean(real),
            "the call just below the median": ordered[lo - 1],
            "the call just above the median": ordered[hi + 1],
            "the median without the first timed call": statistics.median(real[1:]),
            "the median without the last timed call": statistics.median(real[:-1])}


def _told_apart(real, gpu):
    """Whether every wrong statistic of the real durations is over 15% from both medians the
    check accepts (the host's and the GPUs'), so that a 10% band tells them apart; for an even
    count a median of reps - 1 calls is a middle call, a median too (_levels), and left out."""
    med, reps = statistics.median(real), len(real)
    wrong = _wrong_statistics(real)
    if reps % 2 == 0:
        for name in ("the median without the first timed call",
                     "the median without the last timed call"):
            wrong.pop(name)
    return all(abs(v - m) > 0.15 * m for v in wrong.values() for m in (med, gpu))


def _ms(seconds):
    return f"{seconds * 1e3:.1f} ms"


def _tick():
    """The tick of os.times' elapsed time, in seconds (10 ms on Linux)."""
    try:
        return 1 / os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):   # no sysconf (Windows)
        return 0.01


@check("time_it", references=["Timer", "measure", "interleave"], observes=[
    "on 2 or 3 simulated GPUs that run asynchronously (fn() only queues work; "
    "torch.cuda.synchronize, which helpers.synchronize calls, waits for it, as does a "
    "device's stream's synchronize or the current device's, set with torch.cuda.device, and "
    "the synchronize of a torch.cuda.Event recorded after the work): which "
    "GPUs were synchronized before the first timed call (the last reps calls: untimed warm-up "
    "calls before them may be queued back to back) and after every timed call, before the "
    "next one; whether it read a CPU-time clock (time.process_time, time.thread_time: blind "
    "to a wait)",
    "the seconds returned against the median of what the calls really took, within 10%, timed "
    "by the check from the host or as CUDA events time the GPUs (the work differs "
    "from call to call, repeating every reps calls, with a fast and a slow outlier, so that the "
    "median is over 15% from the mean, the geometric mean, the total, the fastest call, the "
    "means without the slowest or without both outliers, the calls next to it, a median over "
    "both trials (5x apart) and, after no or one warm-up call, the first and the last timed "
    "calls and, in a trial of odd reps (one at least), the median of reps - 1 calls)"])
def check_time_it(time_it):
    """time_it(fn, devices, reps) -> median seconds of one call of fn, the devices synchronized
    before the clock starts and before it stops. Robust on a loaded machine: the check compares
    with the durations that really happened, not with the work it queued."""
    g = fresh_generator()
    # the workload's scale, drawn per run: the two trials differ APART times (in a random
    # order), so no constant can be within a factor 1.5 of both medians, nor a median over both
    base = uniform(g, 1.0, 1.5)
    scales = [base, APART * base] if randint(g, 0, 1) else [APART * base, base]
    odd = False
    for trial, scale in enumerate(scales):
        k, reps = randint(g, 2, 3), randint(g, 5, 7)
        if trial and not odd and reps % 2 == 0:
            # one trial's reps odd at least: for an even count the lower middle call and the
            # median of reps - 1 calls are medians too, for an odd one they are wrong
            reps = 5 + 2 * randint(g, 0, 1)
        odd = odd or reps % 2 == 1
        gpus = [torch.device("cuda", i) for i in range(k)]
        devices = list(gpus) + ([torch.device("cpu")] if randint(g, 0, 1) else [])
        levels = _levels(g, reps)
        call = f"time_it(fn, {[str(d) for d in devices]}, {reps})"
        earlier = [gpus[randint(g, 0, k - 1)]]
        for attempt in range(TRIES):
            sim = AsyncGPUs(gpus)
            fn = _timed(sim, levels, scale, gpus)
            with sim.active():
                sim.queue({earlier[0]: scale * 0.03})     # earlier work, still running
                t = as_number(time_it(fn, list(devices), reps), call)
            real = sim.durations(gpus)[-reps:]     # the timed calls (after any warm-up)
            gpu = statistics.median(sim.work[-reps:])
            # a busy machine's overruns can bring a wrong statistic of what the calls really
            # took near the median: that trial cannot tell them apart, and runs again
            if attempt == TRIES - 1 or _told_apart(real, gpu):
                break
        n = len(sim.starts)
        expect(n >= reps, f"{call} called fn {n} times, expected reps = {reps}")
        gaps = sim.unsynced(gpus, earlier, reps)
        after = {d for _, missing, before in gaps if not before for d in missing}
        for i, missing, before in gaps:
            names = " and ".join(map(describe_device, missing))
            aside = [describe_device(d) for d in missing if d in sim.aside]
            # a new stream's synchronize, or an event recorded on one, waits for that stream
            hint = (f" (your waits on {' and '.join(aside)} waited for a stream that fn's work "
                    "is not on: a stream made with torch.cuda.Stream, or an event recorded on "
                    "one, holds only what was queued there; fn queues on the current stream)"
                    if aside else "")
            what = (f" call {i + 1} while {names} still ran the work of the untimed calls "
                    "before it" if i else f" while {names} still ran earlier work")
            # a GPU left busy at the start and never waited for after a call either: both
            # halves of the fix at once, whichever GPU the earlier work was drawn on
            never = [d for d in missing if d in after]
            expect(not (before and never),
                   f"{call} started timing{what}, and never waited for "
                   f"{' and '.join(map(describe_device, never))} after a call: synchronise "
                   "every device in devices before starting the clock and after fn() "
                   f"(helpers.synchronize(devices)){hint}")
            expect(not before, f"{call} started timing{what}: "
                               "synchronise the devices before starting the clock "
                               f"(helpers.synchronize(devices)){hint}")
            expect(False, f"{call}: the work that fn queued on {names} in call {i + 1} was "
                          "never waited for before " + ("the next call" if i < n - 1 else
                                                  f"{call.split('(')[0]} returned") +
                          ": GPUs run asynchronously; synchronise every device in devices "
                          f"after fn() and before stopping the clock (helpers.synchronize){hint}"
                          + ("; with CUDA events too, the exercise asks for that synchronize "
                             "after every call, not one at the end" if sim.marks and i < n - 1
                             else ""))
        med, total = statistics.median(real), sum(real)
        expect(not math.isclose(t, 1e3 * med, rel_tol=0.5),
               f"{call} says {t:g}: that looks like milliseconds; return seconds")
        # here every timed call was waited for before the next (no gap above): a time far
        # below the calls' comes from a clock stopped before that wait, or blind to it
        short = f"{call} says {_ms(t)}, but every call took at least {_ms(min(real))} until " \
                "its work was done"
        cpu = sim.cpu_timer(reps)        # a CPU-time clock read last to stop every timed call
        blind = "the CPU time your process spent, not the time it waited for the GPUs"
        if cpu == "os.times":           # user and system: CPU time; elapsed: a coarse wall clock
            blind = (f"its user and system times count {blind}, and its elapsed time is a wall "
                     f"clock that ticks every {_ms(_tick())}, too coarse")
        expect(not cpu or t >= 0.5 * min(real),
               f"{short}, and you synchronised after every call: {cpu}"
               f"{': ' if cpu == 'os.times' else ' counts '}{blind}; time with a wall clock "
               "(time.perf_counter)")
        expect(t >= 0.5 * min(real),
               f"{short}: the clock stopped before the devices finished; synchronise before "
               "stopping the clock, not after, and use a wall clock (time.perf_counter); a "
               "CPU-time clock does not count the wait")
        expect(not math.isclose(t, total, rel_tol=0.2),
               f"{call} says {_ms(t)}, the total of all {n} calls ({_ms(total)}); return the "
               "median of per-call times")
        wrong = _wrong_statistics(real)
        # a statistic within 10% of the median (the first call after two warm-ups) is not
        # told apart on this draw: the median's answer must not fail for being near it
        wrong = {k: v for k, v in wrong.items() if k == "the mean" or abs(v - med) > 0.1 * med}
        # the statistics nearest the answer (two can coincide on a draw: name each)
        gap = min(abs(t - v) for v in wrong.values())
        what = "; ".join(f"{k} took {_ms(v)}" for k, v in wrong.items()
                         if abs(t - v) <= gap + 0.02 * t)
        # within 10% of the median of what the calls took, timed by the host (start to the
        # synchronize that found the work done) or by the GPUs (what CUDA events measure);
        # every wrong statistic is over 15% off (_levels; a trial that overran is run again)
        near = min(abs(t - med) / med, abs(t - gpu) / gpu) <= 0.1
        expect(near or cpu != "os.times", f"{call} says {_ms(t)}, but the calls took "
               f"{_ms(med)} (median): os.times' elapsed time ticks every {_ms(_tick())}, too "
               "coarse for these calls; time with time.perf_counter")
        expect(near, f"{call} says {_ms(t)}, but the calls took {_ms(med)} (median); {what}: "
               "return the median of per-call times, in seconds")


def _mapping(value, call):
    expect(isinstance(value, dict), f"{call} returned {type(value).__name__}, expected a dict")
    return value


@check("time_shares", observes=[
    "the dict returned for fresh phase times (a random subset of the phases): its keys, their "
    "order (largest first) and each share against seconds / total, to float rounding"])
def check_time_shares(time_shares):
    """time_shares(seconds: dict) -> dict name -> fraction of the total, largest first."""
    g = fresh_generator()
    names = ["data", "copy", "forward", "backward", "allreduce", "sgd"]
    for _ in range(3):
        picked = [n for n in names if randint(g, 0, 3)] or names[:2]
        secs = {n: uniform(g, 0.001, 0.2) for n in picked}
        total = math.fsum(secs.values())
        call = "time_shares({" + ", ".join(f"{n!r}: {v:.4g}" for n, v in secs.items()) + "})"
        out = _mapping(time_shares(dict(secs)), call)
        expect(set(out) == set(secs), f"{call} returned the keys {sorted(out)}, expected "
                                      f"{sorted(secs)}")
        for name, v in secs.items():
            got, dtype = as_number(out[name], f"{call}[{name!r}]", with_dtype=True)
            if same_number(got, v / total, dtype, len(secs) + 2, share=True):
                continue
            hint = ""
            if same_number(got, 100 * v / total, dtype, len(secs) + 3):
                hint = ": that is a percentage; return the fraction (between 0 and 1)"
            elif same_number(got, v, dtype, 1):
                hint = ": that is its time; divide by the total of all phases"
            got_s, want_s = number_words(got, v / total, dtype)
            expect(False, f"{call}: the share of {name!r} is {got_s}, expected {want_s}{hint}")
        expect(list(out) == sorted(secs, key=secs.get, reverse=True),
               f"{call}: the keys come in the order {list(out)}; order them largest share "
               "first")


@check("predicted_speedup", observes=[
    "the number returned for fresh (compute, all-reduce, k), k = 1 and an all-reduce longer "
    "than the step, against one worker's step over a k-worker step (compute/k plus the "
    "all-reduce), to float rounding"])
def check_predicted_speedup(predicted_speedup):
    """predicted_speedup(compute_s, comm_s, k) -> speed-up of k workers over one, when one
    worker's step is compute_s of compute, k workers split it evenly, and each of their steps
    adds comm_s of all-reduce (one worker has nothing to reduce)."""
    g = fresh_generator()
    cases = [(uniform(g, 1e-3, 0.1), uniform(g, 1e-4, 0.05), randint(g, 2, 16))
             for _ in range(6)]
    cases += [(uniform(g, 1e-3, 0.1), uniform(g, 1e-4, 0.05), 1)]
    compute = uniform(g, 1e-3, 5e-3)
    cases += [(compute, uniform(g, 2, 5) * compute, 2)]          # two workers lose
    for compute, comm, k in cases:
        call = f"predicted_speedup({compute:.4g}, {comm:.4g}, {k})"
        got, dtype = as_number(predicted_speedup(compute, comm, k), call, with_dtype=True)
        want = 1.0 if k == 1 else compute / (compute / k + comm)
        if same_number(got, want, dtype, 8):
            continue
        hint = " (one worker's step over a k-worker step)"
        if k == 1:
            hint = ": one worker does not communicate: its speed-up over itself is 1"
        elif same_number(got, k, dtype, 8):
            hint = (f": that is the ideal k; every worker also pays the all-reduce "
                    f"({comm * 1e3:.2f} ms a step)")
        elif same_number(got, compute / (compute + comm), dtype, 8):
            hint = (": that charges the all-reduce but never splits the compute; each worker "
                    "computes 1/k of the batch")
        got_s, want_s = number_words(got, want, dtype)
        expect(False, f"{call} returned {got_s}, expected {want_s}{hint}")
