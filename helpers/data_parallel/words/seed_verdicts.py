"""Part III's accuracy verdicts over seeds (the DataParallel chapter): one setting is above or
below another only where EVERY paired seed puts it there by more than a margin, and the chance
that a rule like this is fooled is stated beside it: with no real difference, n paired gaps all
share a sign 2 / 2**n of the time (1 in 4 for three seeds)."""

from ...validate import validate_positive_int
from ...words import plural

__all__ = ["paired_verdict", "unseparated_words", "sign_chance", "chance_words",
           "scaled_rate_verdict", "equal_steps_verdict", "chance_level_words"]

# WITHIN: some seed's gap lies inside the margin, or the gaps disagree in sign; it says the run
# could not separate the two, not that they are equal (unseparated_words says which)
ABOVE, BELOW, WITHIN = "above", "below", "not separated on every seed from"


def _mean(xs):
    return sum(xs) / len(xs)


def _gaps(a, b):
    """Seed-by-seed gaps a - b; ValueError when the two do not pair up seed for seed."""
    a, b = list(a), list(b)
    if not a or len(a) != len(b):
        raise ValueError(f"paired seeds: {len(a)} accuracies against {len(b)}; pass one per "
                         "seed for both settings, in the same seed order")
    return [x - y for x, y in zip(a, b, strict=True)]


def paired_verdict(a, b, margin=0.005):
    """Words for setting a against setting b (accuracies per seed; the same seed gives both the
    same start and batch order): ABOVE when every seed's gap a - b exceeds `margin`, BELOW when
    every one is below -margin, else WITHIN ("not separated on every seed from")."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    gaps = _gaps(a, b)
    if min(gaps) > margin:
        return ABOVE
    if max(gaps) < -margin:
        return BELOW
    return WITHIN


def unseparated_words(a, b, subject, other, margin=0.005):
    """What WITHIN means for a against b, seed by seed: the seeds disagree in sign (each side by
    more than the margin), some fall inside the margin, or none separates the two."""
    gaps = _gaps(a, b)
    up = sum(g > margin for g in gaps)
    down = sum(g < -margin for g in gaps)
    inside = len(gaps) - up - down
    if up and down:
        rest = f", {inside} within it" if inside else ""
        return (f"the seeds disagree: {plural(up, 'seed')} put {subject} above {other} by more "
                f"than the margin, {down} below it{rest}")
    if inside == len(gaps):
        return f"no seed separates {subject} from {other} by the margin"
    verb = "does" if inside == 1 else "do"
    return (f"{inside} of the {len(gaps)} seeds {verb} not separate {subject} from {other} by "
            "the margin")


def sign_chance(seeds):
    """How often `seeds` paired gaps with no real difference behind them (symmetric about zero,
    independent) all share a sign, either one: 2 / 2**seeds. The margin makes it rarer still."""
    validate_positive_int(seeds, "seeds")
    return 2 / 2 ** seeds


def chance_words(seeds):
    """sign_chance as a reader says it: '1 in 4' for three seeds."""
    return f"1 in {round(1 / sign_chance(seeds)):,}"


def scaled_rate_verdict(acc_1, acc_same, acc_scaled, margin=0.005):
    """The linear-scaling rule's sentence for LeNet: acc_1 (1 device, batch b), acc_same (batch 2b,
    the same rate), acc_scaled (batch 2b, the doubled rate with warm-up), one accuracy per seed.
    A cause is suggested, not named, where the scaled rate did not clearly help."""
    if paired_verdict(acc_scaled, acc_same, margin) != ABOVE:
        return ("Over these seeds the scaled rate did not clearly help. This chapter does not "
                "measure why; a run this short, or a doubled rate too large this early, are the "
                "usual suspects.")
    against_one = paired_verdict(acc_scaled, acc_1, margin)
    if against_one == ABOVE:
        return ("Here the scaled rate more than made up for doubling the batch at the same "
                "rate, on every seed.")
    if against_one == WITHIN:
        words = unseparated_words(acc_scaled, acc_1, "the doubled batch", "the 1-device run",
                                  margin)
        return (f"Here the scaled rate brought the doubled batch back near the 1-device run, as "
                f"the rule intends: {words}.")
    share = (_mean(acc_scaled) - _mean(acc_same)) / (_mean(acc_1) - _mean(acc_same))
    return (f"Here the scaled rate won back {100 * share:.0f} % of what doubling the batch at "
            f"the same rate lost on average: {'most' if share >= 0.5 else 'part'} of the gap, "
            "not all.")


def equal_steps_verdict(a1, a2, a3, margin=0.005):
    """The ResNet clause on steps: a1 (batch b), a2 (batch 2b, doubled rate), a3 (batch 2b for
    twice the epochs: as many steps as a1), one accuracy per seed. A third run above the second
    agrees with the reading the sentence before gives, that the second lacked steps."""
    if paired_verdict(a3, a2, margin) != ABOVE:
        return ("here even as many steps did not clearly close the gap: the rate, too large "
                "this early for so small a model, is the other suspect")
    agrees = "the third run agrees with that reading: given as many steps, the doubled batch"
    against_one = paired_verdict(a3, a1, margin)
    if against_one == ABOVE:
        return f"{agrees} does better than the first run, on every seed"
    if against_one == WITHIN:
        words = unseparated_words(a3, a1, "the doubled batch", "the first run", margin)
        return f"{agrees} is not clearly above or below the first run: {words}"
    share = (_mean(a3) - _mean(a2)) / (_mean(a1) - _mean(a2))
    if share < 0.5:
        agrees = agrees.replace("that reading:", "that reading in part:")
    return (f"{agrees} recovers "
            f"{'most' if share >= 0.5 else 'part'} of the gap ({100 * share:.0f} % on average), "
            "not all of it")


def chance_level_words(settings, n_test, classes=10, within=3):
    """The seeds still at chance level, named: an accuracy within `within` standard errors of
    1 / classes (the SE of a chance-level accuracy over n_test test images). settings maps a
    setting's words to its accuracies, one per seed; a sentence saying so when no seed is there."""
    if n_test < 1 or classes < 2:
        raise ValueError(f"n_test={n_test}, classes={classes}: need test images and 2+ classes")
    chance = 1 / classes
    se = (chance * (1 - chance) / n_test) ** 0.5
    stuck = [(name, acc) for name, accs in settings.items() for acc in accs
             if abs(acc - chance) <= within * se]
    rule = (f"within {within} standard errors of chance, {chance:g}, over {n_test:,} test images")
    if not stuck:
        return f"No seed was left at chance level ({rule})."
    where = "; ".join(f"{name}: {acc:.3f}" for name, acc in stuck)
    if len(stuck) == 1:
        return (f"One seed had not left chance level by the end of its run ({where}; {rule}): "
                "it weighs on that setting's mean and spread.")
    return (f"{len(stuck)} seeds had not left chance level by the end of their runs ({where}; "
            f"{rule}): they weigh on those settings' means and spreads.")
