"""What the harness skips while a dict's version tag holds (versions.py) is skipped only while
nothing changed: each test lets a first check read a dict (so its tag is noted), then the
reader's code changes that dict where the guard looks, and the guard must still fire. Without
tags (another Python) every dict is read each time, and the same tests pass."""
import builtins
import importlib
import sys
import textwrap

import pytest
import torch
from check_cases import quiet

import helpers.checks

_LINEAR = "torch.nn.modules.linear"     # a torch module that holds no dispatch switch


def _shard_sizes(n, k):
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


@pytest.fixture(autouse=True)
def _reader_run(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)


SPLIT_UNDER_A_MOVED_SWITCH = """
def shard_sizes(n, k):
    where = importlib.import_module("torch.nn.modules.lin" + "ear")
    with getattr(where, "_Disable" + "TorchDispatch")():
        return [len(s) for s in torch.arange(n).tensor_split(k)]
"""


def test_a_switch_bound_after_its_module_was_read_is_still_guarded(monkeypatch):
    """switches.py reads a torch module's names again only when its tag changed: a dispatch
    switch bound into a module already read (a cell between two checks) is found and guarded,
    so the split measured under it fails as one measured in plain view does."""
    assert quiet(helpers.checks.check_shard_sizes, _shard_sizes).passed   # every module read
    monkeypatch.setattr(sys.modules[_LINEAR], "_DisableTorchDispatch",
                        torch._C._DisableTorchDispatch, raising=False)
    space = {"__name__": "answer", "__builtins__": builtins, "importlib": importlib,
             "torch": torch}
    exec(compile(textwrap.dedent(SPLIT_UNDER_A_MOVED_SWITCH), "<answer>", "exec"), space)
    result = quiet(helpers.checks.check_shard_sizes, space["shard_sizes"])
    assert not result.passed and "switches off torch's dispatch" in result.message, result
