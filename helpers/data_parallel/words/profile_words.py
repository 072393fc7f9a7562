"""The profile chapter's remaining sentences chosen by its numbers: the GPU run's status, the
step timed against itself, and the lead-in of a compute split, one function each with a branch
per case (tests/test_verdicts_profile_words.py), so that no hidden notebook cell decides what a
sentence says.
"""
from .verdicts import _check, _spread

__all__ = ["profile_gpu_status", "self_check_words", "split_lead_in", "halves_control_words",
           "fixed_part_words", "gpu_arithmetic_words"]

FIT_BAND = 0.2     # two fits' intercepts closer than this share of the larger are not told apart


def profile_gpu_status(gpu_run):
    """What the chapter says of two GPUs against one: a prediction where no GPU run is recorded
    (`gpu_run` None, else helpers.gpu_figures), not measured by a run of fewer than two GPUs,
    else measured, its figures below."""
    if gpu_run is None:
        return ("No GPU run of this course has been recorded yet "
                "(reference/gpu_reference.json says so), so this is a prediction.")
    if (gpu_run["gpu_count"] or 1) < 2:
        sentence = gpu_run["sentence"]
        return (f"{sentence[0].upper()}{sentence[1:]} does not "
                f"measure it: {gpu_run['scope']}. Its figures are below.")
    return (f"Figures measured on GPUs: see {gpu_run['sentence']} below "
            f"({gpu_run['scope']}).")


def self_check_words(r):
    """The same step timed against itself in turns (Ratio `r`): dict(spread, text). Within
    noise is as it should be; a resolved verdict warns that noise alone resolved it; one round
    gives no verdict. `spread` prints an end that would read 1.00 to three decimals."""
    _check(r)
    if r.verdict == "within noise":
        text = "as it should be: the step is the same"
    elif r.verdict == "cannot tell":
        text = ("from one round, which has no spread: this run cannot check its noise "
                "this way")
    else:
        text = ("although the step is the same: a busy machine can resolve a ratio this close "
                "to 1 from noise alone, so the verdicts below are read together with how far "
                "from 1 they are")
    return dict(spread=_spread(r), text=text)


def split_lead_in(split, prediction):
    """A compute split (compute_split_words) as its own sentence: introduced by 'Where the time
    went: ' unless the prediction's words before it already point to where the time went."""
    if "where the time went" in prediction:
        return split[0].upper() + split[1:]
    return "Where the time went: " + split


def halves_control_words(two, halves):
    """The control of the phase breakdown (Ratio: one device's time / one device running the
    two halves of each batch in turn), as sentences after a space, ending in a full stop; ""
    where two devices were resolved faster (simulated_devices_words names the control there)."""
    _check(two), _check(halves)
    if two.verdict == "faster":
        return ""
    said = (" The control, one device running the two halves of each batch in turn, was "
            f"{halves.spread_text()} against one device on whole batches: ")
    if halves.verdict == "faster":
        return said + ("faster. The same arithmetic in smaller pieces was cheaper per example on "
                       "this CPU, so splitting a batch changes its compute's time by itself.")
    if halves.verdict == "slower":
        return said + ("slower. The same arithmetic in smaller pieces cost more per example on "
                       "this CPU, so splitting a batch changes its compute's time by itself.")
    if halves.verdict == "within noise":
        return said + ("within noise: this run cannot tell smaller pieces of the batch from "
                       "whole ones.")
    return said + "one round, no spread: this run cannot tell smaller pieces from whole ones."


def fixed_part_words(fixed1_s, fixed2_s):
    """What two fits' intercepts (seconds at batch 0, one device and two) show of a second
    device's own fixed part: larger on two, smaller, or within FIT_BAND of each other (cannot
    tell); a negative intercept, printed as 0, is said to be negative."""
    neg = [f"{k} ({f * 1e3:.2f} ms)" for k, f in (("one device's", fixed1_s),
                                                   ("two devices'", fixed2_s)) if f < 0]
    note = ("" if not neg else "; " + " and ".join(neg) + " fit crosses zero examples below "
            "zero, printed above as 0.00 ms: a negative intercept is no fixed part the fit can "
            "show")
    diff_ms = (fixed2_s - fixed1_s) * 1e3
    fits = "two fits to four medians each, with no spread of their own"
    if abs(fixed2_s - fixed1_s) <= FIT_BAND * max(abs(fixed1_s), abs(fixed2_s)):
        return (f"the two intercepts are within {FIT_BAND:.0%} of each other ({diff_ms:+.2f} ms, "
                f"{fits}): these fits cannot tell whether a second device adds a fixed part"
                + note)
    if fixed2_s > fixed1_s:
        return (f"the intercept on two devices is the larger, by {diff_ms:.2f} ms, as a second "
                f"device's own fixed part would make it ({fits}, so only loosely)" + note)
    return (f"the intercept on two devices is the smaller, by {-diff_ms:.2f} ms ({fits}): "
            "these fits do not show a second device adding a fixed part" + note)


def gpu_arithmetic_words(step_flops, flops_per_s, source):
    """How long a GPU takes for a step's arithmetic, predicted from its FLOPs and a GPU's
    float32 product rate (`source` says whose): well under a millisecond (below 0.5 ms),
    about one (below 2 ms), or more, each labelled a prediction."""
    ms = step_flops / flops_per_s * 1e3
    basis = (f"a prediction: {step_flops / 1e9:.2f} GFLOP at {flops_per_s / 1e12:.0f} TFLOP/s, "
             f"a float32 product's rate ({source}), take {ms:.2f} ms")
    if ms < 0.5:
        return f"a GPU does the arithmetic of a step in well under a millisecond ({basis})"
    if ms < 2:
        return f"a GPU does the arithmetic of a step in about a millisecond ({basis})"
    return (f"a GPU does the arithmetic of a step in {ms:.1f} ms ({basis}), which is not small "
            "beside the rest")
