"""Part I's words for the network split (the network_split chapter): how the bubble that
multiply-adds predict compares with the replayed run's, and why (from the stage shares the run
measured), and what timings of simulated devices can show."""

__all__ = ["mac_bubble_words", "simulated_timing_words"]


def mac_bubble_words(macs_bubble, replay_bubble, free_layers=(), margin=0.02):
    """(word, why): whether the bubble predicted from multiply-adds is "lower", "higher" or
    "about the same" as the replayed one (beyond `margin`), and the clause the text gives as
    the reason. `free_layers` names the smaller stage's layers that count no multiply-adds."""
    if macs_bubble < replay_bubble - margin:
        return "lower", ": its operations ran faster per multiply-add than the larger stage's"
    if macs_bubble > replay_bubble + margin:
        uncounted = (f"its {' and '.join(sorted(free_layers))} layers count none but take "
                     "time; " if free_layers else "")
        return "higher", (": multiply-adds do not count all of a stage's work "
                          f"({uncounted}this run does not time the layers apart)")
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
