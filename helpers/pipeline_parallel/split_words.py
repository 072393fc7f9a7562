"""Part I's words for the network split (the network_split chapter): how the bubble that
multiply-adds predict compares with the replayed run's, and why (from the stage shares the run
measured), how the measured bubble compares with the equal-stage formula, and what timings of
simulated devices can show."""

__all__ = ["mac_bubble_words", "simulated_timing_words", "bubble_vs_formula_words",
           "devices_words"]


def mac_bubble_words(macs_bubble, replay_bubble, margin=0.02):
    """(word, why): whether the bubble predicted from multiply-adds is "lower", "higher" or
    "about the same" as the replayed one (beyond `margin`), and the clause the text gives after
    the smaller stage's shares of the multiply-adds and of the busy time: only what those two
    shares say (the run times stages, not layers, so it names no layer as the cause)."""
    if macs_bubble < replay_bubble - margin:
        return "lower", ": its operations ran faster per multiply-add than the larger stage's"
    if macs_bubble > replay_bubble + margin:
        return "higher", ": its operations ran slower per multiply-add than the larger stage's"
    return "about the same", ", about its share of the work"


def simulated_timing_words(simulated):
    """What the chapter's step timings can show: simulated devices take turns on one
    processor; real ones are driven by one Python thread."""
    if simulated:
        return ("They show that the schedules run, not how fast they would run on separate "
                "devices: the simulated devices take turns on one processor, so nothing "
                "overlaps.")
    return ("These are real devices, but one Python thread issues the work of all of them, so "
            "they overlap only as far as asynchronous launches allow.")


def bubble_vs_formula_words(lo, hi, formula):
    """The measured bubble (over the runs, from `lo` to `hi`) against the formula's for equal
    stages: 'larger', 'smaller' or 'not clearly larger or smaller' (the text goes on 'than')."""
    if lo > formula:
        return "larger"
    if hi < formula:
        return "smaller"
    return "not clearly larger or smaller"


def devices_words(simulated):
    """What the chapter's devices were, for the sentence that gives their step times."""
    return "simulated on one processor" if simulated else "real, separate devices"
