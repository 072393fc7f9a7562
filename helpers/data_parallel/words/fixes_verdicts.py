"""The sentences the fixes chapter builds from its compile ablation, its small-batch timing of the
fused step and its compression hook, one function each with a branch per verdict
(tests/test_verdicts_fixes.py), as verdicts.py does for the other Part IV measurements. A part
of a gain is credited only where its own ratio was resolved faster.
"""
from ...words import plural
from .verdicts import _check, _digits

__all__ = ["ablation_credit", "fused_step_words", "compression_words", "bench_step_words",
           "size_check"]

_STATE = {"faster": "faster", "slower": "slower", "within noise": "within noise",
          "cannot tell": "not told apart (one round, no verdict)"}


def size_check(r, predicted, what):
    """Whether a measured Ratio `r` (base time / new time, timed in turns) has the size a model
    predicts: `predicted`, the ratio the model gives (e.g. a step's time over the same step less
    its data phase, timed inside it), `what` the model in words ("removing its data phase").

    Returns dict(verdict, held, text): 'as predicted' (held) when `predicted` lies within r's
    spread (lo-hi); 'larger' when the whole spread is above it (the model explains only part of
    the gain); 'smaller' when the whole spread is below it; 'cannot tell' from one round (no
    spread, so no verdict on the size either). Where the spread also holds 1, `text` says that
    the run cannot tell the size from no change. `text` follows "... {ratio}, " in a sentence."""
    _check(r)
    if not predicted > 0:
        raise ValueError(f"a predicted ratio is above 0, got {predicted!r}")
    pred = f"{predicted:.2f}x"
    if r.verdict == "cannot tell":
        verdict = "cannot tell"
        text = (f"one round has no spread, so this run cannot say whether that is the {pred} "
                f"that {what} predicts")
    elif r.lo > predicted:
        verdict = "larger"
        text = (f"more than the {pred} that {what} predicts (the spread's low end, "
                f"{_digits(r.lo, predicted)}, is above it): {what} explains only part of the "
                "gain, and this run does not explain the rest")
    elif r.hi < predicted:
        verdict = "smaller"
        text = (f"less than the {pred} that {what} predicts (the spread's high end, "
                f"{_digits(r.hi, predicted)}, is under it): the step gained less than {what} "
                "would give")
    else:
        verdict = "as predicted"
        spread = f"{_digits(r.lo, predicted)}-{_digits(r.hi, predicted)}"
        text = (f"the size that {what} predicts ({pred}, inside the spread {spread})"
                if r.lo > 1 or r.hi < 1 else
                f"a spread that holds the {pred} that {what} predicts, and 1 as well: this "
                "run cannot tell that size from no change")
    return dict(verdict=verdict, held=verdict == "as predicted", text=text)


def _fig(r, figures):
    """' (1.47x, 1.29-1.65)' where the figures are wanted, else nothing."""
    return f" ({r.median:.2f}x, {r.lo:.2f}-{r.hi:.2f})" if figures else ""


def _said(r, figures):
    """'within noise', or 'within noise, 1.06x, 0.85-1.61' where the figures are wanted."""
    return _STATE[r.verdict] + (f", {r.median:.2f}x, {r.lo:.2f}-{r.hi:.2f}" if figures else "")


def _credit(rewrite, compiler, both, rewrite_compiled, figures):
    def f(r):
        return _fig(r, figures)

    comp = f"the compiler alone was {_STATE[compiler.verdict]}{f(compiler)}"
    eager, compiled = rewrite.verdict == "faster", rewrite_compiled.verdict == "faster"
    vs = "against the plain LeNet compiled"
    if eager and compiled:
        rew = f"the rewrite paid both eager{f(rewrite)} and compiled{f(rewrite_compiled)}"
    elif compiled:
        rew = (f"the rewrite paid only compiled{f(rewrite_compiled)}, {vs} (eager: "
               f"{_said(rewrite, figures)})")
    elif eager:
        rew = (f"the rewrite paid only eager{f(rewrite)} (compiled, {vs}: "
               f"{_said(rewrite_compiled, figures)})")
    else:
        rew = (f"the rewrite paid neither eager ({_said(rewrite, figures)}) nor compiled, {vs} "
               f"({_said(rewrite_compiled, figures)})")
    together = f"the two together were {_STATE[both.verdict]}{f(both)}"
    if both.verdict != "faster":
        return (f"{comp}, {rew}, and {together}: the compiled step gained nothing this run "
                "resolved")
    parts = (["the compiler"] if compiler.verdict == "faster" else []) + (
        ["the rewrite under it" if compiler.verdict == "faster" else
         "the rewrite under the compiler"] if compiled else [])
    credit = (f"this run credits {' and '.join(parts)}" if parts else
              "this run credits the two together and cannot split the gain between them")
    return f"{comp}, {rew}, and {together}: {credit}"


def ablation_credit(rewrite, compiler, both, rewrite_compiled):
    """What the compile ablation credits, from four Ratios: against the plain eager step, the
    rewrite alone (`lenet_fused`, eager), the compiler alone (plain, compiled) and both
    (`lenet_fused`, compiled); and `rewrite_compiled`, the rewrite under the compiler
    (`lenet_fused` compiled against the plain LeNet compiled). The rewrite eager and compiled are
    judged apart, so that a rewrite that pays only compiled (the interaction) is credited.
    Returns {"text": the words after the ratios, "summary": the same with their figures}."""
    for r in (rewrite, compiler, both, rewrite_compiled):
        _check(r)
    return {key: _credit(rewrite, compiler, both, rewrite_compiled, figures)
            for key, figures in (("text", False), ("summary", True))}


def fused_step_words(r, ops_plain, ops_fused, batch, block, clock="this thread's CPU time"):
    """The fused step against the plain one at a small batch: `r` the Ratio of their times on
    `clock` (plain's / fused's, taken in turns, one sample per block of `block` steps), and the
    operators each runs a step (counted). Returns {"text", "summary"}; three branches, and no
    cause beyond the count."""
    _check(r)
    if batch < 1 or block < 1 or not ops_plain > 0 < ops_fused:
        raise ValueError(f"batch={batch!r}, block={block!r}, ops {ops_plain!r} and {ops_fused!r}: "
                         "give a batch and a block of at least 1 and operator counts above 0")
    count = (f"At global batch {batch} the fused step ran {ops_fused:.0f} operators a step "
             f"against the plain step's {ops_plain:.0f} (counted)")
    fig = (f"{r.median:.2f} times as fast ({r.lo:.2f}-{r.hi:.2f} over "
           f"{plural(len(r.samples), 'block')} of {block} steps in turns")
    if r.verdict == "faster":
        return dict(text=f"{count}, and it was {fig}: faster) in {clock}",
                    summary=(f"At batch {batch}, where the convolutions are small, the fused "
                             f"step was resolved faster than the plain step in {clock} "
                             f"({r.median:.2f}x, {r.lo:.2f}-{r.hi:.2f})"))
    if r.verdict == "slower":
        return dict(text=(f"{count}, yet it was {fig}: slower) in {clock}, which "
                          "this run does not explain"),
                    summary=(f"At batch {batch} the fused step was slower than the plain step in "
                             f"{clock} ({r.median:.2f}x, {r.lo:.2f}-{r.hi:.2f}), which this "
                             "run does not explain"))
    if r.verdict == "cannot tell":
        return dict(text=f"{count}; timed over one block, it has no verdict in {clock}",
                    summary=f"At batch {batch} one block of steps gave the fused step no verdict")
    return dict(text=(f"{count}, but this run could not tell them apart in {clock} ("
                      f"{fig}: within noise): timing did not resolve the operators it leaves "
                      "out"),
                summary=(f"At batch {batch} this run's timing did not resolve the fused step "
                         f"against the plain one ({r.median:.2f}x, {r.lo:.2f}-{r.hi:.2f}); "
                         "only the count shows what it removes"))


def compression_words(step):
    """What the bf16 compression hook's whole step (Ratio: the default's / the hook's) showed
    on two processes of one machine, after the prediction that it pays where the link is the
    bottleneck: three branches, no cause the run did not measure."""
    _check(step)
    fig = f"{step.median:.2f} times as fast as the default's, {step.lo:.2f}-{step.hi:.2f}"
    if step.verdict == "faster":
        return f"on two processes of one machine its step was faster too ({fig})"
    if step.verdict == "slower":
        return (f"on two processes of one machine its step was slower ({fig}), which this run "
                "does not explain")
    if step.verdict == "cannot tell":
        return f"on two processes of one machine one round gave its step no verdict ({fig})"
    return f"on two processes of one machine this run did not resolve it (its step {fig})"


_VERDICTS = ("faster", "slower", "within noise", "cannot tell")


def _rows(names):
    """'the resident data row', 'the resident data and fused step rows'."""
    names = list(names)
    joined = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"the {joined} {'row' if len(names) == 1 else 'rows'}"


def bench_step_words(bench_verdict, pieces, combined=None):
    """Where the benchmark's fast row against the reference (`bench_verdict`, over whole epochs)
    and the per-step table's verdicts on the fixes that row puts together (`pieces`: {fix:
    verdict}) disagree, one sentence naming how the two are set up, and no cause; "" where
    they agree (a piece resolved in the bench's direction, or nothing resolved either way) or
    where either has no verdict. `combined`: the fixes the bench's fast row ran together (from
    its row's note; by default the pieces), named so that a row run without compiling says so."""
    for v in (bench_verdict, *pieces.values()):
        if v not in _VERDICTS:
            raise ValueError(f"verdict {v!r}: one of {_VERDICTS}")
    if not pieces or bench_verdict == "cannot tell" or "cannot tell" in pieces.values():
        return ""
    resolved = {n: v for n, v in pieces.items() if v in ("faster", "slower")}
    if bench_verdict == "within noise":
        if not resolved:
            return ""
        told = (f"The per-step table resolved {_rows(resolved)} where the benchmark's whole "
                "epochs did not")
    else:
        if bench_verdict in resolved.values():
            return ""
        told = (f"The per-step table did not resolve {_rows(pieces)} {bench_verdict}, as "
                "the benchmark did the fast row")
    fixes = list(pieces if combined is None else combined)
    together = fixes[0] if len(fixes) == 1 else f"{', '.join(fixes[:-1])} and {fixes[-1]}"
    return (f" {told}. The two are set up differently: the benchmark runs the fast trainer, "
            f"here with {together} together, on one device and times whole epochs (the median "
            "from "
            "the second on), its rows taking turns round by round; the table runs each fix "
            "beside the one before it on two simulated devices, one step at a time, in turns "
            "step by step. This run does not time those differences apart.")
