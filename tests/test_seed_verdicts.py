"""The DataParallel chapter's accuracy verdicts over seeds
(helpers/data_parallel/words/seed_verdicts.py): every paired gap must clear the margin, each
sentence branch is reached, and the chance level is what three fair coins give."""
import pytest

import helpers
from helpers.data_parallel.words.seed_verdicts import sign_chance, unseparated_words


def test_every_gap_must_clear_the_margin():
    # the stored LeNet run's scaled-against-unscaled gaps: 0.124, 0.052, 0.003
    one_small = ([0.710, 0.689, 0.663], [0.586, 0.637, 0.660])
    assert helpers.paired_verdict(*one_small) == "not separated on every seed from"
    assert helpers.paired_verdict(*one_small, margin=0.002) == "above"
    assert helpers.paired_verdict([0.2, 0.3], [0.5, 0.4]) == "below"
    assert helpers.paired_verdict([0.5, 0.2], [0.4, 0.3]) == "not separated on every seed from"
    # one sign throughout but a mean gap far above the margin is not enough
    assert helpers.paired_verdict([0.9, 0.501], [0.5, 0.5]) == "not separated on every seed from"


def test_paired_verdict_refuses_what_does_not_pair():
    with pytest.raises(ValueError, match="2 accuracies against 3"):
        helpers.paired_verdict([0.1, 0.2], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="0 accuracies against 0"):
        helpers.paired_verdict([], [])
    with pytest.raises(ValueError, match="margin must be >= 0"):
        helpers.paired_verdict([0.1], [0.2], margin=-0.1)


def test_sign_chance_is_two_in_two_to_the_seeds():
    assert sign_chance(3) == 0.25
    assert sign_chance(5) == 1 / 16
    assert sign_chance(1) == 1.0
    assert helpers.chance_words(3) == "1 in 4"
    assert helpers.chance_words(11) == "1 in 1,024"
    with pytest.raises(ValueError, match="seeds must be at least 1"):
        sign_chance(0)
    for bad in (2.0, "3", True):
        with pytest.raises(TypeError, match="seeds must be a whole number"):
            sign_chance(bad)


ONE = [0.70, 0.70, 0.70]
SAME = [0.60, 0.60, 0.60]


def test_scaled_rate_verdict_has_a_sentence_per_branch():
    no_help = helpers.scaled_rate_verdict(ONE, SAME, [0.70, 0.70, 0.603])
    assert "did not clearly help" in no_help and "does not measure why" in no_help
    assert "more than made up" in helpers.scaled_rate_verdict(ONE, SAME, [0.75] * 3)
    split = helpers.scaled_rate_verdict(ONE, SAME, [0.72, 0.68, 0.70])
    assert "the seeds disagree: 1 seed put the doubled batch above the 1-device run" in split
    assert "1 below it, 1 within it" in split and "no seed separates" not in split
    near = helpers.scaled_rate_verdict(ONE, SAME, [0.70, 0.702, 0.698])
    assert "no seed separates the doubled batch from the 1-device run" in near
    most = helpers.scaled_rate_verdict(ONE, SAME, [0.68] * 3)
    assert "won back 80 %" in most and "most of the gap" in most
    part = helpers.scaled_rate_verdict(ONE, SAME, [0.63] * 3)
    assert "won back 30 %" in part and "part of the gap" in part


def test_equal_steps_verdict_has_a_clause_per_branch():
    a1, a2 = [0.7] * 3, [0.3] * 3
    assert "did not clearly close" in helpers.equal_steps_verdict(a1, a2, [0.3, 0.9, 0.9])
    assert "does better than the first run" in helpers.equal_steps_verdict(a1, a2, [0.8] * 3)
    split = helpers.equal_steps_verdict(a1, a2, [0.6, 0.8, 0.7])
    assert "not clearly above or below the first run: the seeds disagree: 1 seed put" in split
    assert split.startswith("the third run agrees with that reading: given as many steps")
    assert "no seed separates" not in split
    some = helpers.equal_steps_verdict(a1, a2, [0.7, 0.8, 0.9])
    assert "1 of the 3 seeds does not separate the doubled batch from the first run" in some
    most = helpers.equal_steps_verdict(a1, a2, [0.6] * 3)
    assert "recovers most of the gap (75 % on average)" in most
    part = helpers.equal_steps_verdict(a1, a2, [0.4] * 3)
    assert "recovers part of the gap (25 %" in part and "that reading in part:" in part
    assert "in part" not in most


def test_unseparated_words_name_what_kept_the_seeds_apart():
    """The stored run that read 'no seed separates' had gaps -0.033, +0.275, +0.018."""
    words = unseparated_words([0.709, 0.691, 0.641], [0.742, 0.416, 0.623], "a", "b")
    assert words == "the seeds disagree: 2 seeds put a above b by more than the margin, 1 below it"
    assert unseparated_words([0.5] * 2, [0.501] * 2, "a", "b") == \
        "no seed separates a from b by the margin"


def test_chance_level_words_name_the_seeds_still_at_chance():
    from helpers.data_parallel.words.seed_verdicts import chance_level_words
    # the stored ResNet run: one seed of batch 512 at 0.103 after 3 epochs, 819 test images
    settings = {"batch 256": [0.674, 0.418, 0.49], "batch 512, doubled rate": [0.403, 0.103, 0.3]}
    said = chance_level_words(settings, 819)
    assert said.startswith("One seed had not left chance level")
    assert "batch 512, doubled rate: 0.103" in said and "819 test images" in said
    assert chance_level_words({"a": [0.5, 0.6]}, 819) == (       # none: said so
        "No seed was left at chance level (within 3 standard errors of chance, 0.1, over 819 "
        "test images).")
    two = chance_level_words({"a": [0.11], "b": [0.09, 0.7]}, 819)
    assert two.startswith("2 seeds had not left") and "a: 0.110; b: 0.090" in two
    # 3 standard errors of a chance-level accuracy over 819 images: 0.031
    assert chance_level_words({"a": [0.135]}, 819).startswith("No seed")
    assert chance_level_words({"a": [0.125]}, 819).startswith("One seed")
    with pytest.raises(ValueError, match="need test images"):
        chance_level_words({"a": [0.1]}, 0)
