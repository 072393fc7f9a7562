"""A check's draws stay fresh whatever a cell did before it: torch's drawing functions and types
that a check looks up at each draw (`torch.Generator`, `torch.randn`, `torch.randint`,
`torch.Tensor.normal_`, ...) rebound to ones that ignore the seed make the check fail naming
them, `fresh.regrade` included (inputs.py), and the test suite's replayed seeds are granted only
to a process whose command line, read from the operating system, runs pytest: not to a notebook
that sets `PYTEST_CURRENT_TEST`, nor to one that sets the harness's replay state itself. Fixed
draws and failure messages that name the expected value would let a learnt table pass."""
import os
import subprocess
import sys

import pytest
import torch

from helpers.checks._core import fresh, inputs

REPLACED = "is not torch's own"


def _lr(step, base_lr, base_batch, batch, warmup):
    peak = base_lr * batch / base_batch
    return peak * min(1.0, (step + 1) / warmup) if warmup else peak


class _Fixed(torch.Generator):
    def manual_seed(self, seed):
        return super().manual_seed(12345)


def _fixed_randn(*size, generator=None, **kwargs):
    return torch.zeros(*size, **kwargs)


@pytest.mark.parametrize("owner, name, value", [
    (torch, "Generator", _Fixed), (torch, "randn", _fixed_randn),
    (torch, "randint", lambda low, high, size, generator=None, **kw: torch.full(size, low)),
    (torch, "rand", lambda *size, generator=None, **kw: torch.zeros(*size, **kw)),
    (torch.Tensor, "normal_", lambda self, *a, generator=None, **kw: self.zero_())],
    ids=["Generator", "randn", "randint", "rand", "Tensor.normal_"])
def test_torch_rebound_before_the_check_is_refused(owner, name, value, monkeypatch):
    monkeypatch.setattr(owner, name, value)
    with pytest.raises(AssertionError, match=REPLACED):
        fresh.regrade("check_lr_at", _lr)
    monkeypatch.undo()
    assert fresh.regrade("check_lr_at", _lr)


def test_the_test_suite_replays():
    assert inputs._under_pytest()


# a notebook's process (here: a script) that sets pytest's environment key, then the harness's
# replay state itself, and draws twice
_NOTEBOOK = """
import os, random
os.environ["PYTEST_CURRENT_TEST"] = "x"
from helpers.checks._core import inputs
try:
    inputs.replay_seeds(12345)
    print("replayed")
except RuntimeError as e:
    print("refused:", e)
inputs._SEEDS = random.Random(1)
print("draws", {inputs.randint(inputs.fresh_generator(), 0, 10**9) for _ in range(3)})
"""


def test_a_notebook_that_says_it_is_pytest_draws_fresh():
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "PYTEST_CURRENT_TEST": "x"}
    out = subprocess.run([sys.executable, "-c", _NOTEBOOK], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    assert "refused: replay_seeds is the course's test suite's" in out, out
    draws = eval(out.split("draws ", 1)[1])
    assert len(draws) == 3, out
