"""Part IV's sentences from its measurements (helpers/data_parallel/words/verdicts.py): every
verdict gets its own words, and a cause is named only where the ratio is resolved."""
import pytest

import helpers
from helpers.data_parallel.words.verdicts import compile_sentence, ratio_words

FASTER = helpers.Ratio([1.2, 1.3, 1.4])
SLOWER = helpers.Ratio([0.7, 0.8, 0.9])
NOISE = helpers.Ratio([0.9, 1.1, 1.3])
ONE = helpers.Ratio([1.5])


def test_ratio_words_carry_median_spread_and_verdict():
    assert ratio_words(FASTER) == "1.30 times as fast (1.20-1.40: faster)"
    with pytest.raises(TypeError, match="helpers.Ratio"):
        ratio_words(1.3)


def test_against_prediction_has_a_branch_per_verdict():
    got = {r.verdict: helpers.against_prediction(r, {"faster", "within noise"})
           for r in (FASTER, SLOWER, NOISE, ONE)}
    assert got == {"faster": "faster, as predicted",
                   "slower": "slower: not what we predicted",
                   "within noise": "within noise: this run cannot tell them apart, as "
                                   "predicted",
                   "cannot tell": "one round: no verdict"}
    assert helpers.against_prediction(FASTER, {"slower"}).endswith("not what we predicted")
    with pytest.raises(ValueError, match="choose among"):
        helpers.against_prediction(FASTER, {"quicker"})


def test_the_compile_pays_back_only_when_resolved_faster():
    assert "pays back its first step's 30.0 s after 300 steps (1.3 epochs" in \
        compile_sentence(FASTER, 30.0, 0.1, 235)
    assert "never pays back" in compile_sentence(SLOWER, 30.0, -0.1, 235)
    # a full epoch of 60,000 at batch 256 ends with a short batch: a second compile, said
    assert "(1.3 epochs of Fashion-MNIST: one compile)" in compile_sentence(
        FASTER, 30.0, 0.1, 235)
    assert ("(1.3 epochs of Fashion-MNIST: one compile; the epoch's short last batch compiles "
            "once more)") in compile_sentence(FASTER, 30.0, 0.1, 235, short_last=True)
    noise = compile_sentence(NOISE, 30.0, 0.1, 235)
    assert "cannot tell whether it ever pays back" in noise and "after" not in noise
    assert "no CUDA graph" in helpers.graph_sentence(None)
    assert "(1.20-1.40: faster)" in helpers.graph_sentence(FASTER)


def test_knob_and_bucket_words_follow_the_verdict():
    assert helpers.knob_words(FASTER, 7.3, NOISE).startswith("less exposed")
    assert helpers.knob_words(SLOWER, 19.5, NOISE).startswith("more exposed")
    assert "cannot tell" in helpers.knob_words(NOISE, 12.0, NOISE)
    # the spread is the default's exposed time over the knob's (above 1: the knob left less)
    assert "the default's was 1.20-1.40 times it per round" in \
        helpers.knob_words(FASTER, 7.3, NOISE)
    assert "resolved: smaller buckets" in helpers.bucket_words(FASTER, NOISE)
    assert "reverse of the model" in helpers.bucket_words(SLOWER, NOISE)
    assert "not resolved" in helpers.bucket_words(NOISE, NOISE)
    # the step has its own verdict: a shorter step is never called longer, and no cause is
    # named that the run did not measure (the old words blamed one core per rank)
    assert "shorter too" in helpers.bucket_words(FASTER, FASTER)
    longer = helpers.bucket_words(FASTER, SLOWER)
    assert "longer, and this run does not say why" in longer and "core" not in longer
    assert "could not be told apart" in helpers.bucket_words(FASTER, NOISE)


def test_each_bucket_comparison_names_its_baseline_and_prints_ends_near_one_to_three_decimals():
    """The same 0.92 against the default (knob_words) and against one
    bucket (bucket_words) must say which, and a spread end that rounds to 1.00 prints 1.00 only
    where it is 1."""
    near = helpers.Ratio([0.81, 0.92, 0.998])
    words = helpers.bucket_words(FASTER, near)
    assert "the whole step with 1 MiB buckets was 0.92 times as fast as with one bucket " \
           "(0.81-0.998)" in words
    assert "0.81-1.00" not in words
    assert "times the exposed all-reduce of 1 MiB buckets (0.81-0.998: " in \
        helpers.bucket_words(near, NOISE)
    noise = helpers.bucket_words(FASTER, helpers.Ratio([0.81, 0.92, 1.003]))
    assert "could not be told apart (the step with 1 MiB buckets was 0.92 times as fast as " \
           "with one bucket (0.81-1.003))" in noise
    knob = helpers.knob_words(NOISE, 12.0, helpers.Ratio([0.85, 0.92, 1.004]))
    assert "the step 0.92 times as fast as the default's, 0.85-1.004, " in knob
    assert "the default's was 0.90-1.30 times it per round" in knob
    closer = helpers.bucket_words(FASTER, helpers.Ratio([0.81, 0.92, 0.9996]))
    assert "(0.81-0.9996)" in closer, "as many decimals as it takes, not just three"


def test_a_cause_is_named_only_from_a_resolved_ratio_and_its_measured_split():
    assert helpers.message_cause(FASTER, 8.03, 8.23).startswith("about all of the 8.03 ms")
    assert helpers.message_cause(FASTER, 8.0, 6.0).startswith("6.00 ms of the 8.00 ms")
    assert "names no cause" in helpers.message_cause(FASTER, 8.0, 1.0)
    assert "resolved no difference" in helpers.message_cause(NOISE, 8.0, 8.2)
    assert {helpers.overlap_step_words(r) for r in (FASTER, SLOWER, NOISE, ONE)} == {
        "faster than", "slower than", "within noise of", "not told apart (one round) from"}


def test_the_profile_share_is_read_as_arithmetic_on_a_cpu_and_as_launches_on_a_gpu():
    words = helpers.arithmetic_share_words
    assert "the convolutions and the elementwise work" in words({"a": 0.77, "b": 0.78}, False)
    apart = words({"a": 0.55, "b": 0.95}, False)   # both over half, far apart: not "the same"
    assert "not about the same share (55% against 95%)" in apart
    assert "about the same share on" not in apart and "does not show" in apart
    low = words({"a": 0.3, "b": 0.6}, False)
    assert "more than half for one step and less for the other" in low
    assert "does not show the arithmetic to be the step" in low
    assert "less than half of it" in words({"a": 0.3, "b": 0.4}, True)
    assert "more than half of it" in words({"a": 0.7, "b": 0.6}, True)
    with pytest.raises(ValueError, match="between 0 and 1"):
        words({"a": 77.0}, False)


def test_shared_rounding_has_three_branches_and_refuses_nonsense():
    words = helpers.shared_rounding_words
    assert "mostly the same rounding" in words(1e-8, 1e-6)
    assert "share part of their rounding" in words(5e-7, 1e-6)
    assert "different places" in words(2e-6, 1e-6)
    assert "different places" in words(1e-6, 1e-6)    # the boundary goes to the weaker words
    with pytest.raises(ValueError, match="rounding error > 0"):
        words(1e-8, 0.0)
