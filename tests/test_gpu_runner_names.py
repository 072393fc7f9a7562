"""Every helpers name the GPU runner's Python reads exists. Its blocks (heredocs and `-c`
snippets in scripts/gpu_runner.sh) run whole only on a GPU machine, some only with two GPUs:
a renamed or moved helper would fail there, on the day the reference run is made, while every
CPU dry run passes."""
import ast
import importlib
import pathlib
import re

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
