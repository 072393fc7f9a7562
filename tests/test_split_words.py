"""Part I's network-split words (helpers/pipeline_parallel/split_words.py): each branch."""
from helpers.pipeline_parallel.split_words import mac_bubble_words, simulated_timing_words


def test_mac_bubble_words_three_branches():
    assert mac_bubble_words(0.20, 0.30)[0] == "lower"
    assert "faster per multiply-add" in mac_bubble_words(0.20, 0.30)[1]
    word, why = mac_bubble_words(0.40, 0.30, {"ReLU", "MaxPool2d"})
    assert word == "higher"
    assert "its MaxPool2d and ReLU layers count none but take time" in why
    assert "this run does not time the layers apart" in why
    assert mac_bubble_words(0.31, 0.30) == ("about the same", ", about its share of the work")


def test_higher_without_free_layers_names_none():
    word, why = mac_bubble_words(0.40, 0.30)
    assert word == "higher" and "count none" not in why


def test_simulated_timing_words():
    assert "take turns on one processor" in simulated_timing_words(True)
    assert "one Python thread issues the work" in simulated_timing_words(False)
