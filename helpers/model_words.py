"""Part I's words for the step-time model against a measured run (the costs chapter): where the
prediction falls in the measured spread, which part missed most, and what a measured all-reduce
inside a step is made of (the wait for the slower worker, measured; the rest, not)."""

import statistics

__all__ = ["spread_verdict", "largest_miss", "comm_inside_step_words", "fit_words", "load_words"]


def spread_verdict(predicted, measured):
    """Where `predicted` falls among the `measured` repeats: three branches."""
    lo, hi = min(measured), max(measured)
    if predicted < lo:
        return "shorter than every measured step"
    if predicted > hi:
        return "longer than every measured step"
    return "within the measured spread"


def largest_miss(measured, predicted):
    """The part ({name: seconds} in both) whose measurement is furthest from its prediction, in
    time."""
    return max(measured, key=lambda name: abs(measured[name] - predicted[name]))


def comm_inside_step_words(comm_s, alone_s, wait_s, shares):
    """What rank 0's all-reduce inside a step (median `comm_s`) is made of: about the lone
    all-reduce (`alone_s`) when at most twice it; otherwise the measured wait for the other
    worker (`wait_s`) and, per repeat, the share of it that the wait and the lone all-reduce
    account for (`shares`): named as the cause only when it covers 80 % or more in every
    repeat."""
    if comm_s <= 2 * alone_s:
        return "about as long as alone"
    shares = sorted(shares)
    if not shares:
        raise ValueError("comm_inside_step_words needs the share of at least one repeat")
    share = statistics.median(shares)
    words = (f"{comm_s / alone_s:.1f} times as long as alone. A collective ends only when "
             f"every worker has joined it, and each step rank 0 waited {1e3 * wait_s:.1f} ms "
             "(median) for the other worker to end its compute (their clock stamps, gathered "
             "after the steps): ")
    if shares[0] >= 0.8:
        return words + (f"that wait and the all-reduce alone account for {shares[0]:.0%} or "
                        "more of it in every repeat: the all-reduce waited for the slower "
                        "worker (why that worker was slower, this run does not measure)")
    if shares[-1] < 0.5:
        return words + (f"that wait and the all-reduce alone account for {shares[-1]:.0%} of it "
                        "at most, and this run does not say what took the rest")
    return words + (f"that wait and the all-reduce alone account for {share:.0%} of it (median; "
                    f"{shares[0]:.0%} to {shares[-1]:.0%} over the repeats), and this run does "
                    "not say what took the rest")


def fit_words(fitted_s, alone_s, tolerance=0.01):
    """Whether the alpha-beta fit goes through the measured lone all-reduce (within
    `tolerance`, relative), or how far it lands from it."""
    if abs(fitted_s - alone_s) <= tolerance * alone_s:
        return "the fit goes through it"
    return (f"the fit gives {1e3 * fitted_s:.2f} ms: with two noisy sizes it clamped a negative "
            "latency or bandwidth")


def load_words(load, cores):
    """The machine's load average for the text (all its `cores` together) from `load`, the
    load per core of helpers.machine_load(), or 'unknown' where the system gives none."""
    if load is None:
        return "unknown"
    return f"{load * cores:.1f}"
