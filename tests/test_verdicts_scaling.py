"""The scaling chapter's sentences (helpers/data_parallel/words/scaling_verdicts.py): a branch per
verdict, a cause only where the run measured it, and the all-reduce never credited with the
wait for the other worker."""
import pytest

import helpers
from helpers.data_parallel.words.scaling_verdicts import (
    model_saving_words,
    same_setup_words,
    weak_split,
)

FASTER = helpers.Ratio([1.2, 1.3, 1.4])
SLOWER = helpers.Ratio([0.7, 0.8, 0.9])
NOISE = helpers.Ratio([0.9, 1.1, 1.3])
ONE = helpers.Ratio([1.5])


def test_strong_scaling_names_a_cause_only_when_resolved_and_prints_its_split_always():
    words = helpers.strong_words
    fast = words(FASTER, 20.0, 11.0, 1.0, 2.0)
    assert fast.startswith("faster than one (1.30x, 1.20-1.40 over 3 rounds)")
    assert fast.count("faster") == 1
    assert "rank 0 waited 1.0 ms for the other worker to arrive and 2.0 ms passed" in fast
    # slower: the communication after both arrived outweighs the compute saved ...
    assert words(SLOWER, 20.0, 11.0, 1.0, 12.0).endswith(
        "alone took more than the 9.0 ms of compute saved")
    # ... or only with the wait, which is not credited to the all-reduce
    waited = words(SLOWER, 20.0, 11.0, 6.0, 5.0)
    assert "the wait for the other worker more, and what delayed it this run does not split" \
        in waited
    assert words(SLOWER, 20.0, 11.0, 1.0, 2.0).endswith("so the split does not explain it")
    for r in (NOISE, ONE):   # the medians are printed, labelled, with no cause
        got = words(r, 20.0, 11.0, 1.0, 2.0)
        assert "names no cause (not resolved: each worker's compute went from 20.0 to 11.0" \
            in got
        assert "saved" not in got
    assert words(NOISE, 20.0, 11.0, 1.0, 2.0).count("within noise") == 1
    assert "2.0 ms passed after both had arrived" in fast
    four = words(FASTER, 20.0, 6.0, 1.0, 2.0, k=4)
    assert "the last of the 4 workers" in four and "after all had arrived" in four


def test_the_same_setup_clause_explains_a_missing_verdict_without_typing_another_run():
    faster = same_setup_words(FASTER, 10)
    assert "a like set-up" in faster and "same set-up" not in faster
    assert faster.endswith("this one (10 repeats) can differ beyond their spreads, and this "
                           "chapter, which does not read that run, cannot show whether they do")
    noise = same_setup_words(NOISE, 10)
    assert "resolved in one run of 10 repeats and not in the next" in noise
    assert "none here need not disagree" in noise
    assert "neither says why" in same_setup_words(SLOWER, 10)


def test_the_two_workers_sentence_splits_the_all_reduce_from_the_wait_or_says_none_ran():
    twice = helpers.Ratio([2.1, 2.3, 2.5])
    got = helpers.two_workers_sentence((4, 1024), (SLOWER, twice), (0.6, 0.05), (0.1, 0.2), 8)
    assert "0.80 times as fast (0.70-0.90: slower) as one at batch 4" in got
    assert "more than twice" in got
    assert ("After both workers had arrived, the all-reduce's 8 messages took 60% of a "
            "two-worker step at batch 4 and 5% at batch 1024; rank 0's wait for the other "
            "worker took a further 10% and 20%") in got
    assert "more than twice" not in helpers.two_workers_sentence(
        (4, 1024), (SLOWER, FASTER), (0.6, 0.05), (0.1, 0.2), 8)
    assert "the all-reduce's 3 messages took" in helpers.two_workers_sentence(
        (4, 1024), (SLOWER, FASTER), (0.6, 0.05), (0.1, 0.2), 3)
    assert "not run" in helpers.two_workers_sentence((), (), (), (), 8)


def test_weak_scaling_credits_the_all_reduce_only_with_the_time_after_both_arrived():
    split = dict(step_ms=(25.0, 33.0), compute_ms=(24.0, 28.0), wait_ms=3.0, after_ms=2.0)
    both = weak_split(SLOWER, SLOWER, **split)
    assert "each worker's compute slowed too" in both["text"]
    assert "slowed by 4.0 ms (resolved): 9.0 of the 8.0 ms lost" in both["summary"]
    assert "rank 0's wait for the other worker (3.0 ms)" in both["summary"]
    assert "Of the 8.0 ms a step it added" in both["text"]
    assert "0.80 of one worker's speed (0.70-0.90 over 3 repeats in turns" in both["text"]
    comm = weak_split(SLOWER, NOISE, **split)
    # 2.0 of the 8.0 ms lost is communication; the 3.0 ms of waiting is not counted as it
    assert "the communication this run can name (25% of the loss)" in comm["text"]
    assert "rank 0 waited 3.0 ms for the other worker to arrive and 2.0 ms passed" \
        in comm["text"]
    assert "the 3.0 ms of waiting is the other worker arriving later" in comm["text"]
    assert "took 2.0 ms a step (25% of the loss), rank 0 waited a further 3.0 ms" \
        in comm["summary"]
    assert "not resolved slower" in comm["summary"] and "slowed by" not in comm["summary"]
    odd = weak_split(FASTER, NOISE, **split)
    assert "names no cause" in odd["text"] and "names no cause" in odd["summary"]
    for r in (NOISE, ONE):
        got = weak_split(r, SLOWER, **split)
        assert "cannot tell" in got["text"] and "compute" not in got["text"]
    with pytest.raises(TypeError, match="helpers.Ratio"):
        weak_split(0.8, SLOWER, **split)


def test_the_batch_sweep_gives_the_fall_and_the_growth_each_its_verdict():
    words = helpers.sweep_words
    got = words(4, 64, 4096, FASTER, SLOWER)
    assert got == ("from batch 4 to 64 an epoch ran 1.30 times as fast (1.20-1.40: faster): it "
                   "fell with the batch; from batch 64 to 4096, 0.80 times as fast (0.70-0.90: "
                   "slower): the epoch grew with the batch")
    assert "cannot tell whether it fell" in words(4, 64, 4096, NOISE, NOISE)
    assert "it grew with the batch" in words(4, 64, 4096, SLOWER, FASTER)
    assert words(4, 64, 4096, FASTER, FASTER).endswith("it fell further")
    assert words(4, 64, 64, FASTER).endswith("it fell with the batch")
    with pytest.raises(ValueError, match="small < pivot <= large"):
        words(64, 4, 4096, FASTER, SLOWER)
    with pytest.raises(ValueError, match="exactly when"):
        words(4, 64, 4096, FASTER)


def test_the_sweep_summary_shows_the_fall_only_where_it_resolved():
    got = helpers.sweep_summary(4, 64, {"a": FASTER, "b": NOISE, "c": FASTER},
                                {"a": SLOWER, "b": NOISE})
    assert got.startswith("In this run the epoch fell from batch 4 to 64, resolved, for a and "
                          "c; for b this run could not tell.")
    assert got.endswith("it grew, resolved, at the largest batch for a.")
    none = helpers.sweep_summary(4, 64, {"a": NOISE}, {"a": NOISE})
    assert "so on this machine the fall stays a prediction" in none
    assert none.endswith("no epoch was resolved longer at the largest batch than at the pivot.")
    assert "for a it grew instead" in helpers.sweep_summary(4, 64, {"a": SLOWER}, {})


def test_the_model_saving_is_checked_inside_a_step_in_three_branches():
    got = model_saving_words(2.0, 240, (12.0, 2.0), FASTER, 15, 4)
    assert "at batch 4" in got and "the waits for the other worker left out" in got
    assert "prices the saving at 2.0 ms a step; the run measured 10.0 ms, 5.0 times" in got
    assert "about 1,429 µs for each message saved, against an α of 240 µs" in got
    assert ("from the fastest of 15 isolated calls on ranks doing nothing else: the model's α "
            "misses most of the per-message cost inside a step.") in got
    assert "within a factor of two" in model_saving_words(
        2.0, 240, (5.0, 2.0), FASTER, 15, 4)
    assert got.endswith("This run does not say where the rest of it goes.")
    assert model_saving_words(2.0, 240, (5.0, 2.0), FASTER, 15, 4).endswith("the rest of "
                                                                                  "it goes.")
    over = model_saving_words(2.0, 240, (2.5, 2.0), FASTER, 15, 4)
    assert "overprices" in over and "the rest" not in over and over.endswith("inside a step.")
    assert "the rest" not in model_saving_words(2.0, 240, (3.5, 2.0), FASTER, 15, 4)
    assert "does not confirm" in model_saving_words(2.0, 240, (5.0, 6.0), SLOWER, 15, 4)
    noise = model_saving_words(2.0, 240, (7.0, 6.0), NOISE, 15, 4)
    assert "cannot check the model's saving of 2.0 ms" in noise and "times the" not in noise
    assert "medians show no saving" in model_saving_words(
        2.0, 240, (5.0, 6.0), FASTER, 15, 4)
