"""Part I's model-against-run words (helpers/model_words.py): each branch from the numbers that
choose it."""
import pytest

from helpers.model_words import (
    comm_inside_step_words,
    fit_words,
    largest_miss,
    last_bucket_words,
    load_words,
    spread_verdict,
    sweep_memory_words,
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


KS = [1, 2, 3, 4, 5]
FALLING = [900e6, 500e6, 400e6, 350e6, 320e6]


def test_sweep_memory_falling_for_every_split():
    assert sweep_memory_words(KS, {"data": FALLING, "ZeRO-3": [x / 2 for x in FALLING]}) == \
        "falling with k for every split"


def test_sweep_memory_names_the_split_that_stays_flat_and_where():
    flat = [900e6, 550e6, 413.4e6, 413.4e6, 413.4e6]
    said = sweep_memory_words(KS, {"data": FALLING, "network": flat})
    assert said == ("falling with k for every split but the network split, whose fullest "
                    "device stays at 413.4 MB from k = 3 on")
    # on the floor given for it: the layer it cannot cut is named; off it, not
    on_floor = sweep_memory_words(KS, {"data": FALLING, "network": flat},
                                  floors={"network": 413.4e6})
    assert on_floor.endswith("from k = 3 on (a single top-level layer, the heaviest: a split "
                             "across layers cannot cut it)")
    assert "cannot cut" not in sweep_memory_words(KS, {"network": flat},
                                                  floors={"network": 300e6})
    middle = [900e6, 500e6, 500e6, 400e6, 300e6]
    assert sweep_memory_words(KS, {"within layer": middle}).endswith(
        "the within-layer split, whose fullest device stays at 500.0 MB from k = 2 to 3")


def test_sweep_memory_names_every_flat_split():
    said = sweep_memory_words(KS, {"network": [9e8, 5e8, 5e8, 5e8, 5e8],
                                   "ZeRO-1": [9e8, 8e8, 7e8, 7e8, 6e8]})
    assert said == ("falling with k for every split but the network split and ZeRO-1, whose "
                    "fullest devices stop falling: the network split stays at 500.0 MB from "
                    "k = 2 on; ZeRO-1 stays at 700.0 MB from k = 3 to 4")


def test_sweep_memory_growing_is_not_called_falling():
    said = sweep_memory_words(KS, {"data": FALLING, "network": [9e8, 5e8, 5e8, 6e8, 4e8]})
    assert said == ("not falling with k for every split: the network split's fullest device "
                    "grows from 500.0 MB at k = 3 to 600.0 MB at k = 4")


def test_sweep_memory_refuses_a_short_row():
    with pytest.raises(ValueError, match="3 memories for 5 values of k"):
        sweep_memory_words(KS, {"data": FALLING[:3]})


def test_last_bucket_at_once_or_queued():
    at_once = dict(complete=1.0, start=1.0, end=1.2)
    assert last_bucket_words(at_once, 1.0, 2e-3) == (
        "the last one, 0.40 ms, starts as soon as the backward ends")
    queued = dict(complete=1.0, start=1.5, end=1.65)
    assert last_bucket_words(queued, 1.0, 2e-3) == (
        "the last one, 0.30 ms, cannot start before the backward ends, and here starts 1.00 ms "
        "after it, behind the buckets queued before it")


def test_last_bucket_ready_before_the_end_is_refused():
    with pytest.raises(ValueError, match="it is not the last"):
        last_bucket_words(dict(complete=0.9, start=0.9, end=1.0), 1.0, 2e-3)
