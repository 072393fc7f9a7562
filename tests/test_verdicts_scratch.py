"""Part II's run words (helpers/data_parallel/words/scratch_verdicts.py): each branch, from the
numbers that choose it."""
import math

import pytest

from helpers.data_parallel.words.scratch_verdicts import (
    PLATEAU,
    accuracy_gap_words,
    epoch_speed_words,
    take_off,
    takeoff_words,
)

CHANCE = math.log(10)


def plateau_then(drop_at, n=60):
    """Losses at chance until step `drop_at` (None: never), then well below the plateau."""
    return [CHANCE if drop_at is None or i < drop_at else 1.0 for i in range(n)]


def test_take_off_is_the_first_window_below_the_plateau():
    assert take_off(plateau_then(None)) is None
    assert take_off(plateau_then(0)) == 10
    # the window averages: 3 low steps of 10 are not enough, 10 of them are
    at = take_off(plateau_then(20))
    assert at is not None and 20 < at <= 30
    window = plateau_then(20)[at - 10:at]
    assert sum(window) / 10 < PLATEAU
    assert sum(plateau_then(20)[at - 11:at - 1]) / 10 >= PLATEAU


@pytest.mark.parametrize("one, two, words", [
    (None, None, "neither left the plateau within its 60 steps"),
    (20, None, "only the run on one device left the plateau"),
    (None, 20, "only the run on two devices left the plateau"),
    (20, 20, "the rounding did not move the take-off"),
    (20, 35, "moved the take-off by 15 steps"),
])
def test_takeoff_words_branch_on_when_each_run_left(one, two, words):
    assert words in takeoff_words(plateau_then(one), plateau_then(two))


@pytest.mark.parametrize("one, two, words", [
    # the seeds disagree in sign: not separated, whatever one seed's gap
    ([0.745, 0.730, 0.751], [0.734, 0.741, 0.752], "These runs cannot tell the two apart"),
    ([0.745, 0.730, 0.751], [0.760, 0.741, 0.762], "two devices ended above one on every seed"),
    ([0.745, 0.730, 0.751], [0.734, 0.720, 0.740], "two devices ended below one on every seed"),
])
def test_accuracy_gap_words_three_branches_over_seeds(one, two, words):
    said = accuracy_gap_words(one, two)
    assert words in said and "Over 3 seeds" in said
    assert "seeds of one setting lie up to 0.021 apart" in said   # the measured spread
    if "every seed" in said:   # the rule's chance, and no claim the runs differ for sure
        assert "1 in 4 times" in said and "more seeds would tell" in said


def test_one_seed_gap_is_no_verdict():
    # the stored run: one seed each, a gap of 0.011, once read as "agree closely" on a fixed
    # threshold; one seed has no spread to set a gap against
    with pytest.raises(ValueError, match="at least two seeds"):
        accuracy_gap_words([0.745], [0.734])
    with pytest.raises(ValueError):
        accuracy_gap_words([0.745, 0.73], [0.734])


@pytest.mark.parametrize("t1, t2, word", [
    ([6.3, 6.5, 6.8], [6.5, 6.6, 6.8], "so this run cannot tell them apart"),
    ([6.3, 6.5, 6.8], [3.0, 3.1, 3.2], "faster than one in every epoch"),
    ([3.0, 3.1, 3.2], [6.3, 6.5, 6.8], "slower than one in every epoch"),
])
def test_epoch_speed_words_three_branches(t1, t2, word):
    said = epoch_speed_words([t1], [t2], simulated=False)
    assert word in said and said.startswith("Both devices were real GPUs")
    # the medians come with the verdict, never before it
    assert f"{sorted(t2)[1]:.2f} s an epoch (median" in said


# the stored run's shape: seed 0 slower on two devices in every epoch, the other two seeds
# the other way round or overlapping; one seed's verdict must not speak for all
ONE = [[9.84, 9.99, 10.31], [11.4, 11.46, 11.5], [10.1, 10.14, 10.2]]
SLOWER_0 = [[10.36, 10.37, 11.0], [11.2, 11.25, 11.3], [10.05, 10.12, 10.3]]


@pytest.mark.parametrize("t1, t2, word", [
    (ONE, SLOWER_0, "the seeds disagree"),
    (ONE, [[t + 5 for t in ts] for ts in ONE], "slower than one in every epoch on every seed"),
    (ONE, [[t - 5 for t in ts] for ts in ONE], "faster than one in every epoch on every seed"),
    (ONE, [[t + 0.01 for t in ts] for ts in ONE], "the epochs' ranges overlap on every seed"),
])
def test_epoch_speed_words_pools_every_seed(t1, t2, word):
    said = epoch_speed_words(t1, t2, simulated=False)
    assert word in said
    if "disagree" in said or "overlap" in said:
        assert "cannot tell them apart" in said and "faster than" not in said \
            and "slower than" not in said
    # medians and ranges pooled over every seed's epochs
    pooled_1 = sorted(t for ts in t1 for t in ts)
    assert f"against one device's {pooled_1[len(pooled_1) // 2]:.2f} s" in said
    assert f"({pooled_1[0]:.2f} to {pooled_1[-1]:.2f})" in said
    assert "over 9 epochs each from 3 seeds" in said


def test_epoch_speed_words_counts_each_seeds_verdict():
    said = epoch_speed_words(ONE, SLOWER_0, simulated=False)
    assert "1 faster, 1 slower, 1 overlapping" in said


def test_epoch_speed_words_needs_seeds_paired():
    with pytest.raises(ValueError):
        epoch_speed_words(ONE, SLOWER_0[:2], simulated=False)


def test_simulated_pair_says_it_shows_correctness_not_speed():
    said = epoch_speed_words([[6.3, 6.5]], [[3.0, 3.1]], simulated=True)
    assert "simulated on one device" in said and "in two halves, one after the other" in said
    assert "say nothing about parallel speed" in said and "correctness" not in said
    # two half-size shards in turn: not one device's arithmetic
    assert "the same arithmetic in two halves" in said
    assert "one device's arithmetic" not in said


def test_no_epochs_is_refused():
    with pytest.raises(ValueError, match="at least one timed epoch"):
        epoch_speed_words([[]], [[1.0]], simulated=True)
    with pytest.raises(ValueError, match="at least one timed epoch"):
        epoch_speed_words([], [], simulated=True)
