"""The sentences Part IV's chapters build from their measurements, one function each, so that
every branch is tested (tests/test_verdicts.py) instead of living in a notebook's hidden cell.

Each takes helpers.Ratio objects (helpers.timing: a verdict of "faster", "slower", "within
noise" or, from one round, "cannot tell") and numbers, and returns the words the chapter glues.
A sentence names a cause only for a resolved ratio, and only from a measured split. The scaling
chapter's sentences are in scaling_verdicts.py, the profile and ddp_scratch chapters' in
profile_verdicts.py.
"""
import statistics

from ...timing import Ratio

__all__ = ["ratio_words", "against_prediction", "compile_sentence", "graph_sentence",
           "knob_words", "bucket_words", "message_cause", "overlap_step_words",
           "shared_rounding_words", "arithmetic_share_words"]


def _check(r):
    if not isinstance(r, Ratio):
        raise TypeError(f"expected a helpers.Ratio (helpers.ratio(base, new)), got {r!r}")
    return r


def _places(x, against):
    """The fewest decimals, 2 or more, that print x and `against` apart (2 where they are equal
    to 6 decimals): a spread's end that rounds to the figure it is compared with must not read
    as equal to it."""
    return next((d for d in range(2, 7) if f"{x:.{d}f}" != f"{against:.{d}f}"), 2)


def _digits(x, against):
    """x to 2 decimals, or to as many more as it takes not to print it as `against`."""
    return f"{x:.{_places(x, against)}f}"


def _spread(r):
    """'0.81-0.998': a Ratio's spread, an end that would print as 1.00 (where the verdict
    turns) to three decimals."""
    return f"{_digits(r.lo, 1.0)}-{_digits(r.hi, 1.0)}"


def ratio_words(r):
    """'1.23 times as fast (1.05-1.40: faster)': a ratio with its spread and verdict."""
    _check(r)
    return f"{r.median:.2f} times as fast ({r.lo:.2f}-{r.hi:.2f}: {r.verdict})"


def against_prediction(r, predicted):
    """The verdict of `r` and whether it is one of the `predicted` verdicts: 'faster, as
    predicted', 'slower: not what we predicted', 'within noise: this run cannot tell them apart,
    as predicted' ... ('one round: no verdict' from a single round)."""
    _check(r)
    unknown = set(predicted) - {"faster", "slower", "within noise"}
    if unknown or not predicted:
        raise ValueError(f"predicted verdicts {sorted(predicted)}: choose among 'faster', "
                         "'slower' and 'within noise'")
    if r.verdict == "cannot tell":
        return "one round: no verdict"
    what = ("within noise: this run cannot tell them apart" if r.verdict == "within noise"
            else r.verdict)
    return f"{what}, as predicted" if r.verdict in predicted else \
        f"{what}: not what we predicted"


def compile_sentence(r, first_step_s, saved_s, epoch_steps, short_last=False):
    """The compiled step against the fused step (Ratio `r`), and when its first step's compile
    pays back: `saved_s` seconds a step (the medians' difference) over `epoch_steps` steps an
    epoch; a payback only where the ratio says faster. `short_last`: the epoch ends with a
    shorter batch, a new shape that compiles once more (the payback counts one compile)."""
    _check(r)
    if r.verdict == "faster" and saved_s > 0:
        steps = first_step_s / saved_s
        again = "; the epoch's short last batch compiles once more" if short_last else ""
        pays = (f"; it pays back its first step's {first_step_s:.1f} s after {steps:,.0f} steps "
                f"({steps / epoch_steps:.1f} epochs of Fashion-MNIST: one compile{again})")
    elif r.verdict == "slower":
        pays = ", so here it never pays back its compile"
    else:
        pays = (f"; this run cannot tell whether it ever pays back its first step's "
                f"{first_step_s:.1f} s")
    return (f"The compiled step (`lenet_fused`, compiled: both, as the ablation above separates "
            f"them) was {r.median:.2f} times as fast as the fused step ({r.lo:.2f}-{r.hi:.2f}: "
            f"{r.verdict}){pays}.")


def graph_sentence(r=None):
    """The CUDA graph against the fused step (a Ratio), or None where no GPU ran it."""
    if r is None:
        return "There was no CUDA graph to measure here (it needs a GPU)."
    _check(r)
    return (f"The CUDA graph made a step {r.median:.1f} times as fast as the fused step "
            f"({r.lo:.2f}-{r.hi:.2f}: {r.verdict}).")


def knob_words(exposed, exposed_ms, step):
    """One DDP knob against the default: its exposed all-reduce (Ratio, default's / knob's),
    its median exposed milliseconds, and its whole step (Ratio, default's / knob's). Each
    comparison names its baseline, the default (the bucket comparison in bucket_words has
    another)."""
    _check(exposed), _check(step)
    less = {"faster": "less exposed all-reduce than the default",
            "slower": "more exposed all-reduce than the default"}.get(
        exposed.verdict, "exposed all-reduce the run cannot tell from the default's")
    return (f"{less} ({exposed_ms:.1f} ms a step; the default's was {_spread(exposed)} times it "
            f"per round; the step {step.median:.2f} times as fast as the default's, "
            f"{_spread(step)}, {step.verdict})")


def bucket_words(one_vs_small, step):
    """One bucket against small buckets, on the exposed all-reduce (Ratio: one bucket's /
    small buckets', so 'faster' means small buckets left less exposed), then on the whole step
    (Ratio `step`, the same way round): each with its own verdict, its baseline named (one
    bucket, not the default that knob_words compares with), spread ends that would print as
    1.00 to three decimals, and no cause this run did not measure."""
    r, st = _check(one_vs_small), _check(step)
    exposed = (f"one bucket left {r.median:.2f} times the exposed all-reduce of 1 MiB buckets "
               f"({_spread(r)}: ")
    if r.verdict == "faster":
        exposed += "resolved: smaller buckets hid more of it behind backward)"
    elif r.verdict == "slower":
        exposed += "the reverse of the model)"
    else:
        exposed += "not resolved on two CPU processes of this machine)"
    whole = f"{st.median:.2f} times as fast as with one bucket ({_spread(st)})"
    if st.verdict == "faster":
        steps = f"the whole step with 1 MiB buckets was {whole}: shorter too"
    elif st.verdict == "slower":
        steps = (f"the whole step with 1 MiB buckets was {whole}: longer, and this run does not "
                 "say why")
    else:
        steps = (f"the whole steps with 1 MiB buckets and with one bucket could not be told apart "
                 f"(the step with 1 MiB buckets was {whole}); on GPUs, whose communication has "
                 "hardware of its own, we predict the step to gain")
    return f"{exposed}; {steps}"


def message_cause(r, saved_ms, comm_saved_ms):
    """Where one message a step (against 8) saved its time: named only when the ratio is
    resolved faster and the measured split puts most of the saving in the all-reduce."""
    _check(r)
    if r.verdict == "faster" and saved_ms > 0 and comm_saved_ms >= saved_ms:
        return (f"about all of the {saved_ms:.2f} ms a step saved was all-reduce time, waits "
                f"for the other worker included ({comm_saved_ms:.2f} ms less of it, medians): "
                "the saving is in the all-reduce, measured (this run does not split the messages' "
                "own time from the wait)")
    if r.verdict == "faster" and saved_ms > 0 and comm_saved_ms > 0.5 * saved_ms:
        return (f"{comm_saved_ms:.2f} ms of the {saved_ms:.2f} ms a step saved was all-reduce "
                "time, waits for the other worker included (medians): most of the saving is in "
                "the all-reduce, measured (this run does not split the messages' own time from "
                "the wait)")
    if r.verdict == "faster":
        return ("the measured split does not put the difference in the all-reduce, so this run "
                "names no cause")
    return "this run resolved no difference, so it names no cause"


# Two shares of CPU time closer than this are "about the same share".
SAME_SHARE = 0.1


def arithmetic_share_words(shares, on_gpu):
    """What the fixes chapter's profile of one step says (`shares`: each step's share of CPU
    self time in the convolutions and matrix products, 0 to 1). On a CPU that time is the
    arithmetic; on a GPU it is launching kernels. Words for over half (about the same share,
    within SAME_SHARE, or not), under half, or mixed."""
    if not shares or not all(0 <= v <= 1 for v in shares.values()):
        raise ValueError(f"shares {shares!r}: give each step's share, between 0 and 1")
    lo, hi = min(shares.values()), max(shares.values())
    part = ("more than half" if lo > 0.5 else "less than half" if hi < 0.5 else
            "more than half for one step and less for the other")
    if on_gpu:
        return ("On a GPU the arithmetic runs on the GPU, and an operator's CPU time is spent "
                "launching its kernels: this profile of CPU time measures launches, and those "
                f"of the convolutions and matrix products were {part} of it. The rest is the "
                "launches of the other operators and the Python between them: CPU time that a "
                "CUDA graph replaces with one launch a step (fix 7).")
    if lo > 0.5 and hi - lo >= SAME_SHARE:
        return (f"Both steps spent more than half of their CPU time in the convolutions and "
                f"matrix products, but not about the same share ({lo:.0%} against {hi:.0%}): "
                "this profile does not show that the fused step has no overhead left that the "
                "library's step does not pay too, and a CPU operator has no kernel launch for "
                "a CUDA graph to remove.")
    if lo > 0.5:
        return ("The profiles, more than the timing, carry the point: both steps spend about "
                "the same share on the arithmetic, so on one CPU thread the fused step has no "
                "overhead left that the library's step does not pay too: the convolutions and "
                "the elementwise work around them (ReLU, average pooling and their backward) "
                "are the step, and removing Python or launches cannot shorten them. A CPU "
                "operator has no kernel launch to pay, so a CUDA graph has nothing to remove "
                "here. What remains on a CPU: fewer passes over memory for the elementwise "
                "work, a better memory layout for the convolutions and less arithmetic, "
                "leaving out what the model throws away (compiling: the next fix), and more "
                "cores doing the arithmetic at the same time (the worker processes of the "
                "previous chapter, and the benchmark's rows on ranks).")
    return (f"Here the convolutions and matrix products were {part} of the steps' CPU time, so "
            "this profile does not show the arithmetic to be the step: the rest (elementwise "
            "work, the loss, the update and the Python between operators) is what a fused or "
            "compiled step can still shorten on this CPU.")


def overlap_step_words(r):
    """Overlap against all-reduce-after-backward on the whole step (Ratio: after's / overlap's)."""
    _check(r)
    return {"faster": "faster than", "slower": "slower than",
            "cannot tell": "not told apart (one round) from"}.get(r.verdict, "within noise of")


def shared_rounding_words(cosines):
    """How much rounding two float32 results of one function share, from the cosine between
    their errors against the float64 value, one per state. Errors a = s + n1 and b = s + n2 with
    a shared part s and independent parts of equal size have cosine |s|**2 / |a|**2: the share
    of each error's square that is shared. The median chooses: 1/2 or more most, below 1/10 none."""
    cos = sorted(cosines)
    if not cos or not all(-1 - 1e-9 <= c <= 1 + 1e-9 for c in cos):
        raise ValueError(f"cosines={cosines!r}: one cosine between -1 and 1 per state")
    mid = statistics.median(cos)
    spread = (f"median cosine {mid:.2f} over {len(cos)} states, from {cos[0]:.2f} to "
              f"{cos[-1]:.2f}; 1 is the same rounding, about 0 two independent ones")
    if mid >= 0.5:
        return (f"the two errors point largely the same way ({spread}): they share most of "
                "their rounding")
    if mid >= 0.1:
        return (f"the two errors point partly the same way ({spread}): they share part of "
                "their rounding, not most of it")
    return (f"the two errors do not point the same way ({spread}): they round in different "
            "places")
