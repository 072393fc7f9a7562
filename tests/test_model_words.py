"""Part I's model-against-run words (helpers/model_words.py): each branch from the numbers that
choose it."""
import pytest

from helpers.model_words import (
    comm_inside_step_words,
    fit_words,
    largest_miss,
    load_words,
    spread_verdict,
)


@pytest.mark.parametrize("predicted, words", [
    (0.040, "shorter than every measured step"),
    (0.070, "longer than every measured step"),
    (0.050, "within the measured spread"),
    (0.0439, "within the measured spread"),     # the ends are inside
])
def test_spread_verdict_three_branches(predicted, words):
    assert spread_verdict(predicted, [0.0608, 0.0439, 0.0527]) == words


def test_largest_miss_is_in_time_not_in_ratio():
    # the all-reduce misses 13x but by 6 ms; the compute by 1.05x but by 10 ms
    measured = {"compute": 0.210, "all-reduce": 0.0065}
    predicted = {"compute": 0.200, "all-reduce": 0.0005}
    assert largest_miss(measured, predicted) == "compute"


def test_comm_about_alone_names_no_wait():
    assert comm_inside_step_words(0.0009, 0.0005, 0.0003, [0.9]) == "about as long as alone"


def test_comm_names_the_wait_only_when_it_covers_every_repeat():
    said = comm_inside_step_words(0.0064, 0.0005, 0.0032, [0.85, 0.9, 0.95])
    assert "12.8 times as long as alone" in said and "waited 3.2 ms" in said
    assert "85% or more of it in every repeat: the all-reduce waited for the slower" in said
    said = comm_inside_step_words(0.0064, 0.0005, 0.0032, [0.2, 0.3, 0.45])
    assert "45% of it at most" in said and "does not say what took the rest" in said
    said = comm_inside_step_words(0.0064, 0.0005, 0.0032, [0.86, 0.5, 0.58])
    assert "58% of it (median; 50% to 86% over the repeats)" in said
    assert "waited for the slower" not in said


def test_comm_without_repeats_is_refused():
    with pytest.raises(ValueError, match="at least one repeat"):
        comm_inside_step_words(0.0064, 0.0005, 0.0032, [])


def test_fit_words():
    assert fit_words(0.000498, 0.0005) == "the fit goes through it"
    assert "the fit gives 0.60 ms" in fit_words(0.0006, 0.0005)


def test_load_words_for_the_whole_machine_or_unknown():
    assert load_words(0.5, 4) == "2.0"       # per core, times the cores
    assert load_words(None, 4) == "unknown"  # no load average on this system
