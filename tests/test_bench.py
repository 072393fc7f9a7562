"""scripts/bench.py: arguments refused before any row runs, rows in turns over seeds, every sample
kept, ratios with their spread and verdict, and the same-arithmetic check."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from book_files import ROOT


def load_bench():
    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.parametrize("argv,says", [
    (["--ranks", "a"], "comma-separated list"),
    (["--ranks", ","], None),                      # no ranks at all: allowed (in-process rows)
    (["--ranks", "0"], "at least 1"),
    (["--ranks", "-1"], "at least 1"),
    (["--ranks", "2,1,2"], "repeats a count: give each once, e.g. --ranks 1,2"),
    (["--batch-size", "255", "--ranks", "2"], "--batch-size 254 or 256"),
    (["--batch-size", "0"], "at least 1"),
    (["--subset", "-3"], "at least 1"),
    (["--epochs", "1"], "epoch 1 is warm-up"),
    (["--lr", "-1"], "positive"),
    (["--rounds", "0"], "at least 1"),
    (["--rows", "fast,nope"], "choose among"),
    (["--json", "/no/such/dir/out.json"], "does not exist"),
    (["--json", "/tmp"], "is a folder: give a file name, e.g. /tmp/bench.json"),
    (["--lr", "inf"], "positive, finite number"),
    (["--lr", "nan"], "positive, finite number"),
    (["--seed", str(2**63)], "does not fit in 64 bits"),
    (["--quick"], "COURSE_QUICK='maybe' is neither on nor off"),
    (["--quick"], "is a file, not a folder"),
])
def test_bad_arguments_are_refused_before_any_row_runs(argv, says, monkeypatch, capsys,
                                                        tmp_path):
    bench = load_bench()
    if "COURSE_QUICK" in (says or ""):
        monkeypatch.setenv("COURSE_QUICK", "maybe")
    if "a file, not a folder" in (says or ""):
        (tmp_path / "data").write_text("")
        monkeypatch.setenv("COURSE_DATA", str(tmp_path / "data"))

    def no_rows(*a, **kw):
        raise AssertionError("a row ran before the arguments were checked")
    monkeypatch.setattr(bench, "run_in_process", no_rows)
    monkeypatch.setattr(bench, "run_on_ranks", no_rows)
    if says is None:
        assert bench.parse_args(argv).ranks == []
        return
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


def test_bench_rows_take_turns_over_seeds_and_keep_every_sample(tmp_path):
    """The script end to end on its in-process rows (two rounds: the turns, the seeds, the
    samples, the ratio); the rows on launched ranks go through the same loop, and their own
    runner is tested below with one launch (book/part4/fixes.ipynb runs the script with
    --ranks 2 as well)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--epochs", "2",
         "--subset", "256", "--rounds", "2", "--rows", "reference,fast", "--ranks", ",",
         "--check-steps", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "TQDM_DISABLE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    text, res = proc.stdout, json.loads(out.read_text())
    assert "too short to compare" in text
    got = {r["name"]: r for r in res["rows"]}
    assert set(got) == {"reference_1", "fast_1"}, set(got)
    for r in got.values():
        assert [x["seed"] for x in r["rounds"]] == [0, 1], "round r runs seed + r"
        assert all(len(x["epoch_times"]) == 2 for x in r["rounds"]), "every epoch kept"
        assert r["sec_per_epoch"]["samples"] == [x["sec_per_epoch"] for x in r["rounds"]]
        assert len(r["test_acc"]["samples"]) == 2
    ratio = res["ratios"]["fast_1_over_reference_1"]
    ref, fast = got["reference_1"]["sec_per_epoch"], got["fast_1"]["sec_per_epoch"]
    assert ratio["samples"] == [a / b for a, b in zip(ref["samples"], fast["samples"])]
    assert ratio["verdict"] in ("faster", "slower", "within noise")
    assert "fast_1_over_reference_1" in text and ratio["verdict"] in text
    assert res["same_arithmetic"]["max_diff"]["eager"] == 0, "same batches, same arithmetic"
    assert "max |parameter difference|" in text
    assert res["machine_load"] and "machine load" in text


def test_a_ranks_row_trains_on_launched_ranks():
    """--ranks 2 plans each ranks trainer as a row of 2 launched processes (named
    <trainer>_ranks_2), and its runner trains them there: every epoch timed, the test accuracy
    and the parameters' sum handed back. One launch of 2 gloo ranks at the quick size."""
    bench = load_bench()
    args = bench.parse_args(["--quick", "--epochs", "2", "--subset", "256", "--rows",
                             "reference,fast,ddp", "--ranks", "2"])
    _, size, _, _, rows = bench.plan(args, gpu=False)
    ranks = [r for r in rows if r["where"] == "ranks"]
    assert ranks == [dict(trainer="ddp", n=2, where="ranks"),
                     dict(trainer="fast", n=2, where="ranks")], rows
    got = bench.run_on_ranks(ranks[1], size, args, seed=1, compile_ok=False)
    assert len(got["epoch_times"]) == 2 and all(t > 0 for t in got["epoch_times"]), got
    assert 0 <= got["test_acc"] <= 1 and got["note"].startswith("gloo, 2 processes"), got
    assert isinstance(got["param_sum"], float), got


def test_compiled_row_marks_every_step_and_keeps_no_output(monkeypatch):
    """The first GPU run's compile row failed: "accessing tensor output of CUDAGraphs that has
    been overwritten by a subsequent run". As torch documents, each step is marked as a new
    iteration (torch.compiler.cudagraph_mark_step_begin) and returns no tensor to keep. The
    same step and loop run here with dynamo's eager backend (what the quick CPU dry run does)."""
    import torch

    from helpers.data_parallel.compiled_step import train_compiled
    marks, returned = [], []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    compile_ = torch.compile

    def spy(fn, **kw):
        assert kw.get("backend") == "eager" or kw.get("mode") == "reduce-overhead", kw
        compiled = compile_(fn, **kw)

        def call(*a):
            returned.append(compiled(*a))
        return call
    monkeypatch.setattr(torch, "compile", spy)
    got = train_compiled(64, 0.2, num_epochs=2, subset=256, seed=0, backend="eager")
    assert len(got["epoch_times"]) == 2 and 0 <= got["test_acc"] <= 1
    assert len(marks) == len(returned) == 2 * 4, "one mark before each of the 8 steps"
    assert all(r is None for r in returned), "a step's output would outlive its replay"
    assert "eager backend" in got["note"]


def test_one_round_targets_and_ratios_cannot_tell():
    """--rounds 1 (the first GPU run): a target's 'met' and a ratio's verdict rest on one
    sample, so both say they cannot tell."""
    from helpers import timing
    bench = load_bench()
    one = timing.ratio(timing.Measurement([1.0]), timing.Measurement([0.05])).to_dict()
    assert one["verdict"] == "cannot tell"
    got = bench.judge("gpu", [], {"fast_1_over_reference_1": one})
    assert got[0]["rounds"] == 1 and "cannot tell" in bench.target_word(got[0])
    three = timing.ratio(timing.Measurement([1.0] * 3), timing.Measurement([0.05, 0.06, 0.07]))
    got = bench.judge("gpu", [], {"fast_1_over_reference_1": three.to_dict()})
    assert bench.target_word(got[0]) == "met"
