"""The scaling chapter's remaining sentences chosen by its numbers: two workers' sentences (the
run's own, or that one core could not make them), the sizes that fall under the latency range,
the LeNet step against the modelled all-reduce, one function each with a branch per case
(tests/test_verdicts_scaling_words.py), so that no notebook cell decides what a sentence says.
"""
from ...timing import Measurement, ratio
from ...words import plural
from .scaling_verdicts import model_saving_words, same_setup_words, weak_split

__all__ = ["two_worker_words", "weak_words", "model_vs_run_words", "setup_words",
           "sweep_setup_note", "below_range_words", "step_ms_text", "lenet_step_verdict",
           "flat_upto_words"]

_NOT_RUN = {"strong": "not run: one core is too few for two workers",
            "sweep": "was not run (one core)"}


def two_worker_words(kind, ks, measured):
    """The sentence on two workers of a sweep over the worker counts `ks`: `measured` (the run's
    own sentence) where `ks` holds 2, else that one core could not run them; `kind` 'strong'
    (the worker sweep) or 'sweep' (the batch sweep)."""
    if kind not in _NOT_RUN:
        raise ValueError(f"kind is 'strong' or 'sweep', got {kind!r}")
    return measured if 2 in ks else _NOT_RUN[kind]


def weak_words(runs, one="fast 64", two="fast 128"):
    """Weak scaling from the worker sweep (`runs` the times of a results.WorkerSweep, as
    time_data_parallel returns it: {workers: {run: WorkerTimes}}): run `two` on two workers
    against `one` on one worker, twice the global batch, in weak_split's words ({"text",
    "summary"}); where one core ran no two workers (no 2 in `runs`), that they were not run."""
    if 2 not in runs:
        said = "with one core, two workers were not run"
        return dict(text=said, summary=said)
    alone, both = runs[1][one], runs[2][two]

    def ms(m):
        return 1e3 * m.median

    step = Measurement(alone.step_s), Measurement(both.step_s)
    compute = Measurement(alone.compute_s), Measurement(both.compute_s)
    return weak_split(ratio(*step), ratio(*compute), step_ms=tuple(map(ms, step)),
                      compute_ms=tuple(map(ms, compute)),
                      wait_ms=ms(Measurement(both.wait_s)),
                      after_ms=ms(Measurement(both.after_s)))


def model_vs_run_words(runs, batch, model_ms, alpha_us, reps):
    """The alpha-beta model's saving of one message a step (`model_ms`, from its α `alpha_us`
    fitted on the fastest of `reps` calls) against the batch sweep's two-worker steps at global
    batch `batch` (`runs` as in weak_words): model_saving_words on the
    all-reduce after both workers arrived, the reference step's 8 messages against the fast
    step's one; where one core ran no two workers (no 2 in `runs`), that it cannot check."""
    if 2 not in runs:
        return ("With one core, two workers were not run, so "
                "this run cannot check the model against a measured step.")
    after = [Measurement(runs[2][f"{mode} {batch}"].after_s) for mode in ("reference", "fast")]
    return model_saving_words(model_ms, alpha_us, [1e3 * a.median for a in after], ratio(*after),
                              reps, batch)


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
