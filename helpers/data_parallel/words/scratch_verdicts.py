"""Part II's words for its one-device against two-device run (the scratch chapter): when each
run left LeNet's plateau, whether the two accuracies agree, and whether the epochs' times tell
the two apart (three branches, from their ranges: a simulated pair runs one after the other)."""
import math
import statistics

from ...words import plural

__all__ = ["PLATEAU", "take_off", "takeoff_words", "accuracy_gap_words", "epoch_speed_words"]

PLATEAU = 0.9 * math.log(10)   # 90 % of chance's loss for 10 classes (ln 10)


def take_off(losses, window=10, below=PLATEAU):
    """The first step after which `window` steps averaged a training loss below `below`: when the
    run left the plateau (None if it never did)."""
    for i in range(window, len(losses) + 1):
        if sum(losses[i - window:i]) / window < below:
            return i
    return None


def takeoff_words(losses_1, losses_2, window=10):
    """When the one-device run (losses_1) and the two-device run left the plateau, in a sentence
    that says what the rounding moved (nothing, the take-off, or one run past its end)."""
    off = [take_off(losses, window) for losses in (losses_1, losses_2)]
    rule = (f"the step ending the first {window} steps whose training loss averaged below "
            f"{PLATEAU:.2f}, 90 % of chance")
    n_steps = len(losses_1)
    if off == [None, None]:
        return (f"In this run neither left the plateau within its {n_steps} steps ({rule}), so "
                "it does not show when the take-off comes")
    if None in off:
        took = "one device" if off[0] is not None else "two devices"
        return (f"In this run only the run on {took} left the plateau, at step "
                f"{max(o or 0 for o in off)} of {n_steps} ({rule}): the rounding moved the "
                "take-off past the other run's end")
    if off[0] == off[1]:
        return (f"In this run both left the plateau at step {off[0]} ({rule}): the rounding "
                "did not move the take-off, only the curves after it")
    return (f"In this run one device left the plateau at step {off[0]}, two devices at step "
            f"{off[1]} ({rule}): the rounding moved the take-off by {abs(off[0] - off[1])} "
            "steps")


def accuracy_gap_words(acc_1, acc_2, close=0.02):
    """Whether two test accuracies of the same update agree (a gap below `close`) or differ."""
    if abs(acc_1 - acc_2) < close:
        return "The two accuracies agree closely"
    return "The two accuracies differ, although every step computes the same update"


def epoch_speed_words(times_1, times_2, simulated):
    """The two runs' epochs after the first (it pays for warm-up), told apart only where their
    ranges do not overlap; medians given with the verdict. A simulated pair (two devices run one
    after the other on one) shows correctness, not parallel speed, and says so."""
    t_1, t_2 = sorted(times_1), sorted(times_2)
    if not t_1 or not t_2:
        raise ValueError("epoch_speed_words needs at least one timed epoch per run")
    ranges = (f"two devices {statistics.median(t_2):.2f} s an epoch (median; {t_2[0]:.2f} to "
              f"{t_2[-1]:.2f}) against one device's {statistics.median(t_1):.2f} s "
              f"({t_1[0]:.2f} to {t_1[-1]:.2f}), over {plural(len(t_1), 'epoch')} each")
    if t_2[-1] < t_1[0] or t_2[0] > t_1[-1]:
        word = "faster" if t_2[-1] < t_1[0] else "slower"
        said = (f"two devices were {word} than one in every epoch ({ranges}), and this run "
                "does not say why")
    else:
        said = f"the two cannot be told apart: their epochs overlap ({ranges})"
    if simulated:
        return ("The two devices were simulated on one device, one after the other, so these "
                f"timings show correctness, not parallel speed: {said}.")
    return f"Both devices were real GPUs: {said}."
