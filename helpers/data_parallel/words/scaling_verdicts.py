"""The sentences the scaling chapter builds from its measurements, one function each with a
branch per verdict (tests/test_verdicts_scaling.py), as verdicts.py does for the fixes chapter.

A worker's all-reduce time in a step (comm_s) includes waiting for the other workers to arrive;
the words never credit the all-reduce with that wait: they give it apart (wait_s, after_s of
helpers.time_data_parallel), and name a cause only where the run measured it.
"""
from ...words import plural
from .verdicts import _check, ratio_words

__all__ = ["strong_words", "same_setup_words", "two_workers_sentence", "weak_split",
           "sweep_words", "sweep_summary", "model_saving_words"]


def _figure(r, what="round"):
    """'1.76x, 1.67-1.98 over 10 rounds': a ratio and its spread without its verdict, for a
    sentence that says the verdict once in its own words."""
    return f"{r.median:.2f}x, {r.lo:.2f}-{r.hi:.2f} over {plural(len(r.samples), what)}"


def _join(items):
    """'a', 'a and b', 'a, b and c'."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _others(k):
    return "the other worker" if k == 2 else f"the last of the {k} workers"


def _all(k):
    return "both" if k == 2 else "all"


def strong_words(r, compute1_ms, computek_ms, wait_ms, after_ms, k=2):
    """k workers against one at the same global batch (Ratio), with the measured split (medians,
    ms): each worker's compute for one worker and for k, and rank 0's all-reduce for k, split
    into waiting for the others to arrive and the time after all had arrived. The split is
    printed in every branch, labelled not resolved where the ratio is not."""
    _check(r)
    split = (f"each worker's compute went from {compute1_ms:.1f} to {computek_ms:.1f} ms a step; "
             f"in the all-reduce rank 0 waited {wait_ms:.1f} ms for {_others(k)} to arrive and "
             f"{after_ms:.1f} ms passed after {_all(k)} had arrived (medians)")
    if r.verdict == "faster":
        return f"faster than one ({_figure(r)}): {split}"
    if r.verdict == "slower":
        saved = compute1_ms - computek_ms
        if after_ms > saved:
            why = (f"the all-reduce after {_all(k)} had arrived alone took more than the "
                   f"{saved:.1f} ms of compute saved")
        elif after_ms + wait_ms > saved:
            why = (f"the all-reduce after {_all(k)} had arrived took less than the "
                   f"{saved:.1f} ms of compute saved, the wait for {_others(k)} more, and what "
                   "delayed it this run does not split")
        else:
            why = (f"the all-reduce, wait included, took less than the {saved:.1f} ms of compute "
                   "saved, so the split does not explain it")
        return f"slower than one ({_figure(r)}): {split}: {why}"
    if r.verdict == "cannot tell":
        return (f"not told apart from one ({_figure(r)}: no spread), so this run names no cause "
                f"(not resolved: {split})")
    return (f"within noise of one ({_figure(r)}): this run cannot tell them apart, so it names "
            f"no cause (not resolved: {split})")


def same_setup_words(r, reps):
    """One clause that sets this chapter's strong-scaling ratio (Ratio `r`, the fast step at
    batch 256, two workers against one over `reps` repeats) beside the profile chapter's run of
    a like set-up, which has its own ratio and verdict, so that the two chapters' results read
    as two runs that can differ. It types no figure of the other run."""
    _check(r)
    head = ("the profile chapter times a like set-up (the fast step, batch 256, one worker and "
            "two in turns) in a run of its own, in turns with other runs than here and under "
            "another moment's load")
    if r.verdict == "faster":
        return (f"{head}: its ratio and this one ({reps} repeats) can differ beyond their "
                "spreads, and this chapter, which does not read that run, cannot show whether "
                "they do")
    if r.verdict == "slower":
        return (f"{head}; where the two verdicts differ, two runs on a busy machine disagree, "
                "and neither says why")
    return (f"{head}: a gain this small against a busy machine's noise can be resolved in one "
            f"run of {reps} repeats and not in the next, so a verdict there and none here need "
            "not disagree")


def two_workers_sentence(batches, speed, after_share, wait_share, messages):
    """The reference step on two workers against one, at the smallest and the largest batch of
    the scaling chapter's sweep: `speed` their Ratios (one worker's time / two workers', round
    by round); `after_share` the share of a two-worker step its all-reduce took after both
    workers had arrived, `wait_share` rank 0's wait for the other worker (medians, 0 to 1);
    `messages` the step's all-reduces (one per parameter tensor). Empty inputs: two workers
    were not run (one core)."""
    if not batches:
        return "Two workers were not run: one core is too few for them."
    (small, large), (r_small, r_large) = batches, speed
    (a_small, a_large), (w_small, w_large) = after_share, wait_share
    half = (": more than twice as fast, so there the half batch each of two workers gets "
            "costs less per example than the whole one") if _check(r_large).lo > 2 else ""
    return (f"With the reference step, two workers were {ratio_words(_check(r_small))} as one "
            f"at batch {small}, and {ratio_words(r_large)} at batch {large}{half}. After both "
            f"workers had arrived, the all-reduce's {messages} messages took "
            f"{100 * a_small:.0f}% of a two-worker step at batch {small} and "
            f"{100 * a_large:.0f}% at batch {large}; rank 0's wait for the other worker took a "
            f"further {100 * w_small:.0f}% and {100 * w_large:.0f}% (medians).")


def weak_split(step, compute, step_ms, compute_ms, wait_ms, after_ms):
    """Weak scaling split into its parts: two workers at twice the global batch against one
    (Ratios of one worker's time / two workers', repeat by repeat: `step` for the whole step,
    `compute` for each worker's forward and backward), with the medians `step_ms` and
    `compute_ms` (one worker, two) and the two workers' all-reduce: rank 0's wait for the other
    worker (`wait_ms`) and the time after both had arrived (`after_ms`). Returns {"text": the
    chapter's sentence, "summary": its Summary's}; a cause is named only for a resolved step,
    from the measured split, and the wait is never counted as communication."""
    _check(step), _check(compute)
    (s1, s2), (c1, c2) = step_ms, compute_ms
    eff = (f"two workers' step ran at {step.median:.2f} of one worker's speed ({step.lo:.2f}-"
           f"{step.hi:.2f} over {plural(len(step.samples), 'repeat')} in turns; 1 is ideal)")
    how = {"slower": f"slower, resolved: {_figure(compute, 'repeat')}",
           "faster": f"faster, resolved: {_figure(compute, 'repeat')}",
           "cannot tell": "one repeat, no verdict"}.get(compute.verdict, "not resolved apart")
    split = (f"each worker's compute went from {c1:.1f} to {c2:.1f} ms a step ({how}); in the "
             f"all-reduce rank 0 waited {wait_ms:.1f} ms for the other worker to arrive and "
             f"{after_ms:.1f} ms passed after both had arrived (medians, which need not add up "
             "exactly)")
    wait = (f"the {wait_ms:.1f} ms of waiting is the other worker arriving later, which this run "
            "does not split into its compute and its time off its core")
    if step.verdict == "slower" and compute.verdict == "slower":
        return dict(
            text=(f"{eff}: slower than ideal. Of the {s2 - s1:.1f} ms a step it added, {split}: "
                  f"the loss is not communication alone, each worker's compute slowed too; "
                  f"{wait}"),
            summary=(f"here two workers' step was slower than one's, and the measured split puts "
                     f"the loss in the all-reduce after both workers had arrived ({after_ms:.1f} "
                     f"ms a step), in rank 0's wait for the other worker ({wait_ms:.1f} ms) and "
                     f"in each worker's compute, which slowed by {c2 - c1:.1f} ms (resolved): "
                     f"{after_ms + wait_ms + c2 - c1:.1f} of the {s2 - s1:.1f} ms lost, medians "
                     "that need not add up"))
    if step.verdict == "slower":
        share = (f"{min(1.0, after_ms / (s2 - s1)):.0%} of the loss" if s2 > s1 else
                 "while the medians show no loss")
        return dict(
            text=(f"{eff}: slower than ideal. Of the {s2 - s1:.1f} ms a step it added, {split}: "
                  f"the all-reduce after both had arrived is the communication this run can "
                  f"name ({share}); {wait}; each worker's compute was not resolved slower, so "
                  "it names no cause for the rest"),
            summary=(f"here two workers' step was slower than one's; after both workers had "
                     f"arrived the all-reduce took {after_ms:.1f} ms a step ({share}), rank 0 "
                     f"waited a further {wait_ms:.1f} ms for the other worker, and each "
                     "worker's compute was not resolved slower, so this run names no cause for "
                     "the rest, the wait included"))
    if step.verdict == "faster":
        return dict(
            text=(f"{eff}: faster than one worker's step, which weak scaling does not predict; "
                  f"{split}, and this run names no cause"),
            summary=("here two workers' step was even shorter than one's (resolved), which the "
                     "model does not predict, and this run names no cause"))
    return dict(text=f"{eff}: this run cannot tell two workers' step from one's, so it names no "
                     "cause",
                summary="here this run could not tell two workers' step from one's, so it names "
                        "no cause")


_FELL = {"faster": "it fell with the batch", "slower": "it grew with the batch",
         "within noise": "this run cannot tell whether it fell",
         "cannot tell": "one repeat, no verdict"}
_GREW = {"faster": "it fell further", "slower": "the epoch grew with the batch",
         "within noise": "this run cannot tell it from no change",
         "cannot tell": "one repeat, no verdict"}


def sweep_words(small, pivot, large, fall, grow=None):
    """An epoch's seconds against the batch size (the scaling chapter's sweep; every batch took
    its turn in every repeat): from the `small` batch to the `pivot` (Ratio `fall`: small's
    epoch / pivot's, repeat by repeat, so 'faster' means the epoch fell) and from the pivot to
    the `large` batch (Ratio `grow`, the same way round; None when the sweep ends at the
    pivot), each with its own verdict."""
    _check(fall)
    if not small < pivot <= large or (grow is None) != (pivot == large):
        raise ValueError(f"batches {small}, {pivot}, {large}: give small < pivot <= large, and a "
                         "ratio `grow` exactly when the sweep goes beyond the pivot")
    words = (f"from batch {small} to {pivot} an epoch ran {ratio_words(fall)}: "
             f"{_FELL[fall.verdict]}")
    if grow is None:
        return words
    _check(grow)
    return (f"{words}; from batch {pivot} to {large}, {ratio_words(grow)}: "
            f"{_GREW[grow.verdict]}")


def sweep_summary(small, pivot, fall, grow):
    """The Summary's sentence on the sweep: for which runs (`fall`: {name: Ratio small's epoch /
    pivot's}) the epoch fell from the small batch to the pivot, resolved, and for which
    (`grow`: {name: Ratio pivot's epoch / the largest batch's}) it grew beyond it; without a
    resolved fall the fall stays a prediction on this machine."""
    fell = [n for n, r in fall.items() if _check(r).verdict == "faster"]
    rose = [n for n, r in fall.items() if r.verdict == "slower"]
    grew = [n for n, r in grow.items() if _check(r).verdict == "slower"]
    if fell:
        words = (f"In this run the epoch fell from batch {small} to {pivot}, resolved, for "
                 f"{_join(fell)}")
        unsure = [n for n in fall if n not in fell + rose]
        if unsure:
            words += f"; for {_join(unsure)} this run could not tell"
    else:
        words = (f"In this run no epoch was resolved shorter at batch {pivot} than at batch "
                 f"{small}, so on this machine the fall stays a prediction")
    if rose:
        words += f"; for {_join(rose)} it grew instead"
    if grew:
        return (f"{words}. Beyond batch {pivot} it grew, resolved, at the largest batch for "
                f"{_join(grew)}.")
    return (f"{words}. Beyond batch {pivot} no epoch was resolved longer at the largest batch "
            "than at the pivot.")


def model_saving_words(model_ms, alpha_us, after_ms, r, reps, batch, messages=8):
    """The alpha-beta model's saving of one message a step against `messages` (`model_ms`, from
    its α `alpha_us`), checked against the all-reduces measured inside two workers' steps at
    global batch `batch`, after both had arrived (`after_ms`: the many messages' median and the
    one's, the waits left out; Ratio `r` of the many's time / the one's, repeat by repeat).
    `reps`: the isolated calls per size whose fastest the fit of α used. Three branches; where
    the saving is resolved, how much of the per-message cost inside a step the model's α
    misses (and, only where the run measured more than the model, that it does not say where
    the rest goes)."""
    _check(r)
    many, one = after_ms
    head = (f"Measured inside two workers' steps at batch {batch} (the batch sweep above, where "
            f"a step computes little), after both workers had arrived the reference "
            f"step's {messages} all-reduces took {many:.1f} ms a step and the fast step's one "
            f"{one:.1f} ms (medians, the waits for the other worker left out): one message was "
            f"{ratio_words(r)} as {messages}")
    saved = many - one
    if r.verdict == "faster" and saved > 0:
        per_us = 1e3 * saved / (messages - 1)
        if saved > 2 * model_ms:
            fit = "the model's α misses most of the per-message cost inside a step"
        elif saved < model_ms / 2:
            fit = "the model's α overprices the per-message cost inside a step"
        else:
            fit = "the model's α prices the per-message cost inside a step within a factor of two"
        return (f"{head}. The model prices the saving at {model_ms:.1f} ms a step; the run "
                f"measured {saved:.1f} ms, {saved / model_ms:.1f} times the model's: about "
                f"{per_us:,.0f} µs for each message saved, against an α of {alpha_us:.0f} µs "
                f"from the fastest of {reps} isolated calls on ranks doing nothing else: "
                f"{fit}."
                + (" This run does not say where the rest of it goes." if saved > model_ms
                   else ""))
    if r.verdict == "faster":
        return (f"{head}, yet the medians show no saving, so this run cannot check the model's "
                f"saving of {model_ms:.1f} ms a step.")
    if r.verdict == "slower":
        return (f"{head}: the reverse of the model's saving of {model_ms:.1f} ms a step, which "
                "this run does not confirm.")
    return (f"{head}: this run cannot tell the two apart, so it cannot check the model's saving "
            f"of {model_ms:.1f} ms a step.")
