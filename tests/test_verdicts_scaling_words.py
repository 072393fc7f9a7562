"""The scaling chapter's sentences chosen by its numbers
(helpers/data_parallel/words/scaling_words.py): every branch reached, the words a stored run shows
unchanged for the same numbers."""
import pytest

import helpers
from helpers.data_parallel.results import WorkerTimes
from helpers.data_parallel.words.scaling_verdicts import (
    model_saving_words,
    same_setup_words,
    weak_split,
)

FASTER = helpers.Ratio([1.2, 1.3, 1.4])


def test_two_workers_are_the_runs_words_where_they_ran_else_what_one_core_could_not_make():
    assert helpers.two_worker_words("strong", [1, 2, 4], "measured") == "measured"
    assert helpers.two_worker_words("sweep", [1, 2], "measured") == "measured"
    assert helpers.two_worker_words("strong", [1], None) == (
        "not run: one core is too few for two workers")
    assert helpers.two_worker_words("sweep", [1], None) == "was not run (one core)"
    for ks in ([1], [1, 2]):
        with pytest.raises(ValueError, match="strong"):
            helpers.two_worker_words("weak", ks, "measured")


def _times(**samples):
    """A run's WorkerTimes, with these samples (no samples for the parts not given)."""
    parts = ("step_s", "compute_s", "comm_s", "update_s", "compute_cpu_s", "wait_s", "after_s")
    return WorkerTimes(**{p: list(samples.get(p, [])) for p in parts})


def _runs(ks, names, **parts):
    """A worker sweep's times as time_data_parallel returns them: {k: {run: WorkerTimes}}."""
    return {k: {n: _times(**{p: v[k - 1] for p, v in parts.items()}) for n in names}
            for k in ks}


def test_weak_scaling_is_weak_splits_words_where_two_workers_ran_else_says_not_run():
    # one worker's step 10 ms and two workers' 12 ms, repeat by repeat; compute 8 ms and 9 ms
    parts = dict(step_s=([0.010, 0.011, 0.009], [0.012, 0.013, 0.011]),
                 compute_s=([0.008, 0.008, 0.008], [0.009, 0.0095, 0.0085]),
                 wait_s=([0, 0, 0], [0.001, 0.001, 0.001]),
                 after_s=([0, 0, 0], [0.002, 0.002, 0.002]))
    runs = _runs([1, 2], ["fast 64", "fast 128"], **parts)
    ratio = helpers.ratio
    step = [helpers.Measurement(v) for v in parts["step_s"]]
    compute = [helpers.Measurement(v) for v in parts["compute_s"]]
    expected = weak_split(ratio(*step), ratio(*compute), step_ms=(10.0, 12.0),
                          compute_ms=(8.0, 9.0), wait_ms=1.0, after_ms=2.0)
    got = helpers.weak_words(runs, one="fast 64", two="fast 128")
    assert got == expected and "slower than ideal" in got["text"]
    alone = helpers.weak_words(_runs([1], ["fast 64", "fast 128"], **parts))
    assert alone == dict(text="with one core, two workers were not run",
                         summary="with one core, two workers were not run")


def test_the_model_against_the_run_is_model_saving_words_where_two_workers_ran_else_says_not():
    after = ([0, 0, 0], [0.012, 0.013, 0.011])    # the reference step's 8 messages ...
    fast = ([0, 0, 0], [0.002, 0.0021, 0.0019])    # ... against the fast step's one
    runs = _runs([1, 2], ["reference 4"], after_s=after)
    runs[2]["fast 4"] = _times(after_s=fast[1])
    many, one = helpers.Measurement(after[1]), helpers.Measurement(fast[1])
    got = helpers.model_vs_run_words(runs, 4, 2.0, 240, 15)
    assert got == model_saving_words(2.0, 240, (12.0, 2.0), helpers.ratio(many, one), 15, 4)
    assert "the reference step's 8 all-reduces took 12.0 ms a step and the fast step's one 2.0 ms" \
        in got and "one message was 6.00 times as fast" in got
    alone = helpers.model_vs_run_words(_runs([1], ["reference 4"], after_s=after), 4, 2.0, 240, 15)
    assert alone == ("With one core, two workers were not run, so this run cannot check the "
                     "model against a measured step.")


def test_the_setup_words_follow_same_setup_words_or_say_one_core():
    assert helpers.setup_words(FASTER, 31) == same_setup_words(FASTER, 31)
    assert helpers.setup_words(None, 31) == (
        "with one core, the profile chapter's set-up of two workers was not run here either")


def test_the_sweep_note_is_said_only_where_the_sweep_starts_at_batch_4():
    note = helpers.sweep_setup_note(4, 256, 12)
    assert "here 64 steps a repeat, in turns with all 12 runs of this sweep" in note
    assert "1 step a repeat" in helpers.sweep_setup_note(4, 2, 12)
    assert helpers.sweep_setup_note(8, 256, 12) == ""
    assert helpers.sweep_setup_note(None, 256, 12) == ""


def test_the_sizes_below_the_latency_range_are_each_named():
    assert helpers.below_range_words({}, 50e-6) == ""
    one = helpers.below_range_words({4096: 40e-6}, 50e-6)
    assert one.startswith(" Not every larger size took longer: 4,096 bytes took 40 µs, under "
                          "the fitted α too, under that range")
    assert one.endswith("the range and that point together.")
    two = helpers.below_range_words({4096: 60e-6, 8192: 40e-6}, 50e-6)
    assert "4,096 bytes took 60 µs; 8,192 bytes took 40 µs, under the fitted α too" in two
    assert two.endswith("the range and those points together.")


def test_a_step_prints_whole_from_10_ms_and_to_two_digits_below():
    assert helpers.step_ms_text(12.4) == "12"
    assert helpers.step_ms_text(3.456) == "3.5"
    assert helpers.step_ms_text(0.0123) == "0.012"


def test_the_lenet_step_verdict_has_a_branch_per_case():
    assert helpers.lenet_step_verdict(16, 64) == (
        "so from 16 GPUs on, the modelled allreduce alone costs more than the step it serves")
    none = helpers.lenet_step_verdict(None, 64)
    assert none.startswith("longer than the modelled allreduce even on 64 GPUs. We predict")
    assert "no GPU run of this course has been recorded" in none
    gpu = dict(name="H100", epoch_s=0.235, steps=235, k_over=8)
    over = helpers.lenet_step_verdict(None, 64, gpu)
    assert ("on one H100 at 0.235 s an epoch of 235 steps, about 1.00 ms a step (one reading, "
            "no spread)") in over
    assert "the modelled allreduce alone would cost more from 8 GPUs on: a prediction" in over
    shorter = helpers.lenet_step_verdict(None, 64, dict(gpu, k_over=None))
    assert "the modelled allreduce stays shorter even on 64 GPUs: a prediction" in shorter
    # a count over this machine's step wins over the GPU run
    assert helpers.lenet_step_verdict(4, 64, gpu).startswith("so from 4 GPUs on")


def test_the_latency_range_names_its_largest_size_or_none():
    assert helpers.flat_upto_words({64: 1e-5, 4096: 2e-5}) == "4,096"
    assert helpers.flat_upto_words({}) == "none"
