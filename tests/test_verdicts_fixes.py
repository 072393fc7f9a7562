"""The fixes chapter's sentences (helpers/data_parallel/words/fixes_verdicts.py): the compile
ablation credits only what resolved faster, the rewrite eager and compiled apart; the fused step's
and the compression hook's words follow their verdicts."""
import pytest

import helpers
from helpers.data_parallel.words.fixes_verdicts import ablation_credit

FASTER = helpers.Ratio([1.2, 1.3, 1.4])
SLOWER = helpers.Ratio([0.7, 0.8, 0.9])
NOISE = helpers.Ratio([0.9, 1.1, 1.3])
ONE = helpers.Ratio([1.5])


def credit(rewrite, compiler, both, rewrite_compiled):
    return ablation_credit(rewrite, compiler, both, rewrite_compiled)["text"]


def test_the_ablation_credits_the_rewrite_where_it_paid_only_compiled():
    # the round-4 run: compiler faster, rewrite eager within noise, compiled faster
    got = ablation_credit(NOISE, FASTER, FASTER, FASTER)
    assert got["text"] == (
        "the compiler alone was faster, the rewrite paid only compiled, against the plain LeNet "
        "compiled (eager: within noise), and the two together were faster: this run credits "
        "the compiler and the rewrite under it")
    assert "the rewrite paid only compiled (1.30x, 1.20-1.40)" in got["summary"]
    assert "(eager: within noise, 1.10x, 0.90-1.30)" in got["summary"]
    assert credit(NOISE, NOISE, FASTER, FASTER).endswith(
        "this run credits the rewrite under the compiler")


def test_the_ablation_credits_the_compiler_alone_when_the_rewrite_did_not_pay():
    # the 21:48 store: the rewrite within noise eager and compiled
    got = credit(NOISE, FASTER, FASTER, NOISE)
    assert "the rewrite paid neither eager (within noise) nor compiled" in got
    assert got.endswith("this run credits the compiler")
    eager_only = credit(FASTER, FASTER, FASTER, SLOWER)
    assert "the rewrite paid only eager (compiled, against the plain LeNet compiled: slower)" \
        in eager_only and eager_only.endswith("credits the compiler")


def test_the_ablation_credits_both_and_the_unsplit_combination():
    assert "the rewrite paid both eager and compiled" in credit(FASTER, FASTER, FASTER, FASTER)
    assert credit(FASTER, FASTER, FASTER, FASTER).endswith(
        "credits the compiler and the rewrite under it")
    assert credit(NOISE, NOISE, FASTER, NOISE).endswith(
        "credits the two together and cannot split the gain between them")


def test_the_ablation_credits_nothing_when_the_two_together_did_not_resolve():
    for both in (NOISE, SLOWER, ONE):
        got = credit(NOISE, FASTER, both, FASTER)
        assert got.endswith("the compiled step gained nothing this run resolved")
        assert "credits" not in got
    assert "together were not told apart (one round" in credit(NOISE, FASTER, ONE, FASTER)
    with pytest.raises(TypeError, match="helpers.Ratio"):
        ablation_credit(NOISE, FASTER, FASTER, 1.47)


def test_the_fused_step_words_have_a_branch_per_verdict():
    def words(r):
        return helpers.fused_step_words(r, 136, 54, 4, 20)
    fast = words(FASTER)
    assert fast["text"] == (
        "At global batch 4 the fused step ran 54 operators a step against the plain step's 136 "
        "(counted), and it was 1.30 times as fast (1.20-1.40 over 3 blocks of 20 steps in "
        "turns: faster) in this thread's CPU time")
    assert "resolved faster" in fast["summary"]
    assert "does not explain" in words(SLOWER)["text"]
    noise = words(NOISE)
    assert "could not tell them apart in this thread's CPU time" in noise["text"]
    assert "faster" not in noise["text"] and "did not resolve" in noise["summary"]
    assert "no verdict" in words(ONE)["text"]
    on_gpu = helpers.fused_step_words(FASTER, 136, 54, 4, 20, clock="wall time")
    assert on_gpu["text"].endswith("in wall time") and "CPU" not in on_gpu["summary"]
    with pytest.raises(ValueError, match="operator counts above 0"):
        helpers.fused_step_words(FASTER, 136, 0, 4, 20)


def test_the_compression_words_follow_the_step_verdict():
    assert helpers.compression_words(NOISE) == (
        "on two processes of one machine this run did not resolve it (its step 1.10 times as "
        "fast as the default's, 0.90-1.30)")
    assert "faster too" in helpers.compression_words(FASTER)
    assert "does not explain" in helpers.compression_words(SLOWER)
    assert "no verdict" in helpers.compression_words(ONE)


def test_the_bench_and_the_step_table_are_reconciled_only_where_they_disagree():
    pieces = {"resident data": "within noise", "fused step": "within noise"}
    said = helpers.bench_step_words("faster", pieces)
    assert said.startswith(" The per-step table did not resolve the resident data and fused "
                           "step rows faster")
    assert "one device" in said and "two simulated devices" in said and "whole epochs" in said
    assert "does not time those differences apart" in said and "because" not in said
    assert "here with resident data and fused step together" in said
    run = helpers.bench_step_words("faster", pieces, combined=["resident data", "fused step",
                                                               "CUDA graph"])
    assert "here with resident data, fused step and CUDA graph together" in run
    assert helpers.bench_step_words("faster", {**pieces, "fused step": "faster"}) == ""
    assert helpers.bench_step_words("within noise", pieces) == ""
    told = helpers.bench_step_words("within noise", {**pieces, "resident data": "slower"})
    assert told.startswith(" The per-step table resolved the resident data row where")
    assert "did not resolve" in helpers.bench_step_words("slower", {"fused step": "faster"})
    assert helpers.bench_step_words("cannot tell", pieces) == ""
    assert helpers.bench_step_words("faster", {}) == ""
    with pytest.raises(ValueError):
        helpers.bench_step_words("quicker", pieces)


def test_the_gpu_runs_failed_cells_are_named_from_the_reference_file(tmp_path):
    import json
    ref = {"exists": True, "gpu": "G", "torch": "t", "date": "d", "command": "c",
           "commit": "abc1234", "steps": {"nbval": {"failed": [
               "book.gpus.ipynb::Cell 22", "book.part4.fixes.ipynb::Cell 59",
               "book.part4.fixes.ipynb::Cell 28"]}}}
    path = tmp_path / "gpu_reference.json"
    path.write_text(json.dumps(ref))
    said = helpers.failed_cells_words("book/part4/fixes.ipynb", str(path))
    assert said.startswith(" That run also executed this notebook's code cells")
    # nbval's "Cell N" counts code cells only, from 0: the 29th and the 60th code cells
    assert "2 of them failed there (the 29th and 60th code cells of the notebook at commit " \
           "abc1234, counting code cells only" in said and "not why" in said
    assert "1 of them failed there (the 23rd code cell of" in helpers.failed_cells_words(
        "book/gpus.ipynb", str(path))
    assert helpers.failed_cells_words("book/part4/scaling.ipynb", str(path)) == ""
    ref["steps"] = {}
    path.write_text(json.dumps(ref))
    assert helpers.failed_cells_words("book/part4/fixes.ipynb", str(path)) == ""


def test_size_check_holds_only_when_the_predicted_size_is_inside_the_spread():
    # a spread wholly above the prediction: 1.66x (1.03-2.21) where the data phase allowed 1.1x
    what = "removing the reference's data phase"
    wide = helpers.Ratio([1.66, 1.8, 1.7, 1.9, 1.6])
    larger = helpers.size_check(wide, 1.1, what)
    assert larger["verdict"] == "larger" and not larger["held"]
    assert larger["text"] == (
        "more than the 1.10x that removing the reference's data phase predicts (the spread's "
        "low end, 1.60, is above it): removing the reference's data phase explains only part "
        "of the gain, and this run does not explain the rest")
    held = helpers.size_check(helpers.Ratio([1.05, 1.1, 1.15]), 1.1, what)
    assert held["verdict"] == "as predicted" and held["held"]
    assert held["text"] == ("the size that removing the reference's data phase predicts "
                            "(1.10x, inside the spread 1.05-1.15)")
    # inside a spread that also holds 1: held, but the run cannot tell that size from none
    wide_noise = helpers.size_check(helpers.Ratio([0.61, 1.09, 2.0]), 1.1, what)
    assert wide_noise["held"] and wide_noise["text"] == (
        "a spread that holds the 1.10x that removing the reference's data phase predicts, and "
        "1 as well: this run cannot tell that size from no change")
    smaller = helpers.size_check(helpers.Ratio([0.98, 1.0, 1.02]), 1.1, what)
    assert smaller["verdict"] == "smaller" and not smaller["held"]
    assert "(the spread's high end, 1.02, is under it)" in smaller["text"]
    # direction alone is not enough: faster, but not by the predicted size
    assert FASTER.verdict == "faster" and not helpers.size_check(FASTER, 1.8, what)["held"]
    one = helpers.size_check(ONE, 1.5, what)
    assert one["verdict"] == "cannot tell" and not one["held"]


def test_size_check_prints_an_end_that_rounds_to_the_prediction_to_the_decimals_that_differ():
    got = helpers.size_check(helpers.Ratio([1.1004, 1.2, 1.3]), 1.1, "a model")
    assert got["verdict"] == "larger" and "the spread's low end, 1.1004, is above it" in got["text"]
    three = helpers.size_check(helpers.Ratio([1.104, 1.2, 1.3]), 1.1, "a model")
    assert "the spread's low end, 1.104, is above it" in three["text"]
    with pytest.raises(ValueError):
        helpers.size_check(FASTER, 0, "a model")
    with pytest.raises(TypeError):
        helpers.size_check(1.2, 1.1, "a model")
