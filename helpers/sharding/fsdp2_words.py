"""Part V's words for the FSDP2 chapter: what timing activation checkpointing in turns with the
plain step showed, with a sentence for each verdict, "cannot tell" (one round) included, and the
recomputation named as the cost only where the checkpointed step was measured slower."""
import statistics

from ..timing import Ratio
from ..words import plural

__all__ = ["checkpoint_time_words"]


def checkpoint_time_words(r: Ratio):
    """A checkpointed step against the plain one: `r` is how many times as fast the
    checkpointed step is, per round (helpers.ratio(plain, checkpointed) of interleave's
    Measurements). The clause follows 'a step was'."""
    times = statistics.median(1 / s for s in r.samples)   # the checkpointed step in plain ones
    rounds = plural(len(r.samples), "round")
    cost = "backward runs every block's forward again"
    if r.verdict == "slower":
        return (f"slower ({times:.2f} times the plain step's time, the median of {rounds} "
                f"timed in turns): {cost}, about one more forward pass in three passes' worth "
                "of work")
    if r.verdict == "faster":
        return (f"faster ({times:.2f} times the plain step's time, the median of {rounds} "
                f"timed in turns), although {cost}: this run does not say why")
    if r.verdict == "within noise":
        return (f"within noise of the plain step ({times:.2f} times its time, from "
                f"{1 / r.hi:.2f} to {1 / r.lo:.2f} over {rounds} timed in turns): this run "
                f"cannot tell the extra forward pass ({cost}) from the machine's noise")
    return (f"not told apart from the plain step ({times:.2f} times its time in one round, "
            "which has no spread)")
