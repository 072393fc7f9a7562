"""The fixes chapter's remaining sentences chosen by its numbers: the best variant, the compiled
step, the ablation, the regimes' table, the emulated and the real overlap, the benchmark's rows
and the GPU run's status, one function each with a branch per case (tests/test_verdicts_fixes.py),
so that no hidden notebook cell decides what a sentence says.
"""
from ...timing import ratio
from .fixes_verdicts import ablation_credit
from .verdicts import _check, _places, compile_sentence, ratio_words

__all__ = ["gpu_status_words", "best_step_words", "compiled_step_words", "missed_words",
           "arith_note_words", "ablation_words", "regime_counts", "emulated_overlap_words",
           "real_overlap_words", "bench_accuracy_words", "bench_scratch_words", "device_words",
           "trace_order_words", "fusing_bound_words"]

# an exact (counted or modelled) ratio shows its effect beyond this margin, either way
EXACT_MARGIN = 0.05


def gpu_status_words(gpu_run, failed=""):
    """What the chapter says of its GPU figures: predictions where no GPU run is recorded
    (`gpu_run` None), else the run's sentence and scope (helpers.gpu_figures) and `failed`
    (helpers.failed_cells_words), which follows them."""
    if gpu_run is None:
        return ("no GPU run of this course has been recorded yet "
                "(reference/gpu_reference.json says so), so they are predictions.")
    return (f"the GPU figures at the end come from {gpu_run['sentence']}: "
            f"{gpu_run['scope']}." + failed)


def device_words(on_gpu):
    """'a GPU' or 'the CPU': where the chapter's variants ran."""
    return "a GPU" if on_gpu else "the CPU"


def best_step_words(best, best_s, r):
    """The fastest variant `best` (its median `best_s` seconds a step) against the reference
    (Ratio `r`, reference / best, timed in turns): named with its gain only where resolved
    faster; otherwise 'no variant resolved faster', with the spread or the single round."""
    _check(r)
    ms = f"{best_s * 1e3:.1f} ms"
    if r.verdict == "faster":
        return f"{ms} with the {best}, {ratio_words(r)}"
    if r.verdict == "cannot tell":
        return (f"{ms} at best (the {best}), from one round, which tells no variant apart "
                f"from the reference ({r.median:.2f}x)")
    return (f"{ms} at best (the {best}), no variant resolved faster than the reference "
            f"({r.lo:.2f}-{r.hi:.2f})")


def compiled_step_words(r=None, first_step_s=None, saved_s=None, epoch_steps=None,
                        short_last=False):
    """The compiled step's sentence (verdicts.compile_sentence), or, where quick mode compiled
    nothing (`r` None), that it was not measured."""
    if r is None:
        return ("Compiling was not measured here (quick mode: a first "
                "compile costs tens of seconds).")
    return compile_sentence(r, first_step_s, saved_s, epoch_steps, short_last=short_last)


def missed_words(verdicts):
    """The predictions that did not hold, from {name: held}: their names, or 'none'."""
    missed = [name for name, held in verdicts.items() if not held]
    return ", ".join(missed) if missed else "none"


def arith_note_words(kept_share=None):
    """The compiled step's note beside 'the same arithmetic': its conv2 computes `kept_share`
    of the plain one's outputs; '' where nothing was compiled (None)."""
    if kept_share is None:
        return ""
    return (f" (the compiled one less: its conv2 computes {kept_share:.0%} of the "
            "plain one's outputs)")


def ablation_words(rounds, times):
    """The compile ablation against the plain eager step, from `times` ({variant: Measurement},
    timed in turns: 'plain, eager', 'lenet_fused, eager' and, unless quick mode compiled
    nothing, 'plain, compiled' and 'lenet_fused, compiled'). Returns dict(text, summary): the
    summary credits via ablation_credit."""
    base = times["plain, eager"]
    eager = ratio(base, times["lenet_fused, eager"])
    if "plain, compiled" not in times:
        return dict(text=(f"Quick mode compiles nothing: `lenet_fused` eager was "
                          f"{ratio_words(eager)} against the plain eager step."),
                    summary="this run compiled nothing (quick mode), so it credits neither")
    compiled = ratio(base, times["plain, compiled"])
    both = ratio(base, times["lenet_fused, compiled"])
    rewrite = ratio(times["plain, compiled"], times["lenet_fused, compiled"])
    credit = ablation_credit(eager, compiled, both, rewrite)
    text = (f"Against the plain eager step, over {rounds} rounds, "
            f"`lenet_fused` eager was {ratio_words(eager)}, the plain LeNet compiled "
            f"{ratio_words(compiled)}, and `lenet_fused` compiled {ratio_words(both)}; "
            f"compiled, `lenet_fused` was {ratio_words(rewrite)} against the "
            f"plain LeNet. So {credit['text']}.")
    return dict(text=text, summary=credit["summary"])


def regime_counts(rows):
    """From the regimes' table rows (dicts with fix, how, verdict, spread, median): the timed
    rows resolved faster (their names, or 'none', and how many), and how many rows show their
    effect: timed and faster, or exact (counted or modelled) with a gain above the margin."""
    timed = [r["fix"] for r in rows
             if r["how"].startswith("timed") and r["verdict"] == "faster"]
    shown = [r["fix"] for r in rows if r["verdict"] == "faster"
             or r["spread"] == "exact" and r["median"] > 1 + EXACT_MARGIN]
    return dict(timed=", ".join(timed) if timed else "none", n_timed=len(timed),
                n_shown=len(shown), n=len(rows))


def emulated_overlap_words(ratio):
    """Overlap on the emulated clock: `ratio`, the step with the all-reduce after backward over
    the overlapped one (modelled, exact). Returns dict(text, unit): shorter beyond the margin,
    longer (the reverse of the model) below it, else within it."""
    fast = f"overlap made the step {ratio:.2f} times as fast (modelled, not measured)"
    if ratio > 1 + EXACT_MARGIN:
        return dict(text=f"On the emulated clock {fast}", unit="shorter step")
    if ratio < 1 - EXACT_MARGIN:
        return dict(text=f"On the emulated clock {fast}: the reverse of the model",
                    unit="longer step")
    return dict(text=("On the emulated clock this run's overlap left the step within 5% of "
                      f"the all-reduce after backward ({ratio:.2f} times as fast, "
                      "modelled): this run does not show its effect there"),
                unit="within 5%")


def real_overlap_words(r=None):
    """Fix 4 timed on LeNet against the flat step (Ratio `r`; None where it did not run)."""
    if r is None:
        return "was not measured"
    _check(r)
    return (f"was {r.median:.2f} times as fast as the flat step "
            f"({r.lo:.2f}-{r.hi:.2f}: {r.verdict}; not resolvable on simulated devices that "
            "take turns on one CPU)")


def bench_accuracy_words(steps, best_acc, rounds, chance_below=0.3):
    """What the benchmark's accuracies say after `steps` steps: nothing where even the best row's
    median (`best_acc`) is below `chance_below` (LeNet at 0.01 has not left chance), else that
    they are medians over `rounds` seeds, to compare with their spreads."""
    if best_acc < chance_below:
        return (f"At this size each row trains for only {steps} steps: LeNet, "
                "initialised at 0.01, has not left chance yet, so the accuracies say "
                "nothing about the trainers.")
    return (f"After {steps} steps the rows' accuracies are medians over "
            f"{rounds} seeds; rows fed the same batches differ only by "
            "rounding, which the plateau of the 0.01-initialised LeNet amplifies, so "
            "compare them with their spreads.")


def bench_scratch_words(scratch=None):
    """The benchmark's scratch row against torch's DDP on two ranks (its ratio dict: median,
    spread, verdict), or '' where that row did not run. Whole epochs only: no cause named."""
    if scratch is None:
        return ""
    lo, hi = scratch["spread"]
    return (f" The `scratch` row is Part III's DDPFromScratch on the same two ranks: "
            f"{scratch['median']:.2f} times as fast as torch's DDP "
            f"({lo:.2f}-{hi:.2f}: {scratch['verdict']}). This run times whole epochs only, so "
            "it names no cause for a difference between them.")


def trace_order_words(hooks, default_ms, one_ms, default_total_ms, one_total_ms):
    """Whether the profiler traces rank the default and one bucket as the hooks do: `hooks` the
    Ratio of the default's exposed time to one bucket's (hooks, round by round); the others
    the traces' exposed and total all-reduce per step (ms, one trace each). Names no cause."""
    _check(hooks)
    total = (f" In total the traces' all-reduce took {default_total_ms:.1f} ms a step with the "
             f"default and {one_total_ms:.1f} ms with one bucket.")
    if hooks.verdict not in ("faster", "slower"):
        return ("The hooks did not tell the default's exposed time from one bucket's, so "
                "whether the traces rank the two as the hooks do cannot be told." + total)
    hooks_one_less = hooks.verdict == "faster"
    if (one_ms < default_ms) == hooks_one_less and one_ms != default_ms:
        return "The traces rank the default and one bucket as the hooks do." + total
    return ("The traces rank the default and one bucket in the opposite order to the hooks; "
            "this run does not show why." + total)


def _against_bound(r, bound, what, whose, note=""):
    """'1.00 times as fast as the `nn.Module` step (0.86-1.05: within noise), against the bound
    of 1.33: inside it': a Ratio against the most a step that keeps its convolutions can gain
    (`bound`), inside it, beyond it, or with a spread that holds it; an end that would print as
    the bound, and the bound, to the decimals that tell them apart."""
    _check(r)
    lo, hi = ([max(_places(x, 1.0), _places(x, bound)) for x in (r.lo, r.hi)])
    b = f"{bound:.{max(_places(bound, r.lo), _places(bound, r.hi))}f}"
    head = (f"{r.median:.2f} times as fast as {what} ({r.lo:.{lo}f}-{r.hi:.{hi}f}: "
            f"{r.verdict}), against {whose} bound of {b}{note}")
    if r.hi < bound:
        return f"{head}: inside it"
    if r.lo > bound:
        return f"{head}: beyond it"
    return f"{head}: its spread holds the bound, so this run cannot tell them apart"


def fusing_bound_words(fused, bound, compiled=None, compiled_bound=None):
    """Exercise 3's bound (the most a step that keeps its convolutions can gain: 1 / their share
    of it) against the measured steps: `fused` the Ratio of the `nn.Module` step's time to fix
    5's eager fused step's, `bound` the `nn.Module` step's; `compiled` the Ratio of the fused
    step's time to fix 6's compiled step's (None where nothing was compiled), `compiled_bound`
    the fused step's own. Each inside, beyond or not told from its bound; a step beyond it is
    not explained by these words (the chapter says what fix 6 changes). Returns dict(fused,
    compiled), each a sentence without its final period."""
    words = dict(fused="Fix 5's eager fused step runs the same convolutions: it was "
                 + _against_bound(fused, bound, "the `nn.Module` step", "the"))
    if compiled is None:
        words["compiled"] = ("This run compiled nothing (quick mode), so it does not set fix 6's "
                             "compiled step against the bound")
    elif compiled_bound is None:
        raise ValueError("fusing_bound_words: a compiled Ratio needs the fused step's own bound")
    else:
        words["compiled"] = "Fix 6's compiled step was " + _against_bound(
            compiled, compiled_bound, "the fused step", "the fused step's own",
            f" (its convolutions were {1 / compiled_bound:.0%} of it)")
    return words
