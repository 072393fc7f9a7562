"""Pinned memory asked of a factory (`torch.empty(..., pin_memory=True)`, `empty_like`), the
documented way beside `.pin_memory()`, runs on a grader without CUDA as on one with it: the CPU
phase of a check makes the tensor without the keyword and calls it pinned (host_pin.py), where
torch would raise "Found no NVIDIA driver" and fail a right answer on this grader only."""
import copy

import pytest
import torch
from check_cases import other, parametrize_cases


def _staged(net, X, devices, make):
    """Each device's slice of X staged through a pinned buffer of its own, made by `make`."""
    outs = []
    for x, d in zip(X.chunk(len(devices)), devices):
        buf = make(x)
        buf.copy_(x)
        outs.append(copy.deepcopy(net).to(d)(buf.to(d, non_blocking=True)))
    return torch.cat([o.to(devices[0]) for o in outs])


@other("check_dp_forward", "a pinned buffer per device from torch.empty(pin_memory=True)")
def dp_forward_pinned_empty(net, X, devices):
    return _staged(net, X, devices,
                   lambda x: torch.empty(x.shape, dtype=x.dtype, pin_memory=True))


@other("check_dp_forward", "a pinned buffer per device from empty_like(pin_memory=True)")
def dp_forward_pinned_empty_like(net, X, devices):
    return _staged(net, X, devices,
                   lambda x: torch.empty_like(x, device="cpu", pin_memory=True))


def test_a_factory_s_pinned_tensor_is_pinned_without_cuda():
    """Under the Recorder, without CUDA, the factory's tensor is made and reads as pinned."""
    from helpers.checks._core.observe import Recorder
    if torch.cuda.is_available():
        pytest.skip("a machine with CUDA pins for real")
    with Recorder():
        t = torch.zeros(4, pin_memory=True)
        assert t.is_pinned() and float(t.sum()) == 0.0


test_case = parametrize_cases(__name__)
