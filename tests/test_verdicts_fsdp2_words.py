"""Part V's FSDP2 words (helpers/sharding/fsdp2_words.py): a checkpointed step against the plain
one, each verdict from timings, the recomputation named as the cost only where it was slower."""
import pytest

from helpers.sharding.fsdp2_words import checkpoint_time_words
from helpers.timing import Measurement, Ratio, ratio

RECOMPUTE = "backward runs every block's forward again"


def timed(plain_s, checkpointed_s):
    """The ratio the chapter takes of interleave's Measurements, round by round."""
    return ratio(Measurement(plain_s), Measurement(checkpointed_s))


@pytest.mark.parametrize("ckpt, opens", [
    ([1.3, 1.35, 1.4], "slower (1.35 times the plain step's time, the median of 3 rounds"),
    ([0.8, 0.85, 0.9], "faster (0.85 times the plain step's time"),
    ([0.9, 1.05, 1.2], "within noise of the plain step (1.05 times its time, from 0.90 to "
                       "1.20 over 3 rounds"),
])
def test_checkpoint_time_words_three_verdicts(ckpt, opens):
    said = checkpoint_time_words(timed([1.0] * len(ckpt), ckpt))
    assert said.startswith(opens)
    # the recomputation is the cost only where the step was measured slower
    assert (f"): {RECOMPUTE}" in said) == opens.startswith("slower")
    assert RECOMPUTE in said


def test_faster_names_no_cause():
    said = checkpoint_time_words(timed([1.0] * 3, [0.8, 0.85, 0.9]))
    assert said.endswith("this run does not say why")


def test_one_round_cannot_tell():
    said = checkpoint_time_words(Ratio([1 / 1.3]))
    assert said == ("not told apart from the plain step (1.30 times its time in one round, "
                    "which has no spread)")
