"""The profile chapter's sentences chosen by its numbers
(helpers/data_parallel/words/profile_words.py, and the trace's actor and cut in trace_verdicts.py):
every branch reached, the words a stored run shows unchanged for the same numbers."""
import pytest

import helpers

FASTER = helpers.Ratio([1.002, 1.01, 1.02])
SLOWER = helpers.Ratio([0.95, 0.97, 0.996])
NOISE = helpers.Ratio([0.98, 1.0, 1.02])
ONE = helpers.Ratio([1.01])


def test_the_gpu_status_has_a_branch_per_recorded_run():
    assert helpers.profile_gpu_status(None) == (
        "No GPU run of this course has been recorded yet (reference/gpu_reference.json says "
        "so), so this is a prediction.")
    one = dict(sentence="the run of 2026-12-01 on one H100", scope="one GPU", gpu_count=1)
    assert helpers.profile_gpu_status(one) == (
        "The run of 2026-12-01 on one H100 does not measure it: one GPU. Its figures are "
        "below.")
    assert helpers.profile_gpu_status(dict(one, gpu_count=None)).startswith("The run of")
    assert helpers.profile_gpu_status(dict(one, gpu_count=2)) == (
        "Figures measured on GPUs: see the run of 2026-12-01 on one H100 below (one GPU).")


def test_the_self_check_has_a_branch_per_verdict():
    assert helpers.self_check_words(NOISE) == dict(
        spread="0.98-1.02", text="as it should be: the step is the same")
    for r in (FASTER, SLOWER):
        got = helpers.self_check_words(r)
        assert got["text"].startswith("although the step is the same: a busy machine")
    assert helpers.self_check_words(FASTER)["spread"] == "1.002-1.02"
    assert helpers.self_check_words(SLOWER)["spread"] == "0.95-0.996"
    assert "from one round" in helpers.self_check_words(ONE)["text"]
    with pytest.raises(TypeError, match="helpers.Ratio"):
        helpers.self_check_words(1.0)


def test_a_split_gets_its_lead_in_unless_the_prediction_pointed_to_it():
    split = "each worker's compute took 5.0 ms"
    pointed = "missed: ... and the split below shows where the time went"
    assert helpers.split_lead_in(split, pointed) == "Each worker's compute took 5.0 ms"
    assert helpers.split_lead_in(split, "as predicted") == (
        "Where the time went: each worker's compute took 5.0 ms")


def test_the_trace_names_its_actor_and_its_cut():
    assert helpers.trace_actor_words("nccl") == "NCCL's kernels"
    assert helpers.trace_actor_words("gloo") == "Gloo's threads"
    assert helpers.trace_cut_words("host") == ("the last gradient's hook, inside backward's "
                                               "last autograd node")
    assert helpers.trace_cut_words("gpu") == "backward's last kernel on the GPU"
    with pytest.raises(ValueError, match="gloo"):
        helpers.trace_actor_words("mpi")
    with pytest.raises(ValueError, match="host"):
        helpers.trace_cut_words("device")


def test_the_halves_control_is_reported_unless_the_two_device_words_name_it():
    assert helpers.halves_control_words(FASTER, SLOWER) == ""
    said = helpers.halves_control_words(NOISE, helpers.Ratio([1.05, 1.22, 1.64]))
    assert said.startswith(" The control, one device running the two halves of each batch in "
                           "turn, was 1.22x (1.05-1.64, 3 rounds) against one device on whole "
                           "batches: faster. The same arithmetic in smaller pieces was cheaper")
    assert ": slower. The same arithmetic in smaller pieces cost more" in (
        helpers.halves_control_words(NOISE, SLOWER))
    assert ": within noise: this run cannot tell" in helpers.halves_control_words(SLOWER, NOISE)
    assert "one round, no spread" in helpers.halves_control_words(ONE, ONE)
    for two, halves in ((NOISE, FASTER), (NOISE, SLOWER), (SLOWER, NOISE), (ONE, ONE)):
        assert helpers.halves_control_words(two, halves).endswith("."), "the text goes on after"
    with pytest.raises(TypeError, match="helpers.Ratio"):
        helpers.halves_control_words(NOISE, 1.2)


def test_the_fixed_parts_of_two_fits_get_a_branch_each_and_a_negative_one_is_named():
    assert helpers.fixed_part_words(1.03e-3, 0.78e-3) == (
        "the intercept on two devices is the smaller, by 0.25 ms (two fits to four medians "
        "each, with no spread of their own): these fits do not show a second device adding "
        "a fixed part")
    assert helpers.fixed_part_words(0.5e-3, 1.0e-3).startswith(
        "the intercept on two devices is the larger, by 0.50 ms, as a second device's own")
    assert helpers.fixed_part_words(1.0e-3, 1.1e-3).startswith(
        "the two intercepts are within 20% of each other (+0.10 ms")
    negative = helpers.fixed_part_words(-0.2e-3, 1.0e-3)
    assert negative.startswith("the intercept on two devices is the larger, by 1.20 ms")
    assert negative.endswith("; one device's (-0.20 ms) fit crosses zero examples below zero, "
                             "printed above as 0.00 ms: a negative intercept is no fixed part "
                             "the fit can show")
    assert "one device's (-0.10 ms) and two devices' (-0.30 ms) fit" in (
        helpers.fixed_part_words(-0.1e-3, -0.3e-3))


def test_a_gpus_arithmetic_of_a_step_is_a_prediction_with_a_branch_per_size():
    said = helpers.gpu_arithmetic_words(3.39e9, 51.4e12, "the reference run")
    assert said == ("a GPU does the arithmetic of a step in well under a millisecond (a "
                    "prediction: 3.39 GFLOP at 51 TFLOP/s, a float32 product's rate (the "
                    "reference run), take 0.07 ms)")
    assert "in about a millisecond (a prediction" in helpers.gpu_arithmetic_words(
        3.39e9, 3.39e12, "x")
    assert "in 3.4 ms (a prediction" in helpers.gpu_arithmetic_words(3.39e9, 1e12, "x")
