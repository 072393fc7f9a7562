"""Part III's words for SyncBatchNorm (the syncbn chapter): how far the long runs' statistics
moved against a rounding-size control, and what the cost timings resolved. A cost ratio is a
time with more work over a time without, per round (Ratio's "faster" is then a cost), and every
verdict, "cannot tell" (one round) included, has its words."""
import math

from ...timing import Ratio

__all__ = ["long_run_words", "cost_words", "resolved_words", "found_words",
           "comm_resolved_words", "paired_difference_se", "paired_accuracy_words"]


def long_run_words(gap_bn, gap_sync, gap_control):
    """The control's gap (the one-process run started a rounding away) against the per-device
    run's and SyncBatchNorm's, each (running means, running variances) from one process."""
    noise = max(gap_control)
    bn_x, sync_x = (g[0] / gap_control[0] for g in (gap_bn, gap_sync))
    times = (f"the per-device run ends {bn_x:.1f} times as far from one process as the control "
             f"in the running means, SyncBatchNorm {sync_x:.1f} times")
    if noise >= min(gap_bn):
        return ("larger than the per-device gap: after this many steps these largest gaps "
                "measure how chaotic the trajectory is, not which BatchNorm is closer "
                f"({times})")
    if noise >= 0.1 * min(gap_bn):
        return (f"of the same order as the per-device gap: {times}. With one run of each, a "
                "gap a few times the control's cannot be told from how chaotic the trajectory "
                "is")
    return (f"far below the per-device gap: {times}. Per-device BatchNorm moved the statistics "
            "well beyond what rounding alone does")


_AS_COST = {"faster": "a cost", "slower": "a saving", "within noise": "within noise",
            "cannot tell": "cannot tell (one round, no spread)"}


def cost_words(r: Ratio):
    """'1.65x (1.33-2.16): a cost': a cost ratio with its spread and what it resolved."""
    return f"{r.median:.2f}x ({r.lo:.2f}-{r.hi:.2f}): {_AS_COST[r.verdict]}"


def resolved_words(r: Ratio, what):
    """What a cost ratio resolved about `what` (None where it resolved nothing): the share
    it added to a step, or a saving, which more work should not give (no cause is named)."""
    if r.verdict == "faster":
        return f"{what} added {100 * (r.median - 1):.0f} % to a step"
    if r.verdict == "slower":
        return f"{what} made a step faster (unexpected)"
    return None


def found_words(cost):
    """Everything the cost ratios resolved, batch by batch: `cost` maps a batch's name ('16 a
    rank') to {"comm": Ratio (syncbn / control), "impl": Ratio (control / bn), ...}."""
    found = []
    for name, c in cost.items():
        words = [w for w in (resolved_words(c["comm"], "the collectives"),
                             resolved_words(c["impl"], "the Python implementation")) if w]
        if words:
            found.append(f"at {name}, {' and '.join(words)}")
    if found:
        return "; ".join(found)
    return ("no ratio resolved: every ratio's spread crossed 1.0, or it had too few rounds to "
            "have a spread")


def comm_resolved_words(cost):
    """At which batches the collectives' cost was resolved (a cost over its whole spread)."""
    imgs = {name: name.replace(" a rank", " images a rank") for name in cost}
    yes = [imgs[n] for n in cost if cost[n]["comm"].verdict == "faster"]
    no = [imgs[n] for n in cost if cost[n]["comm"].verdict != "faster"]
    if not no:
        return "resolved at both batches"
    if not yes:
        return "not resolved at either batch"
    return f"resolved at {yes[0]}, not at {no[0]}"


def _disagreements(right_a, right_b):
    """(images only a got right, images only b got right, images): two models on the same
    images, one truth value per image each."""
    a, b = [bool(x) for x in right_a], [bool(x) for x in right_b]
    if len(a) != len(b) or not a:
        raise ValueError(f"a paired comparison needs the same images for both models, at least "
                         f"one: got {len(a)} and {len(b)}")
    pairs = list(zip(a, b, strict=True))
    return sum(x and not y for x, y in pairs), sum(y and not x for x, y in pairs), len(a)


def paired_difference_se(right_a, right_b):
    """The standard error of accuracy(b) - accuracy(a) when both models are scored on the same
    images (`right_a`, `right_b`: one truth value per image): from the images only one of them
    got right, sqrt(n_ab + n_ba - (n_ab - n_ba)**2 / n) / n, the paired (McNemar) form, which
    the unpaired formula overstates when the two models get the same images right."""
    only_a, only_b, n = _disagreements(right_a, right_b)
    return math.sqrt(max(0.0, only_a + only_b - (only_b - only_a) ** 2 / n)) / n


def paired_accuracy_words(right_bn, right_sync):
    """Per-device BatchNorm against SyncBatchNorm on the same test images (one truth value per
    image each): the difference, the images only one got right, and the paired standard error.
    One run of each measures no seed-to-seed spread, so the words give no verdict."""
    only_bn, only_sync, n = _disagreements(right_bn, right_sync)
    se = paired_difference_se(right_bn, right_sync)
    diff = 100 * (only_sync - only_bn) / n
    seeds = ("the spread from one training seed to the next, which one run of each does not "
             "measure")
    if only_bn + only_sync == 0:
        return (f"On the same {n:,} test images the two models got exactly the same images "
                f"right; {seeds}, could still separate them")
    return (f"On the same {n:,} test images, SyncBatchNorm minus per-device is {diff:+.1f} "
            f"points ({only_bn} images right only per-device, {only_sync} only with "
            f"SyncBatchNorm); the standard error of that paired difference, from those images, "
            f"is about {100 * se:.1f} points. It leaves out {seeds}, so these runs give no "
            "verdict on accuracy")
