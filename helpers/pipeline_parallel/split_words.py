"""Part I's words for the network split (the network_split chapter): how the bubble that
multiply-adds predict compares with the replayed run's, and why (from the stage shares the run
measured), how the measured bubble compares with the equal-stage formula, what timings of
simulated devices can show, and how the naive split's step compares with one device's."""

__all__ = ["mac_bubble_words", "stage_layers_words", "simulated_timing_words",
           "bubble_vs_formula_words", "devices_words", "naive_order_words"]


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


def _layers(names):
    kinds = sorted(set(names))
    return f"{' and '.join(kinds)} layer{'s' if len(names) > 1 else ''}"


def stage_layers_words(names, seconds, macs, most=2 / 3):
    """(group, words): where a stage's time went, its layers (`names`, their class names) timed
    one at a time (`seconds`), beside their multiply-adds (`macs`): "counted" when the layers
    that count multiply-adds took `most` of the time or more, "uncounted" when the layers that
    count none did, else "both" (the time is split between them)."""
    total = sum(seconds)
    if not total > 0 or not len(names) == len(seconds) == len(macs):
        raise ValueError("one time > 0 and one multiply-add count for every layer")
    counted = [(n, s) for n, s, w in zip(names, seconds, macs, strict=True) if w > 0]
    free = [(n, s) for n, s, w in zip(names, seconds, macs, strict=True) if w == 0]
    share = sum(s for _, s in counted) / total
    said = (f"its {_layers([n for n, _ in counted])} took {share:.0%} of the stage's time"
            if counted else "")
    if free:
        rest = f"its {_layers([n for n, _ in free])} {1 - share:.0%}"
        said = f"{said} and {rest}" if said else f"{rest} of the stage's time"
    said = f" Timed alone, one layer at a time, {said}"
    if not free or not counted:
        return ("counted" if counted else "uncounted"), said + "."
    if share >= most:
        doing = "the layer that does" if len(counted) == 1 else "the layers that do"
        return "counted", (said + f": most of the time went to {doing} the multiply-adds, not "
                           "to the layers that count none.")
    if share <= 1 - most:
        return "uncounted", (said + ": most of the time went to layers that count no "
                             "multiply-adds.")
    return "both", said + ": the time is split between the two kinds of layer."


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


def naive_order_words(one_times, naive_times):
    """The naive split's step against one device's, from the seconds of each run: faster or
    slower only where every run says so (the spreads do not overlap), else within noise. The
    naive split runs one stage at a time, so no branch credits devices working at once, and a
    cause is offered only as possible: the runs time the steps, not why they differ."""
    if not one_times or not naive_times:
        raise ValueError("pass the seconds of at least one run of each step")
    if max(naive_times) < min(one_times):
        return ("faster than one device in every run, although it does the same work and the "
                "copies between its stages besides. Its stages run one at a time, so that is not "
                "devices working at once; these runs do not measure what made it faster")
    if min(naive_times) > max(one_times):
        return ("slower than one device in every run; a possible cause, not measured here: the "
                "copies between its stages and the split's bookkeeping")
    return "within noise of one device: their spreads overlap, so this run cannot tell them apart"
