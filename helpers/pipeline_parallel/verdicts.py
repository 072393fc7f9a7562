"""Part VI's words for its pipeline runs (the pipeline_dist chapter): whether the real run's
bubble shrinks with the micro-batches, whether GPipe and 1F1B differ by more than the repeats
spread, what the delay before a box is made of, and which way the cut by time went on this
machine's clock. The branches live here, tested (tests/test_pipeline_verdicts.py); the
chapter's hidden cells only glue the words."""

__all__ = ["bubble_trend_words", "schedule_gap", "message_delay_words", "balance_words"]


def bubble_trend_words(first, last, margin=0.05):
    """The real run's bubble from the fewest micro-batches (first) to the most (last), both idle
    shares: "shrinks" when it fell by more than `margin`, else "does not shrink"."""
    return "shrinks" if last < first - margin else "does not shrink"


def schedule_gap(a, b):
    """Two schedules' bubbles in the real run, each one (median, lo, hi) over the repeats per
    micro-batch count: (the largest gap between their medians, words saying whether it is
    within the spread of the repeats, the widest lo-hi of either at any count)."""
    if not a or len(a) != len(b):
        raise ValueError(f"{len(a)} micro-batch counts against {len(b)}: pass one "
                         "(median, lo, hi) per count for both schedules, in the same order")
    gap = max(abs(x[0] - y[0]) for x, y in zip(a, b, strict=True))
    spread = max(max(x[2] - x[1], y[2] - y[1]) for x, y in zip(a, b, strict=True))
    words = "within the spread of the repeats" if gap <= spread else \
        "more than the spread of the repeats"
    return gap, words


def message_delay_words(message_s, messages, delay_s):
    """What the delay the ranks measured (delay_s: rank-seconds from a message's sending to the
    box that needed it, over a step) is made of, against the step's `messages` messages of
    `message_s` seconds each one way (a ping-pong's): mostly a process waiting for a core when
    they take under half of it, else much of it the messages themselves."""
    if message_s * messages < 0.5 * delay_s:
        return "most of the delay is the receiving process waiting for a core"
    return "much of the delay is the messages themselves"


def balance_words(verdict):
    """The cut by time against the cut by parameters on this machine's clock, from
    helpers.ratio's verdict of parameters / time ("faster", "slower" or "within noise")."""
    words = {"faster": "faster with the cut by time",
             "slower": "slower with the cut by time (the model gives each rank a device of its "
                       "own; here two processes share a busy CPU)",
             "within noise": "too close to tell apart: not resolvable on two CPU processes"}
    if verdict not in words:
        raise ValueError(f"verdict {verdict!r}: one of {list(words)} (helpers.ratio's)")
    return words[verdict]
