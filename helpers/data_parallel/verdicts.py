"""The sentences Part IV's chapters build from their measurements, one function each, so that
every branch is tested (tests/test_verdicts.py) instead of living in a notebook's hidden cell.

Each takes helpers.Ratio objects (helpers.timing: a verdict of "faster", "slower", "within
noise" or, from one round, "cannot tell") and numbers, and returns the words the chapter glues.
A sentence names a cause only for a resolved ratio, and only from a measured split.
"""
from ..timing import Ratio

__all__ = ["ratio_words", "against_prediction", "ablation_credit", "compile_sentence",
           "graph_sentence", "knob_words", "bucket_words", "message_cause", "strong_words",
           "overlap_step_words", "two_workers_sentence", "shared_rounding_words"]


def _check(r):
    if not isinstance(r, Ratio):
        raise TypeError(f"expected a helpers.Ratio (helpers.ratio(base, new)), got {r!r}")
    return r


def ratio_words(r):
    """'1.23 times as fast (1.05-1.40: faster)': a ratio with its spread and verdict."""
    _check(r)
    return f"{r.median:.2f} times as fast ({r.lo:.2f}-{r.hi:.2f}: {r.verdict})"


def against_prediction(r, predicted):
    """The verdict of `r` and whether it is one of the `predicted` verdicts: 'faster, as
    predicted', 'slower: not what we predicted', 'within noise: this run cannot tell them apart,
    as predicted' ... ('one round: no verdict' from a single round)."""
    _check(r)
    unknown = set(predicted) - {"faster", "slower", "within noise"}
    if unknown or not predicted:
        raise ValueError(f"predicted verdicts {sorted(predicted)}: choose among 'faster', "
                         "'slower' and 'within noise'")
    if r.verdict == "cannot tell":
        return "one round: no verdict"
    what = ("within noise: this run cannot tell them apart" if r.verdict == "within noise"
            else r.verdict)
    return f"{what}, as predicted" if r.verdict in predicted else \
        f"{what}: not what we predicted"


def ablation_credit(rewrite, compiler, both):
    """What the compile ablation credits, from three Ratios against the plain eager step: the
    rewrite alone (lenet_fused, eager), the compiler alone (plain, compiled) and both. Every
    variant resolved faster is named, and only those."""
    for r in (rewrite, compiler, both):
        _check(r)
    alone = [name for name, r in (("the rewrite", rewrite), ("the compiler", compiler))
             if r.verdict == "faster"]
    if both.verdict == "faster":
        if not alone:
            return ("neither alone was resolved faster, the two together were: the compiled "
                    "step's gain comes from the combination, a model rewritten so that the "
                    "compiler can fuse it, not from compiling alone")
        if len(alone) == 2:
            return "each alone was faster, and the two together too: both earn part of the gain"
        return f"{alone[0]} alone was faster, the other alone was not, and the two together were"
    if not alone:
        return ("none of the three was resolved faster than the plain eager step in this run, "
                "so it credits neither")
    if len(alone) == 2:
        return ("the rewrite alone and the compiler alone were each resolved faster, the two "
                "together were not: this run credits each alone, not their combination")
    other = "the compiler" if alone[0] == "the rewrite" else "the rewrite"
    return (f"{alone[0]} alone was resolved faster; {other} alone and the two together were "
            f"not, so this run credits {alone[0]} alone")


def compile_sentence(r, first_step_s, saved_s, epoch_steps):
    """The compiled step against the fused step (Ratio `r`), and when its first step's compile
    pays back: `saved_s` seconds a step (the medians' difference) over `epoch_steps` steps an
    epoch; a payback only where the ratio says faster."""
    _check(r)
    if r.verdict == "faster" and saved_s > 0:
        steps = first_step_s / saved_s
        pays = (f"; it pays back its first step's {first_step_s:.0f} s after {steps:,.0f} steps "
                f"({steps / epoch_steps:.1f} epochs of Fashion-MNIST)")
    elif r.verdict == "slower":
        pays = ", so here it never pays back its compile"
    else:
        pays = (f"; this run cannot tell whether it ever pays back its first step's "
                f"{first_step_s:.0f} s")
    return (f"The compiled step (`lenet_fused`, compiled: both, as the ablation above separates "
            f"them) was {r.median:.2f} times as fast as the fused step ({r.lo:.2f}-{r.hi:.2f}: "
            f"{r.verdict}){pays}.")


def graph_sentence(r=None):
    """The CUDA graph against the fused step (a Ratio), or None where no GPU ran it."""
    if r is None:
        return "There was no CUDA graph to measure here (it needs a GPU)."
    _check(r)
    return (f"The CUDA graph made a step {r.median:.1f} times as fast as the fused step "
            f"({r.lo:.2f}-{r.hi:.2f}: {r.verdict}).")


def knob_words(exposed, exposed_ms, step):
    """One DDP knob against the default: its exposed all-reduce (Ratio, default's / knob's),
    its median exposed milliseconds, and its whole step (Ratio)."""
    _check(exposed), _check(step)
    less = {"faster": "less exposed all-reduce than the default",
            "slower": "more exposed all-reduce than the default"}.get(
        exposed.verdict, "exposed all-reduce the run cannot tell from the default's")
    return (f"{less} ({exposed_ms:.1f} ms a step, {exposed.lo:.2f}-{exposed.hi:.2f} of the "
            f"default's per round; the step {step.median:.2f} times as fast, {step.verdict})")


def bucket_words(one_vs_small):
    """One bucket against small buckets, on the exposed all-reduce (Ratio: one bucket's /
    small buckets', so 'faster' means small buckets left less exposed)."""
    r = _check(one_vs_small)
    return (f"one bucket left {r.median:.2f} times the exposed all-reduce of 1 MB buckets "
            f"({r.lo:.2f}-{r.hi:.2f}: "
            + ("resolved: smaller buckets hid more of it behind backward. The step did not "
               "shrink with it: each rank has one core, which gloo's threads share with "
               "backward, so here the hidden all-reduce lengthens backward instead (the "
               "ddp_scratch chapter measured it); on GPUs, whose communication has its own "
               "hardware, we predict the step to gain"
               if r.verdict == "faster" else "the reverse of the model"
               if r.verdict == "slower" else
               "not resolvable on two CPU processes of this busy machine, where gloo's threads "
               "and autograd share one core each") + ")")


def message_cause(r, saved_ms, comm_saved_ms):
    """Where one message a step (against 8) saved its time: named only when the ratio is
    resolved faster and the measured split puts most of the saving in the all-reduce."""
    _check(r)
    if r.verdict == "faster" and saved_ms > 0 and comm_saved_ms >= saved_ms:
        return (f"about all of the {saved_ms:.2f} ms a step saved was all-reduce time "
                f"({comm_saved_ms:.2f} ms less of it, medians): the messages' latency, "
                "measured")
    if r.verdict == "faster" and saved_ms > 0 and comm_saved_ms > 0.5 * saved_ms:
        return (f"{comm_saved_ms:.2f} ms of the {saved_ms:.2f} ms a step saved was all-reduce "
                "time (medians): the messages' latency, measured")
    if r.verdict == "faster":
        return ("the measured split does not put the difference in the all-reduce, so this run "
                "names no cause")
    return "this run resolved no difference, so it names no cause"


def strong_words(r, compute1_ms, computek_ms, comm_ms):
    """k workers against one at the same global batch (Ratio), with the measured split: each
    worker's compute for one worker and for k, and the all-reduce (waits included) for k."""
    _check(r)
    split = (f"each worker's compute went from {compute1_ms:.1f} to {computek_ms:.1f} ms a step "
             f"and the all-reduce, waits included, added {comm_ms:.1f} ms")
    if r.verdict == "faster":
        return f"faster than one ({r}): {split}"
    if r.verdict == "slower":
        saved = compute1_ms - computek_ms
        return (f"slower than one ({r}): {split}, "
                + ("more than the compute saved" if comm_ms > saved else
                   "less than the compute saved, so the split does not explain it"))
    return f"within noise of one ({r}): this run cannot tell them apart, so it names no cause"


def overlap_step_words(r):
    """Overlap against all-reduce-after-backward on the whole step (Ratio: after's / overlap's)."""
    _check(r)
    return {"faster": "faster than", "slower": "slower than",
            "cannot tell": "not told apart (one round) from"}.get(r.verdict, "within noise of")


def two_workers_sentence(batches, speed, comm_share):
    """The reference step on two workers against one, at the smallest and the largest batch of
    the scaling chapter's sweep: `speed` their Ratios (one worker's time / two workers', round
    by round), `comm_share` the all-reduce's measured share of a two-worker step (medians).
    Empty inputs: two workers were not run (one core)."""
    if not batches:
        return "Two workers were not run: one core is too few for them."
    (small, large), (r_small, r_large), (c_small, c_large) = batches, speed, comm_share
    half = (": more than twice as fast, so there the half batch each of two workers gets "
            "costs less per example than the whole one") if _check(r_large).lo > 2 else ""
    return (f"With the reference step, two workers were {ratio_words(r_small)} as one at batch "
            f"{small}, and {ratio_words(r_large)} at batch {large}{half}. The all-reduce's 8 "
            f"messages (waits included) took {100 * c_small:.0f}% of a two-worker step at batch "
            f"{small} and {100 * c_large:.0f}% at batch {large} (medians).")


def shared_rounding_words(apart, rounding):
    """How much rounding two float32 results of one function share, from how far `apart` they
    are and how far each is from the float64 value (`rounding`): three branches, no cause beyond
    what the two numbers show (the order of a reduction's additions moves it, so it is measured,
    never assumed)."""
    if not (apart >= 0 and rounding > 0):
        raise ValueError(f"apart={apart!r} and rounding={rounding!r}: a distance >= 0 and a "
                         "rounding error > 0")
    if apart < rounding / 10:
        return ("a tenth or less of what either misses of the float64 value: they round in much "
                "the same places, so what each misses is mostly the same rounding")
    if apart < rounding:
        return ("less than what either misses of the float64 value: they share part of their "
                "rounding, not most of it")
    return ("as much as either misses of the float64 value: they round in different places, "
            "two separate roundings of the same size")


# ------------------------------------------------ the profile and ddp_scratch chapters (issue 30)
# Their own block, appended: the sentences above belong to the fixes and scaling chapters.
__all__ += ["simulated_devices_words", "same_code_words", "loader_step_words",
            "compute_split_words", "allreduce_split_words", "overlap_lengthens_words",
            "alone_prediction_words", "thesis_words"]


def _spread(r):
    n = len(r.samples)
    return f"{r.median:.2f}x ({r.lo:.2f}-{r.hi:.2f}, {n} round{'s' * (n != 1)})"


def simulated_devices_words(two, halves):
    """Two devices simulated in one process against one device (Ratio: one's time / two's), and
    the control that can explain a 'faster': one device running the two halves of each batch in
    turn (Ratio: one's time / the halves'). The half batches are named as the cause only where
    the control was resolved faster too."""
    _check(two), _check(halves)
    control = f"one device running the two halves of each batch in turn was {_spread(halves)}"
    if two.verdict == "slower":
        return (f"slower than one ({_spread(two)}): the two replicas take turns on the same core, "
                "and the second brings its own operators (counted below)")
    if two.verdict == "within noise":
        return (f"within noise of one ({_spread(two)}): this run cannot tell them apart, as "
                "expected of two replicas that take turns on the same core")
    if two.verdict == "cannot tell":
        return f"not told apart from one ({_spread(two)}: one round, no spread)"
    if halves.verdict == "faster":
        return (f"faster than one ({_spread(two)}), and so was the control: {control}, faster. "
                "The half "
                "batches, not a second device, made the step shorter: on this core half a batch "
                "costs less than half as much (why, this run does not say)")
    return (f"faster than one ({_spread(two)}), while the control was not resolved faster "
            f"({control}, "
            f"{halves.verdict}): this run does not say why")


def same_code_words(r):
    """The same code on the same tensors, after the same warm-up, timed in two cells (Ratio,
    unpaired: the earlier cell's time / the later one's): a resolved difference can only be the
    machine's, which is why comparisons are made in turns, never between cells."""
    _check(r)
    if r.verdict in ("faster", "slower"):
        return (f"{r.median:.2f} times as fast ({r.lo:.2f}-{r.hi:.2f}, unpaired: "
                f"{r.verdict}). The code, its tensors and its warm-up were the same, so what "
                "changed between the two cells is the machine (the other work on its cores): "
                "why every comparison in this chapter is made in turns, never between cells")
    return (f"{r.median:.2f} times as fast ({r.lo:.2f}-{r.hi:.2f}, unpaired: {r.verdict}): the "
            "two cells cannot be told apart")


def loader_step_words(r, data_ms, diff_ms):
    """The one-device step fed by the loader against the same step on resident tensors, timed in
    the same rounds (Ratio: the resident step's time / the loader step's), with the loader
    step's median data phase and the medians' difference (milliseconds, loader minus resident)."""
    _check(r)
    if r.verdict == "slower" and diff_ms > 0:
        share = (": the whole difference" if data_ms >= diff_ms else
                 "; the rest this run does not explain")
        return (f"slower ({_spread(r)}): {diff_ms:.1f} ms more a step (medians), of which its "
                f"data phase took {data_ms:.1f} ms{share}")
    if r.verdict == "faster":
        return (f"faster ({_spread(r)}) although it also waits for the loader "
                f"({data_ms:.1f} ms a step): this run does not say why")
    return (f"{r.verdict} ({_spread(r)}): its data phase took {data_ms:.1f} ms a step, which "
            "this run cannot tell from the noise")


def compute_split_words(cpu_vs_half, off_core, compute_ms, cpu_ms, one_ms, one_cpu_ms, k=2):
    """Why each of k workers computed for more than 1/k of one worker's compute, from measured
    times: `cpu_vs_half` (Ratio: a worker's CPU time of compute / one worker's over k, repeat by
    repeat: above 1 means the share itself cost more on the core), `off_core` (Ratio: a worker's
    compute wall time / its CPU time: above 1 means it spent time off its core), and the medians
    (milliseconds) of a worker's compute and its CPU time, and one worker's."""
    _check(cpu_vs_half), _check(off_core)
    head = (f"each of {k} workers computed for {compute_ms:.1f} ms a step, against 1/{k} of one "
            f"worker's {one_ms:.1f} ms, {one_ms / k:.1f}; on its core (its thread's CPU time) "
            f"{cpu_ms:.1f} ms, against 1/{k} of one worker's {one_cpu_ms:.1f}, "
            f"{one_cpu_ms / k:.1f} (medians)")
    if off_core.lo > 1:
        away = (f"; the rest of its compute, {compute_ms - cpu_ms:.1f} ms, it spent off its core "
                f"(wall time / CPU time {_spread(off_core)}): waiting for a core that other "
                f"threads held (one worker alone spent {one_ms - one_cpu_ms:.1f} ms of its "
                "compute off its core)")
    else:
        away = (f"; its wall time and CPU time were not told apart ({_spread(off_core)}), so it "
                f"did not measurably lose its core, while one worker alone spent "
                f"{one_ms - one_cpu_ms:.1f} ms of its compute off its core")
    if cpu_vs_half.lo > 1:
        share = (f": its share cost more than 1/{k} on the core itself "
                 f"({_spread(cpu_vs_half)} of it)")
    elif cpu_vs_half.hi < 1:
        share = f": its share cost less than 1/{k} on the core ({_spread(cpu_vs_half)} of it)"
    else:
        share = f": on the core its share cost about 1/{k} ({_spread(cpu_vs_half)} of it)"
    return head + share + away


def allreduce_split_words(comm_ms, wait_ms, after_ms, alone):
    """A worker's all-reduce in the step, split on the shared clock of the machine's processes:
    `wait_ms`, waiting for the other workers to arrive, and `after_ms`, from the last arrival to
    its end (medians, milliseconds), against the same all-reduce timed `alone` (a Measurement,
    seconds, a barrier before each call)."""
    lo, hi, med = alone.lo * 1e3, alone.hi * 1e3, alone.median * 1e3
    head = (f"of its {comm_ms:.2f} ms in the all-reduce a step, rank 0 waited {wait_ms:.2f} ms "
            f"for the other worker to arrive, and {after_ms:.2f} ms passed after both had arrived, "
            f"against {med:.2f} ms ({lo:.2f}-{hi:.2f}) for the same all-reduce alone (medians)")
    if after_ms > hi:
        return (head + ": after both had arrived it still took longer than alone, and why, "
                "this run does not say")
    if after_ms < lo:
        return head + ": after both had arrived it took no longer than alone"
    return head + ": after both had arrived it took as long as alone, within its spread"


def overlap_lengthens_words(step, compute):
    """Overlap against all-reduce-after-backward on one core per rank: the step (Ratio: after's /
    overlap's) and backward's compute (Ratio: after's compute / overlap's, paired rounds; below
    1 means overlap lengthened it). The core shared with gloo's threads is named as the cause of
    a longer step only where the compute was resolved longer with overlap."""
    _check(step), _check(compute)
    grew = compute.verdict == "slower"
    why = (f"backward's compute itself was longer with overlap ({_spread(compute)}: slower), "
           "since gloo's threads ran the all-reduces on the core autograd needed" if grew else
           f"backward's compute was shorter with overlap ({_spread(compute)})"
           if compute.verdict == "faster" else
           "backward's compute with overlap could not be told from its compute without "
           f"({_spread(compute)})")
    if step.verdict == "slower":
        return ("overlap lengthened the step here: " + why
                + ("" if grew else "; so why, this run does not say"))
    if step.verdict == "faster":
        return ("overlap shortened the step here" + (", although " + why if grew else ""))
    return ("this run cannot tell whether overlap lengthened or shortened the step here; "
            + why)


def alone_prediction_words(predictions):
    """Speed-ups predicted from the all-reduce timed alone, each against its measured Ratio:
    `predictions` a list of (name, predicted speed-up, Ratio). '2.00 times at batch 256, outside
    the measured 1.05-1.28, and ...'."""
    parts = []
    for name, p, r in predictions:
        _check(r)
        where = "inside" if r.lo <= p <= r.hi else "outside"
        parts.append(f"{p:.2f} times at {name}, {where} the measured {r.lo:.2f}-{r.hi:.2f}")
    if not parts:
        raise ValueError("alone_prediction_words needs at least one (name, predicted, Ratio)")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", and " + parts[-1]


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
