"""Part III's DDP and DataParallel words (helpers/data_parallel/words/ddp_words.py): each branch,
from the numbers, the machine or the reference run that choose it."""
import pytest

from helpers.data_parallel.words.ddp_words import (
    dp_ddp_words,
    exposed_words,
    flag_cost_words,
    flag_step_words,
    flight_recorder_words,
    join_share_words,
    nodes_same_words,
    pending_words,
    reference_dump_words,
    timeline_clock_words,
    walk_growth_words,
)
from helpers.timing import Ratio

# a Ratio of each verdict: above 1 over its spread, below, across 1.0, and one round
FASTER, SLOWER, NOISE, ONE = ([1.4, 1.5, 1.6], [0.6, 0.7, 0.8], [0.9, 1.0, 1.2], [1.5])
REF = dict(gpu="H100", gpu_count=2, date="2026-12-01", exists=True)


def test_the_ratios_have_the_verdicts_the_tests_name():
    assert [Ratio(s).verdict for s in (FASTER, SLOWER, NOISE, ONE)] == [
        "faster", "slower", "within noise", "cannot tell"]


@pytest.mark.parametrize("samples, word", [
    (FASTER, "DDP was faster than DataParallel."),
    (SLOWER, "DDP was slower than DataParallel."),
    (NOISE, "DDP was within noise of DataParallel."),
    (ONE, "DDP was not told apart (one round, no spread) from DataParallel."),
])
def test_dp_ddp_words_timed_here(samples, word):
    said = dp_ddp_words(Ratio(samples), 2, "NVIDIA H100", REF)
    assert said.startswith("Here, on 2 x NVIDIA H100, DataParallel's step took")
    assert said.endswith(word)


def test_dp_ddp_words_from_the_reference_run():
    ratio = Ratio(FASTER).to_dict()
    ref = dict(REF, paths={"train": {"dp_vs_ddp": {"ratio": ratio}}})
    said = dp_ddp_words(None, 0, None, ref)
    assert said.startswith("In the GPU reference run (H100 x2, 2026-12-01)")
    assert "took 1.50 times DDP's (spread 1.40 to 1.60 over 3 rounds)" in said
    assert said.endswith("DDP was faster than DataParallel.")


@pytest.mark.parametrize("exists, why", [(True, "had one GPU"), (False, "does not exist yet")])
def test_dp_ddp_words_predicted_without_gpus(exists, why):
    said = dp_ddp_words(None, 0, None, dict(REF, exists=exists))
    assert said.startswith("Not measured: this machine has fewer than 2 GPUs")
    assert f"the GPU reference run {why} (" in said and "The prediction" in said


def test_timeline_clock_words():
    assert "from CUDA events" in timeline_clock_words(True)
    assert timeline_clock_words(False).startswith("These are host times of gloo")


@pytest.mark.parametrize("samples, words", [
    (FASTER, "shorter with overlap than with every all-reduce after backward"),
    (SLOWER, "longer with overlap than with every all-reduce after backward"),
    (NOISE, "within noise of the all-reduce-after-backward one"),
    (ONE, "not told apart (one round) from the all-reduce-after-backward one"),
])
def test_exposed_words_every_verdict(samples, words):
    assert exposed_words(Ratio(samples)).startswith(words)


def test_pending_words():
    assert pending_words(1, 4) == "the others had completed during backward"
    assert pending_words(4, 4) == "none had completed during backward"


def test_flight_recorder_words_with_and_without_dumps():
    said = flight_recorder_words({0: 4, 1: 3}, (4, "gloo:all_reduce", {0}))
    assert said.startswith("Rank 0 recorded 4 collectives and rank 1 3: the first that not "
                           "every rank recorded is number 4 (`gloo:all_reduce`), run by rank 0 "
                           "alone.")
    assert "rank 0's Python stack" in said
    assert "ranks 0 and 2 alone" in flight_recorder_words({0: 4, 1: 3, 2: 4},
                                                          (4, "nccl:all_reduce", {2, 0}))
    assert "nothing to dump" in flight_recorder_words({}, None)
    assert flight_recorder_words({0: 4, 1: 4}, None) == (
        "Rank 0 recorded 4 collectives and rank 1 4, and every collective was recorded by "
        "every rank: these dumps name no collective that a rank missed.")


def test_reference_dump_words():
    fr = {"backend": "nccl", "first_unjoined": [4, "nccl:all_reduce"]}
    ref = dict(REF, paths={"torchrun": {"flight_recorder": fr}})
    assert reference_dump_words(ref) == (
        "On NCCL, in the GPU reference run (H100 x2, 2026-12-01), the dumps named collective 4 "
        "(`nccl:all_reduce`), run by rank 0 alone.")
    assert "had one GPU, and NCCL needs one per rank" in reference_dump_words(REF)
    assert "does not exist yet" in reference_dump_words(dict(REF, exists=False))


def test_nodes_same_words():
    assert nodes_same_words(870, 870) == "the same test accuracy as"
    assert nodes_same_words(868, 870) == "2 test images apart from"
    assert nodes_same_words(871, 870) == "1 test image apart from"


def test_join_share_words():
    assert join_share_words(1, 2) == "half"
    assert join_share_words(3, 4) == "3/4"


@pytest.mark.parametrize("samples, words", [
    (FASTER, "longer than"), (SLOWER, "shorter than"), (NOISE, "not clearly different from"),
    (ONE, "not told apart (one call each, no spread) from"),
])
def test_walk_growth_words_every_verdict(samples, words):
    assert walk_growth_words(Ratio(samples)) == words


@pytest.mark.parametrize("samples, words", [
    (FASTER, "slower with the flag than without"),
    (SLOWER, "faster with the flag than without"),
    (NOISE, "within noise with and without the flag: this timing cannot tell the two apart"),
    (ONE, "not told apart with and without the flag: one round has no spread"),
])
def test_flag_cost_words_every_verdict(samples, words):
    assert flag_cost_words(Ratio(samples)) == words


@pytest.mark.parametrize("samples, share, start, why", [
    # 1.5x: a 50 % slowdown against a 0.15 % walk, over 300 times its share
    (FASTER, 0.15, "The step grew by 50 % (the median per round), about 333 times the walk's "
     "profiled share (0.15 % of a step): far more than the walk, so most of it is other work "
     "the flag adds", "or the machine's load, which this timing does not tell apart"),
    # the same slowdown against a 10 % walk: the walk could be most of it
    (FASTER, 10, "The step grew by 50 % (the median per round), less than 10 times the walk's "
     "profiled share (10 % of a step): this timing does not tell the walk apart from other "
     "work", "or the machine's load"),
    (SLOWER, 0.15, "The flag only adds work, so a faster step with it comes from something "
     "other than the flag", "such as the machine's load between the turns (not measured here)"),
    (NOISE, 0.15, "A cost of 0.15 % of a step (the profile above) can hide under a busy "
     "machine's noise", "counted above)."),
    (ONE, 0.15, "A cost of 0.15 % of a step", "can hide under a busy machine's noise"),
])
def test_flag_step_words_every_verdict(samples, share, start, why):
    words = flag_step_words(Ratio(samples), share)
    assert words.startswith(start) and why in words
    assert ("far more than the walk" in words) == (samples is FASTER and share < 5)
