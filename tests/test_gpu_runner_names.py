"""Every helpers name the GPU runner's Python reads exists, and every key it copies out of a
result is read so that a missing one fails. Its blocks (heredocs and `-c` snippets in
scripts/gpu_runner.sh) run whole only on a GPU machine, some only with two GPUs: a renamed or
moved helper would fail there, on the day the reference run is made, while every CPU dry run
passes; and a key read with `.get` would write None into the committed reference silently."""
import ast
import importlib
import json
import pathlib
import re
import sys

import pytest

import helpers

RUNNER = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "gpu_runner.sh"


def python_blocks(text):
    """The Python the runner feeds its interpreter: `<<'EOF'` heredocs and `-c "..."` snippets."""
    blocks = re.findall(r"<<'EOF'[^\n]*\n(.*?)\nEOF\n", text, flags=re.S)
    blocks += re.findall(r'\$PY -c "([^"$]*)"', text)
    return blocks


def helpers_names(source):
    """(module, name) for each `from helpers... import name` and each `helpers.name` read."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "helpers":
            for alias in node.names:
                yield node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "helpers":
                    yield alias.name, None
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "helpers"):
            yield "helpers", node.attr


def _submodule(name):
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def missing(source):
    out = []
    for module, name in helpers_names(source):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            out.append(f"{module}: {e}")
            continue
        if name is not None and not hasattr(mod, name) and not _submodule(f"{module}.{name}"):
            out.append(f"{module}.{name}")
    return out


def test_the_runner_has_python_blocks_to_check():
    blocks = python_blocks(RUNNER.read_text())
    assert len(blocks) >= 8, "the pattern no longer finds the runner's Python: fix python_blocks"
    assert sum(1 for b in blocks for _ in helpers_names(b)) >= 10


@pytest.mark.parametrize("block", python_blocks(RUNNER.read_text()),
                         ids=lambda b: b.strip().splitlines()[0][:40] if b.strip() else "empty")
def test_every_helpers_name_the_runner_reads_exists(block):
    assert not missing(block), f"the GPU runner reads names helpers lacks: {missing(block)}"


def test_a_moved_or_renamed_helper_is_caught():
    assert missing("from helpers.dp_vs_ddp import dp_vs_ddp") == [
        "helpers.dp_vs_ddp: No module named 'helpers.dp_vs_ddp'"]
    assert missing("import helpers\nhelpers.dp_vs_ddp(1)") == ["helpers.dp_vs_ddp"]
    assert missing("from helpers.reference import no_such_name") == [
        "helpers.reference.no_such_name"]
    assert missing("import helpers\nhelpers.time_dp_vs_ddp(1)") == []
    assert missing("from helpers import flight_recorder") == []   # a submodule
    assert hasattr(helpers, "time_dp_vs_ddp")


def loose_reads(source):
    """`x.get(key)` calls without a default: a key that is gone reads as None, silently."""
    return [ast.unparse(node) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get" and len(node.args) == 1 and not node.keywords]


def test_the_runner_reads_no_key_that_may_be_missing():
    loose = [r for b in python_blocks(RUNNER.read_text()) for r in loose_reads(b)]
    assert not loose, f"read these with [key], so that a renamed key fails: {loose}"
    assert loose_reads("got = {k: naive.get(k) for k in keep}") == ["naive.get(k)"]


def _train_block():
    (block,) = [b for b in python_blocks(RUNNER.read_text()) if "helpers.train(" in b]
    return block


def _run_block(block, outdir, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py", str(outdir), "train", "--dry-run"])
    exec(compile(block, "gpu_runner.sh (train)", "exec"), {"__name__": "__main__"})
    return json.loads((outdir / "paths.json").read_text())["train"]


def test_the_train_step_copies_every_key_the_trainers_return(tmp_path, monkeypatch):
    """The train step's dry run on the CPU, as the runner runs it: every value it keeps for the
    reference is there (a key the trainers renamed would raise, or show as None here)."""
    got = _run_block(_train_block(), tmp_path, monkeypatch)
    for trainer in ("train", "train_fast"):
        assert set(got[trainer]) == {"num_gpus", "test_acc", "sec_per_epoch", "epoch_times"}
        assert None not in got[trainer].values(), got[trainer]


def test_a_key_the_trainer_no_longer_returns_fails_the_step(tmp_path, monkeypatch):
    """Guard the guard: train's result without `sec_per_epoch` (renamed) stops the step with a
    KeyError naming it, instead of writing None into the reference."""
    renamed = dict(num_gpus=2, test_acc=0.5, seconds_per_epoch=1.0, epoch_times=[1.0])
    monkeypatch.setattr(helpers, "train", lambda *a, **kw: renamed)
    monkeypatch.setattr(helpers, "train_fast", lambda *a, **kw: renamed)
    with pytest.raises(KeyError, match="sec_per_epoch"):
        _run_block(_train_block(), tmp_path, monkeypatch)
    assert not (tmp_path / "paths.json").exists()
