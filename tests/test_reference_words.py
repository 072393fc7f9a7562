"""Sentences from measured figures: the GPU reference run beside the models (one_gpu_step,
helpers/reference_words.py): the fastest one-GPU step per training step, and a sentence for every
branch of the gpus chapter's fixed cost and roofline, the costs chapter's LeNet check, and the
network split's pipelined step against one device (causes only as possible ones)."""
import json

import pytest

import helpers


def _row(name, n, where, sec, note=""):
    return dict(name=name, n=n, where=where, note=note, sec_per_epoch=dict(median=sec))


def _write(tmp_path, bench, exists=True):
    ref = dict(exists=exists, gpu="GPU X", torch="2.x", date="today", command="cmd", bench=bench)
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(ref))
    return str(path)


def test_one_gpu_step_is_the_fastest_one_gpu_row_over_its_steps(tmp_path):
    bench = dict(batch_size=256, size=dict(subset=12800), rows=[
        _row("reference_1", 1, "process", 0.5), _row("fast_1", 1, "process", 0.03, "graph"),
        _row("shared_2", 2, "process", 0.01), _row("ddp_ranks_1", 1, "ranks", 0.001)])
    step = helpers.one_gpu_step(_write(tmp_path, bench))
    assert step["row"] == "fast_1" and step["note"] == "graph"
    assert step["steps_per_epoch"] == 50 and step["seconds"] == pytest.approx(0.03 / 50)
    bench["size"] = dict(subset=None)               # the whole set: 60,000 images
    assert helpers.one_gpu_step(_write(tmp_path, bench))["steps_per_epoch"] == 235
    assert helpers.one_gpu_step(_write(tmp_path, bench, exists=False)) is None
    assert helpers.one_gpu_step(_write(tmp_path, dict(bench, rows=[]))) is None


def test_the_committed_reference_has_a_lenet_step():
    step = helpers.one_gpu_step()
    if helpers.gpu_reference().get("exists"):
        assert 1e-5 < step["seconds"] < 1e-1 and step["batch"] > 0


def test_speed_words_has_three_branches():
    assert [helpers.speed_words(s) for s in (1.5, 0.5, 1.0)] == [
        "faster than", "slower than", "as fast as"]


def test_fixed_cost_words_prediction_measured_and_with_the_work_forgone():
    assert "a prediction" in helpers.fixed_cost_words()
    plain = helpers.fixed_cost_words(16.5e-6, where="GPU X, today")
    assert "(GPU X, today)" in plain and "16.5 µs a call" in plain and "GFLOP" not in plain
    assert "how fast the host issues them" in plain
    assert "(CUDA events; one reading, of one size)" in plain
    assert "(CUDA events; the median of 5 rounds, of one size)" in helpers.fixed_cost_words(
        16.5e-6, where="GPU X, today", rounds=5)
    work = helpers.fixed_cost_words(16.5e-6, 51.4e12, "GPU X, today")
    assert "about 0.85 GFLOP" in work and "51 TFLOP/s" in work
    with pytest.raises(ValueError, match="must be > 0"):
        helpers.fixed_cost_words(-1e-6, where="x")


STEP = dict(seconds=0.4e-3, row="fast_1", note="CUDA graph", batch=256, gpu="GPU X")


def test_measured_step_words_has_a_branch_per_outcome():
    none = helpers.measured_step_words(0.067e-3, 0.59)
    assert "No GPU run has measured" in none and "0.067 ms is a lower bound" in none
    flip = helpers.measured_step_words(0.067e-3, 0.59, STEP, 2.79)
    assert "0.400 ms, 6.0 times the model's 0.067 ms" in flip
    assert "faster than one device (2.79 times" in flip and "the opposite verdict" in flip
    # the small kernels' fixed cost is the GPU chapter's prediction, labelled as one
    assert "upper bound if, as the GPU chapter's fixed cost per call predicts" in flip
    assert "a prediction, not measured here" in flip
    assert "fastest of Part IV's one-GPU trainers (CUDA graph, batch 256, GPU X)" in flip
    assert "fast_1" not in flip, "a row's identifier means nothing to a reader"
    assert "trainers (batch 256, GPU X)" in helpers.measured_step_words(
        0.067e-3, 0.59, dict(STEP, note=""), 2.79)
    same = helpers.measured_step_words(0.067e-3, 0.59, STEP, 0.9)
    assert "slower than one device" in same and "the same verdict" in same
    with pytest.raises(ValueError, match="speed_measured"):
        helpers.measured_step_words(0.067e-3, 0.59, STEP)


def test_memory_roof_words_says_when_the_roof_is_the_addition_itself():
    assert "set the memory roof itself" in helpers.memory_roof_words(1.0, set_by_it=True)
    assert helpers.memory_roof_words(0.85, set_by_it=False) == (
        " and 85% of what the memory roof allows")
    with pytest.raises(ValueError, match="share"):
        helpers.memory_roof_words(0.0, set_by_it=False)


def test_pipeline_order_words_names_causes_only_as_possible():
    fast = helpers.pipeline_order_words([5, 6], [3, 4], simulated=True, micro_examples=64)
    assert fast.startswith("faster than one device in every run")
    assert "possible cause, not measured here" in fast and "64-example" in fast
    real = helpers.pipeline_order_words([5, 6], [3, 4], simulated=False, micro_examples=64)
    assert "may have overlapped" in real
    slow = helpers.pipeline_order_words([3, 4], [5, 6], simulated=True, micro_examples=64)
    assert slow.startswith("slower than one device in every run; a possible cause")
    assert helpers.pipeline_order_words([3, 5], [4, 6], True, 64).startswith("within noise")
    with pytest.raises(ValueError, match="at least one run"):
        helpers.pipeline_order_words([], [1], True, 64)


def test_call_vs_box_words_longer_a_share_a_small_share_or_not_measured():
    where = "GPU X, today"
    assert helpers.call_vs_box_words(10.7e-6, 16.5e-6, where) == (
        ": in the GPU reference run (GPU X, today) one call, a copy of 1 KiB inside the GPU's "
        "memory, took 16.5 µs (CUDA events), 1.5 times the box's modelled length")
    assert helpers.call_vs_box_words(40e-6, 16e-6, where).endswith(
        "took 16.0 µs (CUDA events), 40% of the box's modelled length")
    assert helpers.call_vs_box_words(1e-3, 16e-6, where).endswith(
        "only 2% of the box's modelled length")
    unknown = helpers.call_vs_box_words(10.7e-6)
    assert "no GPU run has recorded a GPU's yet" in unknown and "µs" not in unknown
    with pytest.raises(ValueError, match="must be > 0"):
        helpers.call_vs_box_words(0.0, 16e-6, where)
