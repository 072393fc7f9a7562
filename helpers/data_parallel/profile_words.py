"""The profile chapter's remaining sentences chosen by its numbers: the GPU run's status, the
step timed against itself, and the lead-in of a compute split, one function each with a branch
per case (tests/test_verdicts_profile_words.py), so that no hidden notebook cell decides what a
sentence says.
"""
from .verdicts import _check, _spread

__all__ = ["profile_gpu_status", "self_check_words", "split_lead_in"]


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
