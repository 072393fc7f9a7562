"""The simulated GPUs of the exercise checks (helpers.checks FakeGPUs) on a machine with fewer
real GPUs than they simulate: the first GPU run (one H200) reported "the check itself failed:
invalid device ordinal" for check_bucket_allreduce and check_ring_allreduce, because torch's
FakeTensorMode made a real tensor on every device a fake one named (cuda:1 on one GPU).

Here the machine pretends to have one real GPU (torch.cuda.is_available() True, one device):
any real CUDA call then fails, as cuda:1 does on one GPU, so a harness that touches the real
runtime for a simulated device is caught. Every check that uses FakeGPUs runs its worked answer.
"""
import glob
import importlib
import inspect
import os

import check_cases
import pytest
import torch

import helpers.checks
from helpers.checks._core import FakeGPUs

for _path in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "test_checks_*.py"))):
    importlib.import_module(os.path.basename(_path)[:-3])   # registers the worked answers


def _uses_fake_gpus(name):
    module = inspect.getmodule(inspect.unwrap(getattr(helpers.checks, name)))
    return "FakeGPUs" in inspect.getsource(module)


CHECKS = sorted(name for name in check_cases.CASES if _uses_fake_gpus(name))


@pytest.fixture
def one_real_gpu(monkeypatch):
    """torch believes one real GPU is here (no driver answers: a real call raises)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)


def test_the_checks_that_failed_on_the_h200_are_among_them():
    assert {"check_bucket_allreduce", "check_ring_allreduce"} <= set(CHECKS)
    assert len(CHECKS) >= 10


def test_fake_gpus_beyond_the_real_ones(one_real_gpu):
    gpus = FakeGPUs(4)
    a = gpus.tensor(torch.ones(3), 3)
    out, rec = gpus.run(lambda x: (x.to(gpus.devices[1]) + torch.tensor(
        [1.0, 2.0, 3.0], device=gpus.devices[1])).to(gpus.devices[2]), a)
    assert out.device == torch.device("cuda", 2)
    moves = [(op.src_device.index, op.outputs[0].device.index) for op in rec.transfers()]
    assert (3, 1) in moves and (1, 2) in moves, moves   # (None, 1): the constant lifted


@pytest.mark.parametrize("name", CHECKS)
def test_worked_answer_passes_with_one_real_gpu(name, one_real_gpu):
    case = check_cases.CASES[name]["worked"][0]
    result = getattr(helpers.checks, name)(case.fn)
    assert result.status == "passed", f"{name} on one real GPU: {result}"


def test_what_reaches_the_real_runtime_is_the_harness_not_the_answer(one_real_gpu):
    """On one real GPU, torch's autograd asks the real CUDA runtime about cuda:1 for a fake
    tensor that needs gradients, and fails ("invalid device ordinal"): no CPU can show that
    call, but its error must read as the check's limit, never as the answer's mistake."""
    from helpers.checks._core import HarnessError
    gpus = FakeGPUs(3)
    a = gpus.tensor(torch.ones(3), 2)

    def answer(x):
        x.to(gpus.devices[1])
        raise RuntimeError("CUDA error: invalid device ordinal\nGPU device may be out of range")
    with pytest.raises(HarnessError, match=r"3 simulated GPUs reached this machine's real CUDA "
                                           r"runtime \(1 GPU\(s\)\).*cuda:1\.\.2.*Not a problem"):
        gpus.run(answer, a)
    with pytest.raises(RuntimeError, match="its own mistake"):   # any other error: the answer's
        gpus.run(lambda x: (_ for _ in ()).throw(RuntimeError("its own mistake")), a)
