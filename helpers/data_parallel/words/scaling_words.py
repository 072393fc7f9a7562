"""The scaling chapter's remaining sentences chosen by its numbers: runs that one core cannot
make, the sizes that fall under the latency range, the LeNet step against the modelled
all-reduce, one function each with a branch per case (tests/test_verdicts_scaling_words.py), so
that no hidden notebook cell decides what a sentence says.
"""
from ...words import plural
from .scaling_verdicts import same_setup_words

__all__ = ["one_core_words", "setup_words", "sweep_setup_note", "below_range_words",
           "step_ms_text", "lenet_step_verdict", "no_two_workers_words",
           "flat_upto_words"]


def one_core_words(kind):
    """What a sentence says of two workers where one core cannot run them: `kind` 'strong'
    (the worker sweep) or 'sweep' (the batch sweep)."""
    if kind == "strong":
        return "not run: one core is too few for two workers"
    if kind == "sweep":
        return "was not run (one core)"
    raise ValueError(f"kind is 'strong' or 'sweep', got {kind!r}")


def no_two_workers_words():
    """The model-against-run sentence where one core ran no two workers."""
    return ("With one core, two workers were not run, so "
            "this run cannot check the model against a measured step.")


def setup_words(r=None, reps=None):
    """The fast step at batch 256 on two workers against the profile chapter's run of it
    (same_setup_words), or, where one core ran no two workers (`r` None), that it says so."""
    if r is None:
        return ("with one core, the profile chapter's set-up of two workers was "
                "not run here either")
    return same_setup_words(r, reps)


def sweep_setup_note(smallest, images, runs):
    """The note that the profile chapter times two workers against one at global batch 4 in a
    set-up of its own: only where this sweep's smallest two-worker batch (`smallest`, None where
    two workers did not run) is 4; `images` a repeat's images, `runs` the sweep's runs."""
    if smallest != 4:
        return ""
    return ("The profile chapter times the same comparison at global batch 4 in a "
            "set-up of its own (its `small_steps` steps a repeat, in turns with its "
            "two other runs; here "
            f"{plural(max(1, images // 4), 'step')} a repeat, in "
            f"turns with all {runs} runs of this sweep), so the two chapters' "
            "ratios come from different runs and need not agree.")


def flat_upto_words(flat_sizes):
    """The largest size (bytes) of the latency range, {bytes: seconds}, or 'none' if empty."""
    return f"{max(flat_sizes):,d}" if flat_sizes else "none"


def below_range_words(below, alpha_s):
    """The sizes larger than the latency range that took less than all of it: `below`
    ({bytes: seconds}, each size's fastest call), `alpha_s` the fitted latency. '' where none
    did; otherwise each named, with whether it fell under α too. The model cannot give them."""
    if not below:
        return ""
    named = "; ".join(f"{b:,d} bytes took {t * 1e6:.0f} µs"
                      + (", under the fitted α too" if t < alpha_s else "")
                      for b, t in below.items())
    return (" Not every larger size took longer: " + named
            + ", under that range, which the model cannot give (in it the time "
            "only grows with the size). Why, this run does not say (each size's "
            "fastest call, on a shared machine): the latency is known no better than "
            "the range and " + ("that point" if len(below) == 1 else "those points")
            + " together.")


def step_ms_text(step_ms):
    """A step's milliseconds: whole from 10 ms on, else to two significant digits."""
    return f"{step_ms:.0f}" if step_ms >= 10 else f"{step_ms:.2g}"


def lenet_step_verdict(k_cpu, last_k, gpu=None):
    """The LeNet step against its modelled ring all-reduce: `k_cpu`, the first GPU count whose
    modelled all-reduce exceeds this machine's step (None: none up to `last_k`); `gpu`, where the
    committed GPU run timed the fast trainer on one GPU and no count exceeded this step, a dict
    (name, epoch_s, steps, k_over: the first count whose all-reduce exceeds that GPU step, or
    None). The GPU's all-reduce was never timed: the words say prediction."""
    if k_cpu:
        return (f"so from {k_cpu} GPUs on, the modelled "
                "allreduce alone costs more than the step it serves")
    if gpu is None:
        return (f"longer than the modelled allreduce even on {last_k} "
                "GPUs. We predict that a GPU runs the same step many times "
                "faster while the allreduce does not speed up with it, so that "
                "there the allreduce overtakes the step (no GPU run of this "
                "course has been recorded to check it)")
    step_s = gpu["epoch_s"] / gpu["steps"]
    return (
        f"longer than the modelled allreduce even on {last_k} GPUs. "
        f"A GPU runs the same step far faster: the committed GPU run (below) "
        f"measured the fast trainer on one {gpu['name']} at "
        f"{gpu['epoch_s']:.3f} s an epoch of "
        f"{gpu['steps']} steps, about {step_s * 1e3:.2f} ms a step (one "
        "reading, no spread). Set against that step, "
        + (f"the modelled allreduce alone would cost more from {gpu['k_over']} GPUs "
           "on" if gpu["k_over"] else
           f"the modelled allreduce stays shorter even on {last_k} "
           "GPUs")
        + ": a prediction, since no run of this course has timed LeNet's "
        "allreduce between GPUs")
