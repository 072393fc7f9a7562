"""The profile chapter's sentences chosen by its numbers (helpers/data_parallel/profile_words.py,
and the trace's actor and cut in trace_verdicts.py): every branch reached, the words a stored run
shows unchanged for the same numbers."""
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
    assert helpers.trace_cut_words("host") == "the last autograd node"
    assert helpers.trace_cut_words("gpu") == "backward's last kernel on the GPU"
    with pytest.raises(ValueError, match="gloo"):
        helpers.trace_actor_words("mpi")
    with pytest.raises(ValueError, match="host"):
        helpers.trace_cut_words("device")
