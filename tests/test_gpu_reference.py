"""The GPU reference file: what the runner's steps leave is gathered with its provenance; a dry run
is never taken for a GPU run; the committed file says honestly whether a GPU run exists."""
import importlib
import json

import pytest

gr = importlib.import_module("helpers.reference")

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0"
failures="1" skipped="1" tests="4"><testcase classname="tests.test_a" name="test_ok"/>
<testcase classname="tests.test_a" name="test_bad"><failure message="x"/></testcase>
<testcase classname="tests.test_a" name="test_skip"><skipped/></testcase>
<testcase classname="tests.test_a" name="test_ok2"/></testsuite></testsuites>"""


def outdir_with(tmp_path, gpu_count=1, bench=True):
    env = dict(gpu="NVIDIA H200" if gpu_count else "none (dry run)", gpu_count=gpu_count,
               torch="2.11.0", cuda="13.0", python="3.12.3", date="2026-12-02 10:00 UTC",
               commit="abc1234")
    (tmp_path / "env.json").write_text(json.dumps(env))
    (tmp_path / "unit.xml").write_text(JUNIT)
    ok = tmp_path / "ok.xml"
    ok.write_text(JUNIT.replace('failures="1"', 'failures="0"').replace('<failure message="x"/>',
                                                                        ''))
    gr.add_notebook(str(tmp_path), "book/part4/fixes.ipynb", str(ok), 12)
    gr.add_notebook(str(tmp_path), "book/part5/zero.ipynb")   # the budget left it out
    if bench:
        (tmp_path / "bench.json").write_text(json.dumps(dict(
            rows=[dict(trainer="fast", n=1, where="process", name="fast_1",
                       sec_per_epoch=dict(median=0.12, spread=[0.11, 0.13], samples=[0.12]),
                       test_acc=dict(median=0.84, spread=[0.84, 0.84], samples=[0.84]))],
            rounds=3,
            ratios={"fast_1_over_reference_1": dict(median=12.0, spread=[11.0, 13.0],
                                                    samples=[11.0, 12.0, 13.0],
                                                    verdict="faster")},
            targets=dict(kind="gpu", verdicts=[dict(target="t", median=1, spread=[1, 1],
                                                    limit=2, met=True)]))))
    return tmp_path


def test_record_gathers_the_steps_with_their_provenance(tmp_path):
    out = outdir_with(tmp_path)
    target = tmp_path / "ref.json"
    ref = gr.write_gpu_reference(str(out), "bash scripts/gpu_runner.sh", path=str(target))
    assert json.loads(target.read_text()) == ref
    assert json.loads((out / "gpu_reference.json").read_text()) == ref, "a copy travels back"
    assert ref["gpu"] == "NVIDIA H200" and ref["torch"] == "2.11.0" and ref["exists"]
    assert ref["steps"]["unit"]["failed"] == ["tests.test_a::test_bad"]
    assert (ref["steps"]["unit"]["passed"], ref["steps"]["unit"]["skipped"]) == (2, 1)
    assert ref["steps"]["nbval"]["notebooks"] == {"book/part4/fixes.ipynb": "passed"}
    assert ref["steps"]["nbval"]["not_run"] == ["book/part5/zero.ipynb"], "the budget's leftovers"
    assert ref["not_run"] == [], ref["not_run"]
    text = gr.describe_gpu_reference(str(target))
    assert "NVIDIA H200" in text and "0.120 s/epoch" in text and "12.00x (faster)" in text
    gr.add_notebook(str(out), "book/part5/zero.ipynb", str(out / "ok.xml"), 30)   # later session
    later = gr.write_gpu_reference(str(out), "cmd", path=str(target))["steps"]["nbval"]
    assert later["notebooks"] == {"book/part4/fixes.ipynb": "passed",
                                  "book/part5/zero.ipynb": "passed"} and not later["not_run"]
    (out / "nbval.json").unlink()
    ref = gr.write_gpu_reference(str(out), "cmd", path=str(target))
    assert ref["not_run"] == ["nbval"], "a step that did not run is named"
    assert "steps not run: nbval" in gr.describe_gpu_reference(str(target))


def test_a_cpu_capture_is_not_recorded_as_a_gpu_run(tmp_path):
    out = outdir_with(tmp_path, gpu_count=0)
    with pytest.raises(RuntimeError, match="without a GPU"):
        gr.write_gpu_reference(str(out), "cmd", path=str(tmp_path / "ref.json"))


def test_a_dry_run_never_passes_for_a_gpu_run(tmp_path):
    out = outdir_with(tmp_path, gpu_count=0, bench=False)
    with pytest.raises(ValueError, match="must not overwrite"):
        gr.write_gpu_reference(str(out), "cmd", path=gr.REFERENCE_PATH, dry_run=True)
    ref = gr.write_gpu_reference(str(out), "cmd", dry_run=True)
    assert ref["dry_run"] and (out / "gpu_reference.json").exists()
    seen = gr.gpu_reference(str(out / "gpu_reference.json"))
    assert seen["exists"] is False and "dry run" in seen["note"]
    assert "none exists yet" in gr.describe_gpu_reference(str(out / "gpu_reference.json"))


def test_record_needs_the_machine_captured_on_the_gpu(tmp_path):
    with pytest.raises(FileNotFoundError, match="env.json"):
        gr.write_gpu_reference(str(tmp_path), "cmd", path=str(tmp_path / "ref.json"))


def test_a_claimed_run_without_provenance_is_refused(tmp_path):
    bad = tmp_path / "ref.json"
    bad.write_text(json.dumps({"exists": True, "gpu": "H200"}))
    with pytest.raises(ValueError, match="does not name"):
        gr.gpu_reference(str(bad))


def test_the_committed_file_is_honest():
    ref = gr.gpu_reference()
    if ref.get("exists"):
        assert not ref.get("dry_run") and ref["gpu_count"] >= 1 and ref["bench"]
    else:
        assert "none exists yet" in gr.describe_gpu_reference()


def test_one_round_ratios_say_cannot_tell(tmp_path):
    """The first GPU run had one round: bench.json stored "faster" and "slower" from one sample
    each. Read back, every such ratio is "cannot tell", and the chapters are told why."""
    out = outdir_with(tmp_path)
    bench = json.loads((out / "bench.json").read_text())
    bench["rounds"] = 1
    bench["ratios"] = {"a_over_b": dict(median=16.5, spread=[16.5, 16.5], samples=[16.5],
                                        verdict="faster"),
                       "c_over_d": dict(median=0.71, spread=[0.71, 0.71], samples=[0.71],
                                        verdict="slower")}
    (out / "bench.json").write_text(json.dumps(bench))
    target = tmp_path / "ref.json"
    gr.write_gpu_reference(str(out), "cmd", path=str(target))
    text = gr.describe_gpu_reference(str(target))
    assert "16.50x (cannot tell)" in text and "0.71x (cannot tell)" in text, text
    assert "faster" not in text.replace("says faster or slower", "") and "(slower)" not in text
    assert "one round" in text
    figs = gr.gpu_figures(str(target))
    assert {v["verdict"] for v in figs["ratios"].values()} == {"cannot tell"}
    assert figs["rounds"] == 1 and "one round" in figs["sentence"]
    assert "one GPU, so anything about two or more GPUs is still a prediction" in figs["scope"]
    assert "one GPU" in text and "two or more GPUs is still a prediction" in text
    assert "near chance" not in text, "0.84 is not chance"


def test_accuracies_at_chance_are_named_so():
    """The first GPU run trained 3 epochs of 12,800 images: every row at 0.096 (chance)."""
    text = gr.describe_gpu_reference()
    accs = [r["test_acc"]["median"] for r in (gr.gpu_reference().get("bench") or {}).get(
        "rows", [])]
    assert ("near chance" in text) == bool(accs and max(accs) < 0.3)


def test_the_committed_reference_reads_honestly():
    figs = gr.gpu_figures()
    if figs is None:
        return   # no GPU run committed: nothing to read
    for name, v in figs["ratios"].items():
        assert (v["verdict"] == "cannot tell") == (v["rounds"] < 2), (name, v)
        if v["verdict"] in ("faster", "slower"):
            assert (v["spread"][0] > 1) == (v["verdict"] == "faster"), (name, v)


def test_record_gathers_the_gpu_path_steps_and_the_rates_they_measured(tmp_path):
    """The runner's path steps (one paths.json: the device returns few files) and status.json
    reach the reference file; a measured FLOP rate reaches Rates.load, the message rates it
    did not measure stay assumed and the source says so."""
    from helpers import Rates
    from helpers.runtime.emulate import ASSUMED_RATES
    out = outdir_with(tmp_path)
    gr.add_gpu_path(str(out), "cp", dict(ran=True))
    gr.add_gpu_path(str(out), "comm",
                    dict(rates=dict(flops_per_s=4.0e13, measured=["flops_per_s"])))
    (out / "status.json").write_text(json.dumps(dict(steps=dict(cp=dict(status="passed")))))
    ref = gr.write_gpu_reference(str(out), "cmd", path=str(tmp_path / "ref.json"))
    assert ref["paths"]["cp"] == dict(ran=True) and ref["status"]["steps"]["cp"]
    rates = Rates.load(gr.gpu_reference(str(tmp_path / "ref.json")))
    assert (rates.flops_per_s, rates.alpha, rates.beta) == (4.0e13, ASSUMED_RATES.alpha,
                                                            ASSUMED_RATES.beta)
    assert "the compute rate measured on an NVIDIA H200" in rates.source
    assert "assumed" in rates.source
    assert "TFLOP/s" not in rates.source.split(";")[1], "only what was not measured is assumed"
    assert "alpha = 10 us" in rates.source and "25 GB/s" in rates.source
