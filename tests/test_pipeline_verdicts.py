"""The pipeline chapter's words (helpers/pipeline_parallel/verdicts.py): each branch of each
sentence is reached from the numbers that should reach it, and what cannot be judged is
refused."""
import pytest

import helpers


def test_the_bubble_shrinks_only_by_more_than_the_margin():
    assert helpers.bubble_trend_words(0.60, 0.30) == "shrinks"
    assert helpers.bubble_trend_words(0.60, 0.56) == "does not shrink"     # within 0.05
    assert helpers.bubble_trend_words(0.30, 0.40) == "does not shrink"     # it grew
    assert helpers.bubble_trend_words(0.60, 0.56, margin=0.01) == "shrinks"


def test_schedule_gap_against_the_spread_of_the_repeats():
    gpipe = [(0.50, 0.45, 0.60), (0.30, 0.28, 0.33)]
    close = [(0.52, 0.50, 0.55), (0.29, 0.27, 0.31)]
    gap, words = helpers.schedule_gap(gpipe, close)
    assert gap == pytest.approx(0.02) and words == "within the spread of the repeats"
    far = [(0.80, 0.79, 0.81), (0.30, 0.29, 0.31)]
    tight = [(0.50, 0.49, 0.51), (0.30, 0.29, 0.31)]
    gap, words = helpers.schedule_gap(tight, far)
    assert gap == pytest.approx(0.30) and words == "more than the spread of the repeats"


def test_schedule_gap_refuses_unpaired_counts():
    with pytest.raises(ValueError, match="2 micro-batch counts against 1"):
        helpers.schedule_gap([(0.5, 0.4, 0.6)] * 2, [(0.5, 0.4, 0.6)])
    with pytest.raises(ValueError, match="0 micro-batch counts against 0"):
        helpers.schedule_gap([], [])


def test_the_delay_is_the_messages_or_a_core():
    # 16 messages of 0.1 ms one way: 1.6 ms against a 10 ms delay: the process waited
    assert helpers.message_delay_words(1e-4, 16, 0.010) == \
        "most of the delay is the receiving process waiting for a core"
    # against a 2 ms delay the messages are most of it
    assert helpers.message_delay_words(1e-4, 16, 0.002) == \
        "much of the delay is the messages themselves"
    assert helpers.message_delay_words(1e-4, 16, 0.0032) == \
        "much of the delay is the messages themselves"       # exactly half: not under it


@pytest.mark.parametrize("verdict,start", [
    ("faster", "faster with the cut by time"),
    ("slower", "slower with the cut by time (the model gives"),
    ("within noise", "too close to tell apart"),
])
def test_balance_words_name_each_verdict(verdict, start):
    assert helpers.balance_words(verdict).startswith(start)


def test_balance_words_refuse_what_ratio_never_says():
    with pytest.raises(ValueError, match="one of"):
        helpers.balance_words("cannot tell")
