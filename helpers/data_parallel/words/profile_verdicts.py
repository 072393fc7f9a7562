"""The sentences the profile and ddp_scratch chapters build from their measurements, one
function each with a branch per verdict (tests/test_verdicts_profile.py), as verdicts.py does for
the fixes and scaling chapters. A cause is named only where the run measured it.
"""
from ...timing import Ratio
from ...words import plural
from .verdicts import _check, _places

__all__ = ["simulated_devices_words", "same_code_words", "loader_step_words",
           "compute_split_words", "allreduce_split_words", "overlap_lengthens_words",
           "alone_prediction_words", "split_prediction_words",
           "backward_compute_words", "emulation_margin_words", "thesis_words"]


def simulated_devices_words(two, halves):
    """Two devices simulated in one process against one device (Ratio: one's time / two's), and
    the control that can explain a 'faster': one device running the two halves of each batch in
    turn (Ratio: one's time / the halves'). The half batches are named as the cause only where
    the control was resolved faster too."""
    _check(two), _check(halves)
    control = f"one device running the two halves of each batch in turn was {halves.spread_text()}"
    if two.verdict == "slower":
        return (f"slower than one ({two.spread_text()}): the two replicas take turns on the "
                "same core, "
                "and the second brings its own operators (counted below)")
    if two.verdict == "within noise":
        return (f"within noise of one ({two.spread_text()}): this run cannot tell them apart, as "
                "expected of two replicas that take turns on the same core")
    if two.verdict == "cannot tell":
        return f"not told apart from one ({two.spread_text()}: one round, no spread)"
    if halves.verdict == "faster":
        return (f"faster than one ({two.spread_text()}), and so was the control: {control}, "
                "faster. "
                "The half "
                "batches, not a second device, made the step shorter: on this core half a batch "
                "costs less than half as much (why, this run does not say)")
    return (f"faster than one ({two.spread_text()}), while the control was not resolved faster "
            f"({control}, "
            f"{halves.verdict}): this run does not say why")


def same_code_words(r):
    """The same code on the same tensors, after the same warm-up, timed in two cells (Ratio,
    unpaired: the earlier cell's time / the later one's): a resolved difference comes from what
    ran beside the code, not from the code, which is why comparisons are made in turns, never
    between cells. What ran beside it is not measured, so no one neighbour is named."""
    _check(r)
    if r.verdict in ("faster", "slower"):
        return (f"{r.median:.2f} times as fast (the median over every pairing of the two "
                f"cells' samples, {r.lo:.2f}-{r.hi:.2f}, unpaired: {r.verdict}). The code, its "
                "tensors and its warm-up were the same, so what changed between the two cells "
                "is what ran beside it (the later cell's rounds share the cores with the "
                "loader's worker processes, and with any other work on the machine; this run "
                "does not separate them): why every comparison in this chapter is made in "
                "turns, never between cells")
    return (f"{r.median:.2f} times as fast (the median over every pairing of the two cells' "
            f"samples, {r.lo:.2f}-{r.hi:.2f}, unpaired: {r.verdict}): the two cells cannot be "
            "told apart")


def loader_step_words(r, data_ms, diff_ms):
    """The one-device step fed by the loader against the same step on resident tensors, timed in
    the same rounds (Ratio: the resident step's time / the loader step's), with the loader
    step's median data phase and the medians' difference (milliseconds, loader minus resident)."""
    _check(r)
    if r.verdict == "slower" and diff_ms > 0:
        share = (": the whole difference" if data_ms >= diff_ms else
                 "; the rest this run does not explain")
        return (f"slower ({r.spread_text()}): {diff_ms:.1f} ms more a step (medians), of which its "
                f"data phase took {data_ms:.1f} ms{share}")
    if r.verdict == "faster":
        return (f"faster ({r.spread_text()}) although it also waits for the loader "
                f"({data_ms:.1f} ms a step): this run does not say why")
    return (f"{r.verdict} ({r.spread_text()}): its data phase took {data_ms:.1f} ms a step, which "
            "this run cannot tell from the noise")


def _ms(x):
    """Milliseconds to one decimal, or two below 0.1 (a resolved 0.04 ms is not '0.0')."""
    return f"{x:.1f}" if abs(x) >= 0.1 else f"{x:.2f}"


def _ms2(x):
    """Milliseconds to two decimals below 10, one above: how the chapter prints a step's parts."""
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}"


# Below these (the gap of the medians, and the low end of wall time / CPU time) a worker is not
# said to have lost its core: a few microseconds a step are within the clocks' reach.
OFF_CORE_MS, OFF_CORE_RATIO = 0.05, 1.01


def _off_core_spread(r):
    """'1.01x (1.008-1.06, 10 rounds)': a wall time / CPU time ratio, its ends printed to three
    decimals where two would print them as OFF_CORE_RATIO (a 1.008 is not the 1.01 it misses)."""
    def end(x):
        return f"{x:.3f}" if f"{x:.2f}" == f"{OFF_CORE_RATIO:.2f}" else f"{x:.2f}"
    return f"{r.median:.2f}x ({end(r.lo)}-{end(r.hi)}, {plural(len(r.samples), 'round')})"


def compute_split_words(cpu_vs_half, off_core, compute_ms, cpu_ms, one_ms, one_cpu_ms, k=2):
    """Why each of k workers computed for more than 1/k of one worker's compute, from measured
    times: `cpu_vs_half` (Ratio: a worker's CPU time of compute / one worker's over k, repeat by
    repeat: above 1 means the share itself cost more on the core), `off_core` (Ratio: a worker's
    compute wall time / its CPU time: above 1 means it spent time off its core), and the medians
    (milliseconds) of a worker's compute and its CPU time, and one worker's. Wall time is never
    shorter than CPU time, so `off_core` cannot fall below 1: time off the core is said only
    where the whole trimmed spread lies at or above OFF_CORE_RATIO and the medians differ by
    OFF_CORE_MS or more (the low end printed to three decimals, as a 1.00 may hide it), and
    what took the time is not named: the run does not measure it. One worker's own gap is
    quoted only from OFF_CORE_MS on."""
    _check(cpu_vs_half), _check(off_core)
    f = _ms2
    head = (f"each of {k} workers computed for {f(compute_ms)} ms a step, against 1/{k} of one "
            f"worker's {f(one_ms)} ms, {f(one_ms / k)}; on its core (its thread's CPU time) "
            f"{f(cpu_ms)} ms, against 1/{k} of one worker's {f(one_cpu_ms)}, "
            f"{f(one_cpu_ms / k)} (medians)")
    # one worker's own gap, said only from the floor on (a 0.00 ms gap is no figure)
    alone = (f"one worker alone's wall time exceeded its CPU time by {_ms(one_ms - one_cpu_ms)} "
             "ms, a gap not put to the workers' test"
             if one_ms - one_cpu_ms >= OFF_CORE_MS else "")
    while_alone = f", while {alone}" if alone else ""
    gap = compute_ms - cpu_ms
    if off_core.lo >= OFF_CORE_RATIO and gap >= OFF_CORE_MS:
        away = (f"; the rest of its compute, {_ms(gap)} ms, it spent off its core "
                f"(wall time / CPU time {off_core.spread_text()}, a ratio that cannot fall below "
                f"1, above it in every round of the spread: lowest {off_core.lo:.3f}): time its "
                "thread's CPU clock did not count, and what took it, this run does not say"
                + (f" ({alone})" if alone else ""))
    elif off_core.lo > 1:
        # above 1 in every round, but a floor not reached: say which test decided
        spread = _off_core_spread(off_core)
        low = f"its lowest ratio, {off_core.lo:.3f}, "
        floor = f"the {OFF_CORE_MS:.2f} ms floor"
        need = f"the {OFF_CORE_RATIO:.2f} this chapter requires"
        if gap >= OFF_CORE_MS:
            test = f"above {floor}, but {low}is under {need}"
        elif off_core.lo >= OFF_CORE_RATIO:
            test = f"under {floor}, though {low}reaches {need}"
        else:
            test = f"under {floor}, and {low}is under {need}"
        away = (f"; its wall time exceeded its CPU time by {_ms(gap)} ms (wall time / CPU time "
                f"{spread}): {test} to count it as time off the core, so it did not measurably "
                f"lose its core{while_alone}")
    else:
        away = (f"; its wall time and CPU time were not told apart "
                f"({off_core.spread_text()}: the spread reaches 1, the lowest a wall time / CPU "
                f"time ratio can be), so it did not measurably lose its core{while_alone}")
    if cpu_vs_half.lo > 1:
        share = (f": its share cost more than 1/{k} on the core itself "
                 f"({cpu_vs_half.spread_text()} of it)")
    elif cpu_vs_half.hi < 1:
        share = f": its share cost less than 1/{k} on the core ({cpu_vs_half.spread_text()} of it)"
    else:
        share = f": on the core its share cost about 1/{k} ({cpu_vs_half.spread_text()} of it)"
    return head + share + away


# What overlap adds to backward's compute: a possible cause, not timed in these runs (the buckets'
# copies and launches are booked as compute in both modes: exposed_comm_times).
_SUSPECTS = ("one possible cause, not timed here, is gloo's threads running the all-reduces on "
             "the core autograd needed (the buckets' copies and launches count as compute in "
             "both modes, so they are not the difference)")


def allreduce_split_words(comm_ms, wait_ms, after_ms, alone):
    """A worker's all-reduce in the step, split on the shared clock of the machine's processes:
    `wait_ms`, waiting for the other workers to arrive, and `after_ms`, from the last arrival to
    its end (medians, milliseconds), against the same all-reduce timed `alone` (a Measurement,
    seconds, a barrier before each call)."""
    lo, hi, med = alone.lo * 1e3, alone.hi * 1e3, alone.median * 1e3
    head = (f"of its {comm_ms:.2f} ms in the all-reduce a step, rank 0 waited {wait_ms:.2f} ms "
            f"for the other worker to arrive, and {after_ms:.2f} ms passed after both had arrived, "
            f"against {med:.2f} ms ({lo:.2f}-{hi:.2f}) for the same all-reduce alone (medians, "
            "which need not add up exactly)")
    if after_ms > hi:
        return (head + ": after both had arrived it still took longer than alone, and why, "
                "this run does not say")
    if after_ms < lo:
        return head + ": after both had arrived it took no longer than alone"
    return (head + f": the lone timing's spread ({lo:.2f}-{hi:.2f} ms) is too wide for this run "
            "to tell the time after both had arrived from the all-reduce alone")


def _as_long(r):
    """A compute Ratio (without's time / with's) read the way the sentence says it: 'overlap's
    took 3.23 times as long (1.79-5.26, 31 rounds)', from the inverted samples."""
    inv = Ratio([1 / x for x in r.samples])
    return (f"overlap's took {inv.median:.2f} times as long ({inv.lo:.2f}-{inv.hi:.2f}, "
            f"{plural(len(inv.samples), 'round')})")


def overlap_lengthens_words(step, compute):
    """Overlap against all-reduce-after-backward on one core per rank: the step (Ratio: after's /
    overlap's) and backward's compute (Ratio: after's compute / overlap's, paired rounds; below
    1 means overlap lengthened it). Two sentences: the step's verdict, then the compute's; the
    possible causes of a longer compute are offered only where it was resolved longer."""
    _check(step), _check(compute)
    grew = compute.verdict == "slower"
    why = (f"Backward's compute itself was longer with overlap ({_as_long(compute)}: "
           f"resolved); {_SUSPECTS}" if grew else
           f"Backward's compute was shorter with overlap ({_as_long(compute)}: resolved)"
           if compute.verdict == "faster" else
           "Backward's compute with overlap could not be told from its compute without "
           f"({_as_long(compute)})")
    if step.verdict == "slower":
        return ("overlap lengthened the step here" + ("" if grew else ", and why, this run "
                                                       "does not say") + ". " + why)
    if step.verdict == "faster":
        return "overlap shortened the step here" + (". " + why if grew else "")
    return "this run cannot tell whether overlap lengthened or shortened the step here. " + why


def _against(p, r):
    """'1.39 times, outside the measured 1.03-1.26': a predicted speed-up against a Ratio, an
    end that would print as the prediction and the prediction itself to the decimals that tell
    them apart ('1.736 times, outside the measured 1.741-2.19')."""
    _check(r)
    where = "inside" if r.lo <= p <= r.hi else "outside"
    lo, hi = _places(r.lo, p), _places(r.hi, p)
    return f"{p:.{max(lo, hi)}f} times, {where} the measured {r.lo:.{lo}f}-{r.hi:.{hi}f}"


# Below this (milliseconds a step) a part of the gap between the lone timing's prediction and
# the run is not named: a few hundredths of a millisecond are within the clocks' reach.
_GAP_PART_MS = 0.05


def alone_prediction_words(predictions):
    """Speed-ups predicted from the all-reduce timed alone, each against its measured Ratio:
    `predictions` a list of (name, predicted speed-up from the lone median, (lowest, highest)
    predicted from the lone timing's spread, Ratio, parts). `parts` are the measured parts of
    the run's step beyond the prediction's, (words, ms) pairs (the wait for the other worker,
    the compute a worker lost against half of one worker's, the all-reduce after both arrived
    above its lone median: medians). The point inside the measured spread: inside; the
    predicted range overlapping it: the run cannot tell the prediction from the measurement;
    the range above it: two workers did worse, and the parts of at least _GAP_PART_MS are named
    in order of size, largest first (none measured: the run does not say why); below it: they
    did better, which the run does not explain."""
    parts = []
    for name, p, (p_lo, p_hi), r, gap in predictions:
        _check(r)
        if not p_lo <= p <= p_hi:
            raise ValueError(f"alone_prediction_words: {name}: the prediction {p} lies outside "
                             f"its range {p_lo}-{p_hi}")
        head = f"{p:.2f} times at {name} ({p_lo:.2f}-{p_hi:.2f} from the lone timing's spread)"
        spread = f"the measured {r.lo:.2f}-{r.hi:.2f}"
        if r.lo <= p <= r.hi:
            parts.append(f"{head}, inside {spread}")
        elif p_lo <= r.hi and r.lo <= p_hi:
            parts.append(f"{head}, a range that overlaps {spread}: this run cannot tell the "
                         "prediction from the measurement")
        elif p_lo > r.hi:
            named = sorted(((ms, words) for words, ms in gap if ms >= _GAP_PART_MS), reverse=True)
            why = ("; the step was longer than predicted by " + ", then ".join(
                f"{ms:.2f} ms of {words}" for ms, words in named) + " (medians, in order of "
                "size)" if named else "; none of the split's parts was measured longer than the "
                "prediction allows, so why, this run does not say")
            parts.append(f"{head}, above {spread}: two workers did worse than the lone timing "
                         "predicts" + why)
        else:
            parts.append(f"{head}, below {spread}: two workers did better than the lone timing "
                         "predicts, so it came out longer than the all-reduce inside the run's "
                         "steps left room for, and why, this run does not say")
    if not parts:
        raise ValueError("alone_prediction_words needs at least one (name, predicted, range, "
                         "Ratio, parts)")
    return parts[0] if len(parts) == 1 else "; ".join(parts[:-1]) + "; and " + parts[-1]


def split_prediction_words(p, r, where):
    """A speed-up predicted from a run's own split (one worker's compute over k, plus the k
    workers' all-reduce) against the measured Ratio: inside or outside its spread. `where`
    names where the reader finds the run's split of the time (said only for a miss: the split
    shows which part the prediction got wrong)."""
    words = _against(p, r)
    if r.lo <= p <= r.hi:
        return words
    side = "higher" if p < r.lo else "lower"
    return f"{words}: the measured speed-up was {side}, and {where} shows where the time went"


def backward_compute_words(r):
    """Backward's compute with overlap against without (Ratio: without's / with's, paired
    rounds: below 1, overlap's was longer; the buckets' copies and launches count as compute in
    both). Overlap adds gloo's threads on the same core to backward; the run does not time them,
    so they are offered as a possible cause where resolved, with 'if real' where not, and no
    cause is named for a shorter one."""
    _check(r)
    if r.verdict == "slower":
        return f"longer with overlap ({_as_long(r)}: resolved); {_SUSPECTS}"
    if r.verdict == "faster":
        return (f"shorter with overlap ({_as_long(r)}: resolved), which this run does not "
                "explain")
    told = f"not told apart ({_as_long(r)}: {r.verdict})"
    return f"{told}; if the difference is real, {_SUSPECTS}" \
        if r.median < 1 else told


def emulation_margin_words(scale, margin_ms, late_ms):
    """Why an emulated schedule (modelled durations stretched `scale` times, waited for in
    sleeps) keeps its shape: the overlapped step ends first unless the machine makes it later,
    against the modelled schedule, by `margin_ms` (real ms: overlap's modelled saving, times
    scale) more than the other. `late_ms` {mode: real ms by which that step ended after the
    modelled schedule} says whether this run stayed within it."""
    if scale <= 0 or margin_ms <= 0:
        raise ValueError(f"emulation_margin_words: scale ({scale}) and margin_ms ({margin_ms}) "
                         "must be positive: the model must give overlap a saving")
    head = (f"every modelled duration lasts {scale:,.0f} times as long in real time, so the "
            "schedule keeps its shape unless the machine delays the overlapped step's sleeps "
            f"by more than {margin_ms:,.0f} ms (what overlap saves in the model, stretched "
            "alike) beyond the other's")
    ov, af = late_ms["overlap"], late_ms["after"]
    late = (f"in this run the overlapped step ended {ov:,.1f} ms after the modelled "
            f"schedule and the other {af:,.1f} ms")
    if ov - af < margin_ms:
        return f"{head}; {late}, within it"
    return (f"{head}; {late}: beyond it, so the figure below shows the machine's delays, not "
            "the schedule")


def thesis_words(win, losses):
    """What a run showed of 'k workers win when the compute they split is large, lose when it is
    not': `win` the Ratio at the large batch (k workers against one), `losses` {name: Ratio} of
    the small-batch runs. A loss or a win is claimed only where its ratio was resolved."""
    _check(win)
    lost = [name for name, r in losses.items() if _check(r).verdict == "slower"]
    if len(lost) == len(losses) > 1:
        loss = "every small-batch run showed the loss"
    elif lost:
        rest = ", ".join(f"{name}: {r.verdict}" for name, r in losses.items() if name not in lost)
        loss = f"only the run with {' and '.join(lost)} showed the loss ({rest})"
    else:
        loss = "no small-batch run showed the loss"
    won = {"faster": "the large batch showed the win",
           "slower": "the large batch contradicted the win (slower)",
           "within noise": "the large batch did not resolve the win (within noise)",
           "cannot tell": "the large batch had one round: no verdict"}[win.verdict]
    return f"{loss}; {won}"
