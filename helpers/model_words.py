"""Part I's words for the cost model (the costs chapter): how the fullest device's memory moves as
devices are added, and when DDP's last bucket goes; and, against a measured run, where the
prediction falls in the measured spread, which part missed most, and what a measured all-reduce
inside a step is made of (the wait for the slower worker, measured; the rest, not)."""

import statistics

__all__ = ["spread_verdict", "largest_miss", "comm_inside_step_words", "fit_words", "load_words",
           "sweep_memory_words", "last_bucket_words"]


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


def _split_name(split):
    """'the network split', 'the within-layer split'; a ZeRO stage by its own name."""
    return split if split.startswith("ZeRO") else f"the {split.replace(' ', '-')} split"


def sweep_memory_words(ks, memory, floors=None, rtol=1e-6):
    """How the fullest device's memory moves as devices are added (`memory`: {split: bytes at
    each k of `ks`}): falling for every split, or not for those that stay flat (named, with where)
    or grow. `floors` {split: bytes}: the least a split can hold (a layer it cannot cut), said
    when a flat stretch sits on it."""
    grows, flat = [], {}
    for split, mem in memory.items():
        if len(mem) != len(ks):
            raise ValueError(f"{split}: {len(mem)} memories for {len(ks)} values of k")
        for i in range(1, len(ks)):
            if mem[i] > mem[i - 1] * (1 + rtol):
                grows.append((split, i))
                break
            if mem[i] >= mem[i - 1] * (1 - rtol) and split not in flat:
                end = i
                while end + 1 < len(ks) and abs(mem[end + 1] - mem[i - 1]) <= rtol * mem[i - 1]:
                    end += 1
                flat[split] = (i - 1, end)
    if grows:
        split, i = grows[0]
        mem = memory[split]
        return (f"not falling with k for every split: {_split_name(split)}'s fullest device grows "
                f"from {mem[i - 1] / 1e6:.1f} MB at k = {ks[i - 1]} to {mem[i] / 1e6:.1f} MB at "
                f"k = {ks[i]}")
    if not flat:
        return "falling with k for every split"
    stays = []
    for split, (a, b) in flat.items():
        value = memory[split][a]
        where = f"from k = {ks[a]} on" if b == len(ks) - 1 else f"from k = {ks[a]} to {ks[b]}"
        floor = (floors or {}).get(split)
        why = (" (a single top-level layer, the heaviest: a split across layers cannot cut it)"
               if floor is not None and abs(value - floor) <= rtol * floor else "")
        stays.append((split, f"{value / 1e6:.1f} MB {where}{why}"))
    if len(stays) == 1:
        split, said = stays[0]
        return (f"falling with k for every split but {_split_name(split)}, whose fullest device "
                f"stays at {said}")
    names = [_split_name(s) for s, _ in stays]
    return (f"falling with k for every split but {', '.join(names[:-1])} and {names[-1]}, whose "
            "fullest devices stop falling: " + "; ".join(f"{_split_name(s)} stays at {said}"
                                                          for s, said in stays))


def last_bucket_words(bucket, backward, seconds_per_unit):
    """When DDP's last bucket (a bucket of helpers.bucket_timeline: its gradients all ready at
    `complete`, its all-reduce from `start` to `end`) goes against the backward's end
    (`backward`), on that clock of `seconds_per_unit` seconds: at once, or behind the buckets
    queued before it."""
    complete, start, end = bucket["complete"], bucket["start"], bucket["end"]
    tol = 1e-9 * backward
    if complete < backward - tol:
        raise ValueError(f"the last bucket is complete at {complete:g}, before the backward "
                         f"ends at {backward:g}: it is not the last")
    took = f"the last one, {1e3 * (end - start) * seconds_per_unit:.2f} ms,"
    if start > complete + tol:
        return (f"{took} cannot start before the backward ends, and here starts "
                f"{1e3 * (start - backward) * seconds_per_unit:.2f} ms after it, behind the "
                "buckets queued before it")
    return f"{took} starts as soon as the backward ends"
