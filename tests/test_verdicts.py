"""Part IV's sentences from its measurements (helpers/data_parallel/words/verdicts.py): every
verdict gets its own words, and a cause is named only where the ratio is resolved."""
import pytest
import torch

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


def _errors_sharing(share, seed):
    """Two error vectors a = s + n1, b = s + n2 whose shared part s makes up `share` of each
    one's square (n1, n2 independent): what two float32 results sharing that much rounding miss."""
    g = torch.Generator().manual_seed(seed)
    s, n1, n2 = (torch.randn(20_000, generator=g, dtype=torch.float64) for _ in range(3))
    a = share ** 0.5 * s + (1 - share) ** 0.5 * n1
    b = share ** 0.5 * s + (1 - share) ** 0.5 * n2
    return (a @ b / (a.norm() * b.norm())).item()


@pytest.mark.parametrize("share, words", [
    (0.9, "they share most of their rounding"),
    (0.6, "they share most of their rounding"),
    (0.3, "share part of their rounding, not most of it"),
    (0.0, "they round in different places"),
])
def test_shared_rounding_words_follow_the_shared_part_of_the_errors(share, words):
    cosines = [_errors_sharing(share, seed) for seed in range(5)]
    said = helpers.shared_rounding_words(cosines)
    assert words in said and "over 5 states" in said


def test_shared_rounding_words_read_the_stored_syncbn_figures_as_mostly_shared():
    # median errors against float64: SyncBatchNorm 1.1e-5, one process in float32 1.5e-5, and
    # 7.3e-6 between them: cos = (a**2 + b**2 - apart**2) / (2ab) = 0.89, far closer than
    # independent roundings (sqrt(a**2 + b**2) = 1.9e-5 apart); "part, not most" misread it
    a, b, apart = 1.1e-5, 1.5e-5, 7.3e-6
    cos = (a * a + b * b - apart * apart) / (2 * a * b)
    assert cos == pytest.approx(0.89, abs=0.01)
    said = helpers.shared_rounding_words([cos])
    assert "share most of their rounding" in said and "median cosine 0.89" in said
    assert "not most" not in said


def test_shared_rounding_words_boundaries_and_refusals():
    words = helpers.shared_rounding_words
    assert "share most" in words([0.5])
    assert "share part" in words([0.49]) and "share part" in words([0.1])
    assert "different places" in words([0.09]) and "different places" in words([-0.8])
    # the median over the states decides, not one state
    assert "share most" in words([0.0, 0.9, 0.95])
    for bad in ([], [1.5], [float("nan")]):
        with pytest.raises(ValueError, match="between -1 and 1"):
            words(bad)
