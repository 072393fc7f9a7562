"""An answer does the same work on CPU tensors and on the simulated GPUs (same_work.py): answers
that tell the two runs apart, by the device's type or the tensors' class, and compute the values
one way and place the work another fail (`torch.cuda.is_available()` is True on the simulated
GPUs, as on a GPU grader, so it tells nothing apart); a
branch on the device that does the same work either way passes (tests/check_cases.py's form)."""
import contextlib

import torch
import torch.nn.functional as F
from check_cases import other, parametrize_cases, shortcut, spread_over
from torch._subclasses.fake_tensor import FakeTensorMode

import helpers.checks
from helpers.checks._core import same_work

BRANCHED = "other work on the simulated GPUs"


def _spread(data):
    spread_over([t.view(-1).tensor_split(len(data)) for t in data])


def _funnel(data):
    total = torch.stack(data).sum(0)
    for t in data:
        t.copy_(total)


@shortcut("check_allreduce_spread", "the spread only where the tensors are on a GPU", BRANCHED)
def allreduce_spread_on_gpus_only(data):
    (_spread if data[0].is_cuda else _funnel)(data)


@shortcut("check_allreduce_spread", "the spread only for fake tensors (by class name)", BRANCHED)
def allreduce_spread_fake_only(data):
    (_spread if "Fake" in type(data[0]).__name__ else _funnel)(data)


def _conv_split(X, W, b, devices):
    k = len(devices)
    parts = [F.conv2d(Xi.to(d), Wi.to(d)) for d, Xi, Wi in
             zip(devices, X.tensor_split(k, dim=1), W.tensor_split(k, dim=1))]
    return sum(p.to(devices[0]) for p in parts) + b.to(devices[0]).reshape(1, -1, 1, 1)


@shortcut("check_conv_split_in_channels", "split only on GPUs CUDA does not know of (the "
          "simulated GPUs answer is_available() True, as a GPU grader's: it never splits)",
          "saw all")
def conv_split_simulated_only(X, W, b, devices, log=None):
    if X.is_cuda and not torch.cuda.is_available():
        return _conv_split(X, W, b, devices)
    return F.conv2d(X, W, b)


@other("check_conv_split_in_channels", "a branch on the device that does the same work")
def conv_split_same_work(X, W, b, devices, log=None):
    where = "a GPU" if X.is_cuda else "the CPU"       # only steers what it would print
    assert where
    return _conv_split(X, W, b, devices)


test_case = parametrize_cases(__name__)


def test_inputs_of_other_sizes_are_compared_by_name():
    """A check's run on the simulated GPUs may draw a case other than its last CPU run's: the
    same batch shape, but another module or another number of devices. The work's sizes then
    differ for a right answer; the comparison must fall back to the operations' names (it
    compared sizes and rejected dp_forward's worked answer on one draw in fifty)."""
    from helpers.checks._core.same_work import compare_work

    class Answer:
        traces = {}

    X, cpu = torch.zeros(9, 4), torch.device("cpu")
    for small, big in (((torch.nn.Linear(4, 2), [cpu] * 3), (torch.nn.Linear(4, 5), [cpu] * 3)),
                       ((torch.nn.Linear(4, 2), [cpu] * 3), (torch.nn.Linear(4, 2), [cpu] * 4))):
        for mode, (net, devices) in ((contextlib.nullcontext(), small),
                                     (FakeTensorMode(allow_non_fake_inputs=True), big)):
            with torch.no_grad(), mode, same_work.traced(Answer, (net, X, devices), {}):
                torch.cat([net(x) for x in X.chunk(len(devices))])
        assert set(Answer.traces) == {"plain", "read", "simulated"}
        compare_work(Answer, "dp_forward")
        assert "differs" not in Answer.traces, Answer.traces["differs"]


def test_a_right_answer_passes_on_every_draw():
    """dp_forward's worked answer on the draws that once failed it (replayed seeds)."""
    from test_checks_dp_forward import dp_forward

    from helpers.checks._core.inputs import replay_seeds

    for seed in (25, 35, 94):       # conftest replays its own seeds again after the test
        replay_seeds(seed)
        result = helpers.checks.check_dp_forward(dp_forward)
        assert result.status == "passed", (seed, result)
