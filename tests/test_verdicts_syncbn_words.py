"""Part III's SyncBatchNorm words (helpers/data_parallel/words/syncbn_words.py): each branch, from
the gaps and the cost ratios that choose it, a one-round ratio ("cannot tell") included."""
import statistics

import pytest

from helpers.data_parallel.words.syncbn_words import (
    comm_resolved_words,
    cost_words,
    found_words,
    long_run_words,
    paired_accuracy_words,
    paired_difference_se,
    resolved_words,
)
from helpers.timing import Ratio

COST, SAVING, NOISE, ONE = (Ratio(s) for s in ([1.6, 1.65, 1.7], [0.7, 0.8, 0.9],
                                                [0.9, 1.1, 1.3], [1.8]))


@pytest.mark.parametrize("control, words", [
    ((0.05, 0.05), "larger than the per-device gap"),
    ((0.01, 0.01), "of the same order as the per-device gap"),
    ((0.001, 0.001), "far below the per-device gap"),
])
def test_long_run_words_against_the_control(control, words):
    said = long_run_words((0.034, 0.05), (0.012, 0.02), control)
    assert said.startswith(words)
    bn_x = 0.034 / control[0]
    assert f"the per-device run ends {bn_x:.1f} times as far from one process" in said


@pytest.mark.parametrize("r, word", [
    (COST, "a cost"), (SAVING, "a saving"), (NOISE, "within noise"),
    (ONE, "cannot tell (one round, no spread)"),
])
def test_cost_words_every_verdict(r, word):
    assert cost_words(r) == f"{r.median:.2f}x ({r.lo:.2f}-{r.hi:.2f}): {word}"


def test_resolved_words():
    assert resolved_words(COST, "the collectives") == "the collectives added 65 % to a step"
    assert resolved_words(SAVING, "the collectives") == ("the collectives made a step faster "
                                                         "(unexpected)")
    assert resolved_words(NOISE, "the collectives") is None
    assert resolved_words(ONE, "the collectives") is None


def test_found_words_lists_what_resolved_in_order():
    cost = {"16 a rank": dict(comm=NOISE, impl=COST), "2 a rank": dict(comm=COST, impl=ONE)}
    assert found_words(cost) == ("at 16 a rank, the Python implementation added 65 % to a "
                                 "step; at 2 a rank, the collectives added 65 % to a step")
    both = {"16 a rank": dict(comm=COST, impl=COST), "2 a rank": dict(comm=NOISE, impl=ONE)}
    assert found_words(both) == ("at 16 a rank, the collectives added 65 % to a step and the "
                                 "Python implementation added 65 % to a step")
    nothing = {"16 a rank": dict(comm=NOISE, impl=ONE), "2 a rank": dict(comm=ONE, impl=NOISE)}
    assert found_words(nothing).startswith("no ratio resolved")


@pytest.mark.parametrize("big, tiny, words", [
    (COST, COST, "resolved at both batches"),
    (NOISE, ONE, "not resolved at either batch"),
    (NOISE, COST, "resolved at 2 images a rank, not at 16 images a rank"),
    (COST, ONE, "resolved at 16 images a rank, not at 2 images a rank"),
])
def test_comm_resolved_words(big, tiny, words):
    cost = {"16 a rank": dict(comm=big, impl=COST), "2 a rank": dict(comm=tiny, impl=COST)}
    assert comm_resolved_words(cost) == words


def _images(both, only_bn, only_sync, neither):
    """Per-image truth values of two models scored on the same images."""
    bn = [1] * both + [1] * only_bn + [0] * only_sync + [0] * neither
    sync = [1] * both + [0] * only_bn + [1] * only_sync + [0] * neither
    return bn, sync


def test_paired_se_is_the_spread_of_the_per_image_differences():
    bn, sync = _images(280, 35, 23, 71)
    d = [s - b for b, s in zip(bn, sync)]
    assert paired_difference_se(bn, sync) == pytest.approx(
        statistics.pstdev(d) / len(d) ** 0.5, rel=1e-12)


def test_paired_se_is_smaller_than_the_unpaired_one_when_the_models_agree():
    bn, sync = _images(300, 5, 3, 101)
    n, p_bn, p_sync = len(bn), sum(bn) / len(bn), sum(sync) / len(sync)
    unpaired = ((p_bn * (1 - p_bn) + p_sync * (1 - p_sync)) / n) ** 0.5
    assert paired_difference_se(bn, sync) < 0.3 * unpaired
    assert paired_difference_se(bn, bn) == 0


def test_paired_se_refuses_different_images():
    with pytest.raises(ValueError, match="the same images"):
        paired_difference_se([1, 0], [1])
    with pytest.raises(ValueError):
        paired_difference_se([], [])


def test_paired_accuracy_words_give_the_counts_and_no_verdict():
    bn, sync = _images(280, 35, 23, 71)
    said = paired_accuracy_words(bn, sync)
    assert "On the same 409 test images" in said
    assert f"{100 * (23 - 35) / 409:+.1f} points" in said
    assert "35 images right only per-device, 23 only with SyncBatchNorm" in said
    assert f"about {100 * paired_difference_se(bn, sync):.1f} points" in said
    assert "no verdict" in said and "seed" in said
    same = paired_accuracy_words(bn, bn)
    assert "exactly the same images right" in same and "seed" in same
