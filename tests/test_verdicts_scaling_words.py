"""The scaling chapter's sentences chosen by its numbers
(helpers/data_parallel/words/scaling_words.py): every branch reached, the words a stored run shows
unchanged for the same numbers."""
import pytest

import helpers
from helpers.data_parallel.words.scaling_verdicts import same_setup_words

FASTER = helpers.Ratio([1.2, 1.3, 1.4])


def test_one_core_says_which_run_it_could_not_make():
    assert helpers.one_core_words("strong") == "not run: one core is too few for two workers"
    assert helpers.one_core_words("sweep") == "was not run (one core)"
    with pytest.raises(ValueError, match="strong"):
        helpers.one_core_words("weak")
    assert helpers.no_two_workers_words().startswith("With one core, two workers were not run")


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
