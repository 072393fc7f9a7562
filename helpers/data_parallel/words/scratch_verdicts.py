"""Part II's words for its one-device against two-device run (the scratch chapter): when each
run left LeNet's plateau, whether the two accuracies differ over seeds, and whether the epochs'
times tell the two apart (three branches, from their ranges: a simulated pair runs one after the
other)."""
import math
import statistics

from ...words import plural
from .seed_verdicts import WITHIN, chance_words, paired_verdict, unseparated_words

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


def accuracy_gap_words(accs_1, accs_2, margin=0.005):
    """Whether two devices' test accuracies (accs_2, one per seed) differ from one device's
    (accs_1; a seed gives both the same start and batches): above or below only where every
    seed's gap exceeds `margin` (seed_verdicts' rule, its chance stated), else not separated."""
    gaps = [b - a for a, b in zip(accs_1, accs_2, strict=True)]
    if len(gaps) < 2:
        raise ValueError(f"{len(gaps)} seed(s): the gap between one device and two needs at "
                         "least two seeds to be set against the spread between seeds")
    n, listed = len(gaps), ", ".join(f"{g:+.3f}" for g in gaps)
    spread = max(max(a) - min(a) for a in (accs_1, accs_2))
    verdict = paired_verdict(accs_2, accs_1, margin)
    if verdict == WITHIN:
        said = unseparated_words(accs_2, accs_1, "two devices", "one", margin)
        return (f"Over {plural(n, 'seed')}, two devices minus one gave {listed}; {said} (the "
                f"margin: {margin:g}), while the seeds of one setting lie up to {spread:.3f} "
                "apart. These runs cannot tell the two apart, as befits the same update")
    return (f"Over {plural(n, 'seed')}, two devices ended {verdict} one on every seed by more "
            f"than {margin:g} (two devices minus one: {listed}; the seeds of one setting lie up "
            f"to {spread:.3f} apart), although every step computes the one-device update. With "
            f"no real difference, {n} paired gaps share a sign {chance_words(n)} times: more "
            "seeds would tell whether this is only where the rounding took these runs")


def epoch_speed_words(times_1, times_2, simulated):
    """The two runs' epochs after the first (it pays for warm-up), told apart only where their
    ranges do not overlap; medians given with the verdict. A simulated pair (two devices run one
    after the other on one) says nothing about parallel speed, and the words say so."""
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
        said = f"the epochs' ranges overlap ({ranges}), so this run cannot tell them apart"
    if simulated:
        return ("The two devices were simulated one after the other on one device (one "
                "device's arithmetic plus an all-reduce), so these timings say nothing about "
                f"parallel speed; {said}.")
    return f"Both devices were real GPUs: {said}."
