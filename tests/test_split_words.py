"""Part I's split words (helpers/pipeline_parallel/split_words.py, helpers/tensor_parallel/
split_words.py) and the count of times in words.py: each branch."""
import pytest

from helpers.pipeline_parallel.split_words import (
    bubble_vs_formula_words,
    devices_words,
    mac_bubble_words,
    simulated_timing_words,
)
from helpers.tensor_parallel.split_words import bytes_vs_dp_words
from helpers.words import how_often


def test_mac_bubble_words_three_branches():
    assert mac_bubble_words(0.20, 0.30)[0] == "lower"
    assert "faster per multiply-add" in mac_bubble_words(0.20, 0.30)[1]
    word, why = mac_bubble_words(0.40, 0.30)
    assert word == "higher"
    assert why == ": its operations ran slower per multiply-add than the larger stage's"
    assert mac_bubble_words(0.31, 0.30) == ("about the same", ", about its share of the work")


def test_higher_names_no_cause_the_run_did_not_time():
    """The run times stages, not layers: no layer type is named as what took the time."""
    for _, why in (mac_bubble_words(0.40, 0.30), mac_bubble_words(0.20, 0.30)):
        assert "layers" not in why and "ReLU" not in why and "Pool" not in why


def test_simulated_timing_words():
    assert "take turns on one processor" in simulated_timing_words(True)
    assert "one Python thread issues the work" in simulated_timing_words(False)


@pytest.mark.parametrize("lo, hi, word", [
    (0.47, 0.49, "larger"),                          # every run above the formula's 0.20
    (0.10, 0.15, "smaller"),                         # every run below it
    (0.15, 0.25, "not clearly larger or smaller"),   # the runs' range holds it
])
def test_bubble_vs_formula_words_three_branches(lo, hi, word):
    assert bubble_vs_formula_words(lo, hi, 0.20) == word


def test_devices_words():
    assert devices_words(True) == "simulated on one processor"
    assert devices_words(False) == "real, separate devices"


@pytest.mark.parametrize("split, dp, word", [
    (1_241_664, 774_408, "more"),
    (500_000, 774_408, "less"),
    (774_408, 774_408, "neither more nor less"),
])
def test_bytes_vs_dp_words_three_branches(split, dp, word):
    assert bytes_vs_dp_words(split, dp) == word


def test_how_often():
    assert how_often(1) == "once"
    assert how_often(2) == "2 times"
    assert how_often(0) == "0 times"
