"""Part I's split words (helpers/pipeline_parallel/split_words.py, helpers/tensor_parallel/
split_words.py) and the count of times in words.py: each branch."""
import pytest

import helpers
from helpers.pipeline_parallel.split_words import (
    bubble_vs_formula_words,
    devices_words,
    mac_bubble_words,
    simulated_timing_words,
    stage_layers_words,
)
from helpers.tensor_parallel.split_words import bytes_vs_dp_words, paired_vs_column_words
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


def test_stage_layers_words_three_branches():
    names, macs = ["Conv2d", "ReLU", "AvgPool2d"], [121680, 0, 0]
    group, said = stage_layers_words(names, [8.5, 1.5, 1.2], macs)
    assert group == "counted" and said == (
        " Timed alone, one layer at a time, its Conv2d layer took 76% of the stage's time and its "
        "AvgPool2d and ReLU layers 24%: most of the time went to the layer that does the "
        "multiply-adds, not to the layers that count none.")
    group, said = stage_layers_words(names, [1.0, 1.5, 1.2], macs)
    assert group == "uncounted" and "27% of the stage's time" in said
    assert said.endswith("most of the time went to layers that count no multiply-adds.")
    group, said = stage_layers_words(names, [1.5, 1.5, 0.2], macs)
    assert group == "both" and said.endswith("split between the two kinds of layer.")
    # one kind of layer only: its share, no comparison
    assert stage_layers_words(["Conv2d", "Linear"], [1, 2], [5, 6]) == (
        "counted", " Timed alone, one layer at a time, its Conv2d and Linear layers took 100% "
                   "of the stage's time.")
    assert stage_layers_words(["ReLU"], [1], [0])[0] == "uncounted"
    with pytest.raises(ValueError):
        stage_layers_words(names, [0, 0, 0], macs)


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


@pytest.mark.parametrize("paired, column, start", [
    (29_160, 25_878, "more, 113% of the column split's bytes: a row split"),   # LeNet, k = 4
    (20_000, 25_000, "less, 80% of the column split's bytes"),
    (25_000, 25_000, "as much as the column split"),
])
def test_paired_vs_column_words_three_branches(paired, column, start):
    words = paired_vs_column_words(paired, column)
    assert words.startswith(start)
    assert ("before the ReLU" in words) == (paired > column), "the cause only where it sends more"


def test_how_often():
    assert how_often(1) == "once"
    assert how_often(2) == "2 times"
    assert how_often(0) == "0 times"


@pytest.mark.parametrize("one, naive, start", [
    ([5, 6], [3, 4], "faster than one device in every run"),
    ([3, 4], [5, 6], "slower than one device in every run"),
    ([3, 5], [4, 6], "within noise of one device"),
])
def test_naive_order_words_three_branches(one, naive, start):
    words = helpers.naive_order_words(one, naive)
    assert words.startswith(start)
    assert "at once" not in words or "not devices working at once" in words
    assert "caus" not in words or "possible cause, not measured" in words


def test_naive_order_words_needs_runs():
    with pytest.raises(ValueError):
        helpers.naive_order_words([], [1.0])
