"""The fixes chapter's sentences chosen by its numbers (helpers/data_parallel/words/fixes_words.py):
every branch reached, the words a stored run shows unchanged for the same numbers."""
import pytest

import helpers
from helpers.data_parallel.words.verdicts import compile_sentence

FASTER = helpers.Ratio([1.2, 1.3, 1.4])
SLOWER = helpers.Ratio([0.7, 0.8, 0.9])
NOISE = helpers.Ratio([0.9, 1.1, 1.3])
ONE = helpers.Ratio([1.5])


def test_the_gpu_status_is_a_prediction_without_a_recorded_run():
    assert helpers.gpu_status_words(None, " ignored") == (
        "no GPU run of this course has been recorded yet (reference/gpu_reference.json says "
        "so), so they are predictions.")
    run = dict(sentence="the run of 2026-12-01 on one H100", scope="one GPU only")
    assert helpers.gpu_status_words(run, " Two cells failed.") == (
        "the GPU figures at the end come from the run of 2026-12-01 on one H100: one GPU "
        "only. Two cells failed.")
    assert helpers.device_words(True) == "a GPU" and helpers.device_words(False) == "the CPU"


def test_the_best_variant_is_named_with_its_gain_only_where_resolved_faster():
    assert helpers.best_step_words("fused step", 0.0123, FASTER) == (
        "12.3 ms with the fused step, 1.30 times as fast (1.20-1.40: faster)")
    for r in (NOISE, SLOWER):
        got = helpers.best_step_words("fused step", 0.0123, r)
        assert got == (f"12.3 ms at best (the fused step), no variant resolved faster than the "
                       f"reference ({r.lo:.2f}-{r.hi:.2f})")
    one = helpers.best_step_words("fused step", 0.0123, ONE)
    assert "from one round" in one and "1.50x" in one and "times as fast" not in one
    with pytest.raises(TypeError, match="helpers.Ratio"):
        helpers.best_step_words("fused step", 0.0123, 1.3)


def test_the_compiled_step_words_follow_compile_sentence_or_say_it_was_not_measured():
    assert helpers.compiled_step_words() == (
        "Compiling was not measured here (quick mode: a first compile costs tens of seconds).")
    assert helpers.compiled_step_words(FASTER, 20.0, 0.002, 235, short_last=True) == \
        compile_sentence(FASTER, 20.0, 0.002, 235, short_last=True)
    assert "never pays back" in helpers.compiled_step_words(SLOWER, 20.0, -0.001, 235)


def test_the_missed_predictions_and_the_arithmetic_note():
    assert helpers.missed_words({"a": True, "b": True}) == "none"
    assert helpers.missed_words({"a": False, "b": True, "c": False}) == "a, c"
    assert helpers.arith_note_words() == ""
    assert helpers.arith_note_words(64 / 81) == (
        " (the compiled one less: its conv2 computes 79% of the plain one's outputs)")


def times(**ratios):
    """Measurements whose ratios against 'plain, eager' (1.0 s a round) are the given ones."""
    out = {"plain, eager": helpers.Measurement([1.0, 1.0, 1.0])}
    for name, r in ratios.items():
        out[name] = helpers.Measurement([1.0 / x for x in r.samples])
    return out


def test_the_ablation_words_in_quick_mode_and_compiled():
    quick = helpers.ablation_words(41, times(**{"lenet_fused, eager": FASTER}))
    assert quick["text"].startswith("Quick mode compiles nothing: `lenet_fused` eager was 1.30 "
                                    "times as fast (1.20-1.40: faster)")
    assert quick["summary"] == "this run compiled nothing (quick mode), so it credits neither"
    full = helpers.ablation_words(41, times(**{"lenet_fused, eager": NOISE,
                                              "plain, compiled": FASTER,
                                              "lenet_fused, compiled": FASTER}))
    assert full["text"].startswith("Against the plain eager step, over 41 rounds, "
                                   "`lenet_fused` eager was 1.10 times as fast")
    assert full["text"].endswith("this run credits the compiler.")
    assert "the plain LeNet compiled 1.30 times as fast" in full["text"]


def row(fix, how, verdict, median, spread="0.9-1.1"):
    return dict(fix=fix, how=how, verdict=verdict, median=median, spread=spread)


def test_the_regime_counts_count_resolved_timed_rows_and_exact_gains_beyond_the_margin():
    rows = [row("data", "timed in turns", "faster", 3.0),
            row("flat", "timed in turns", "within noise", 1.1),
            row("ring", "counted", "fewer sent", 2.0, "exact"),
            row("overlap", "modelled", "within 5%", 1.04, "exact"),
            row("fused", "timed in turns", "slower", 0.8)]
    assert helpers.regime_counts(rows) == dict(timed="data", n_timed=1, n_shown=2, n=5)
    assert helpers.regime_counts(rows[1:2])["timed"] == "none"


def test_the_emulated_overlap_has_a_branch_for_shorter_longer_and_within_the_margin():
    shorter = helpers.emulated_overlap_words(1.30)
    assert shorter == dict(text="On the emulated clock overlap made the step 1.30 times as fast "
                                "(modelled, not measured)", unit="shorter step")
    longer = helpers.emulated_overlap_words(0.90)
    assert longer["text"].endswith("(modelled, not measured): the reverse of the model")
    assert longer["unit"] == "longer step"
    within = helpers.emulated_overlap_words(1.02)
    assert within["unit"] == "within 5%" and "does not show its effect" in within["text"]


def test_the_real_overlap_words():
    assert helpers.real_overlap_words() == "was not measured"
    assert helpers.real_overlap_words(NOISE) == (
        "was 1.10 times as fast as the flat step (0.90-1.30: within noise; not resolvable on "
        "simulated devices that take turns on one CPU)")


def test_the_benchmark_accuracy_and_scratch_words():
    assert "has not left chance yet" in helpers.bench_accuracy_words(24, 0.1, 3)
    assert helpers.bench_accuracy_words(24, 0.7, 3).startswith(
        "After 24 steps the rows' accuracies are medians over 3 seeds")
    assert helpers.bench_scratch_words() == ""
    got = helpers.bench_scratch_words(dict(median=0.95, spread=[0.9, 1.01],
                                           verdict="within noise"))
    assert got == (" The `scratch` row is Part III's DDPFromScratch on the same two ranks: 0.95 "
                   "times as fast as torch's DDP (0.90-1.01: within noise). This run times "
                   "whole epochs only, so it names no cause for a difference between them.")


def test_the_trace_order_sentence_agrees_disagrees_or_cannot_tell():
    one_more = helpers.Ratio([0.8, 0.84, 0.86])   # hooks: one bucket exposes more
    assert "in the opposite order" in helpers.trace_order_words(one_more, 20.6, 16.1, 27.8, 16.2)
    agree = helpers.trace_order_words(one_more, 12.0, 16.1, 27.8, 16.2)
    assert agree.startswith("The traces rank the default and one bucket as the hooks do.")
    assert "27.8 ms a step with the default and 16.2 ms with one bucket" in agree
    noise = helpers.trace_order_words(helpers.Ratio([0.9, 1.0, 1.1]), 20.6, 16.1, 27.8, 16.2)
    assert "cannot be told" in noise and "opposite" not in noise
    assert "as the hooks do." in helpers.trace_order_words(
        helpers.Ratio([1.2, 1.3, 1.25]), 20.6, 16.1, 27.8, 16.2)


def test_the_fusing_bound_holds_the_eager_fused_step_and_tells_where_the_compiled_one_fell():
    words = helpers.fusing_bound_words
    near_one = helpers.Ratio([0.86, 1.0, 1.05])
    # the stored run: 75.3% of the nn.Module step and 74.6% of the fused step are convolutions
    got = words(near_one, 1 / 0.753, helpers.Ratio([1.82, 1.87, 2.12]), 1 / 0.746)
    assert got["fused"] == ("Fix 5's eager fused step runs the same convolutions: it was 1.00 "
                            "times as fast as the `nn.Module` step (0.86-1.05: within noise), "
                            "against the bound of 1.33: inside it")
    assert got["compiled"] == ("Fix 6's compiled step was 1.87 times as fast as the fused step "
                               "(1.82-2.12: faster), against the fused step's own bound of 1.34 "
                               "(its convolutions were 75% of it): beyond it")
    inside = words(near_one, 1.33, helpers.Ratio([1.1, 1.2, 1.3]), 1.34)["compiled"]
    assert inside.endswith("bound of 1.34 (its convolutions were 75% of it): inside it")
    # a spread that holds the bound; an end that prints as the bound is printed apart from it
    held = words(helpers.Ratio([1.2, 1.3, 1.3304]), 1.33)["fused"]
    assert held.endswith("(1.20-1.3304: faster), against the bound of 1.3300: its spread holds "
                         "the bound, so this run cannot tell them apart")
    assert "beyond it" in words(helpers.Ratio([1.4, 1.5, 1.6]), 1.33)["fused"]
    quick = words(near_one, 1.33)["compiled"]
    assert quick.startswith("This run compiled nothing (quick mode)")
    with pytest.raises(ValueError, match="own bound"):
        words(near_one, 1.33, FASTER)
    with pytest.raises(TypeError, match="helpers.Ratio"):
        words(1.0, 1.33)
