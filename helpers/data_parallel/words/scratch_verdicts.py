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


def _seed_speed(t_1, t_2):
    """One seed's epochs (sorted): "faster" or "slower" where two devices' range lies wholly
    below or above one device's, else "overlap"."""
    if t_2[-1] < t_1[0]:
        return "faster"
    return "slower" if t_2[0] > t_1[-1] else "overlap"


def epoch_speed_words(times_1, times_2, simulated):
    """The epochs after the first (it pays for warm-up) of every seed: times_1[s] and times_2[s]
    are seed s's on one device and on two (a seed gives both the same start and batches). Seed
    by seed, two devices are faster or slower only where their epochs' range does not overlap
    one device's; the verdict is faster or slower only where every seed agrees, else the runs
    cannot tell. Medians and ranges are pooled over all seeds' epochs. A simulated pair (two
    devices run one after the other on one) says nothing about parallel speed, and the words
    say so."""
    seeds = [(sorted(a), sorted(b)) for a, b in zip(times_1, times_2, strict=True)]
    if not seeds or any(not a or not b for a, b in seeds):
        raise ValueError("epoch_speed_words needs at least one timed epoch per run")
    t_1, t_2 = sorted(t for a, _ in seeds for t in a), sorted(t for _, b in seeds for t in b)
    n = len(seeds)
    pooled = (f"two devices {statistics.median(t_2):.2f} s an epoch (median; {t_2[0]:.2f} to "
              f"{t_2[-1]:.2f}) against one device's {statistics.median(t_1):.2f} s "
              f"({t_1[0]:.2f} to {t_1[-1]:.2f}), over {plural(len(t_1), 'epoch')} each"
              + (f" from {plural(n, 'seed')}" if n > 1 else ""))
    found = [_seed_speed(a, b) for a, b in seeds]
    if found[0] != "overlap" and found.count(found[0]) == n:
        every = " on every seed" if n > 1 else ""
        said = (f"two devices were {found[0]} than one in every epoch{every} ({pooled}), and "
                "these runs do not say why")
    elif found.count("overlap") == n:
        every = " on every seed" if n > 1 else ""
        said = (f"the epochs' ranges overlap{every} ({pooled}), so "
                f"{'these runs' if n > 1 else 'this run'} cannot tell them apart")
    else:
        counts = ", ".join(f"{found.count(k)} {w}" for k, w in (
            ("faster", "faster"), ("slower", "slower"), ("overlap", "overlapping"))
            if found.count(k))
        said = (f"the seeds disagree (two devices' epochs against one's, seed by seed: "
                f"{counts}; {pooled}), so these runs cannot tell them apart")
    if simulated:
        return ("The two devices were simulated on one device (the same arithmetic in two "
                "halves, one after the other, plus an all-reduce), so these timings say nothing "
                f"about parallel speed; {said}.")
    return f"Both devices were real GPUs: {said}."
