"""check_dp_forward refuses torch's CUDA-only DataParallel steps by name, with what to write
instead, never as "your code raised" (helpers/checks/dataparallel.py's `_CUDA_ONLY`): besides
replicate, scatter, gather, parallel_apply and data_parallel (tests/test_checks_dp_forward.py),
torch.nn.parallel.comm's gather, scatter, broadcast and reduce_add, and nn.DataParallel itself,
whose wrapper is left half made without CUDA (looked up, or by a built name while it runs)."""
import copy

import pytest
import torch
from check_cases import quiet
from torch import nn

import helpers


def _outputs(net, X, devices):
    return [copy.deepcopy(net).to(d)(x.to(d)) for x, d in zip(X.chunk(len(devices)), devices)]


def _by_comm_gather(net, X, devices):
    from torch.nn.parallel import comm
    return comm.gather(_outputs(net, X, devices), dim=0, destination=devices[0])


def _by_comm_reduce_add(net, X, devices):
    outs = _outputs(net, X, devices)
    one_hot = [torch.zeros(len(X), o.shape[1], device=o.device) for o in outs]
    return torch.nn.parallel.comm.reduce_add(one_hot, devices[0]) + torch.cat(
        [o.to(devices[0]) for o in outs])


def _by_data_parallel_gather(net, X, devices):
    return nn.DataParallel(net).gather(_outputs(net, X, devices), devices[0])


def _by_data_parallel_built_name(net, X, devices):
    wrapper = getattr(nn, "Data" + "Parallel")(net)
    return wrapper.gather(_outputs(net, X, devices), devices[0])


@pytest.mark.parametrize("answer, name", [(_by_comm_gather, "comm.gather"),
                                          (_by_comm_reduce_add, "comm.reduce_add"),
                                          (_by_data_parallel_gather, "DataParallel"),
                                          (_by_data_parallel_built_name, "DataParallel")])
def test_cuda_only_steps_are_refused_by_name(answer, name):
    result = quiet(helpers.checks.check_dp_forward, answer)
    assert result.status == "failed", result
    assert f"torch.nn.parallel.{name}, which needs real CUDA devices" in result.message, result
    assert "Instead," in result.message and "your code raised" not in result.message, result


def test_naming_data_parallel_in_isinstance_passes():
    """Naming the class to unwrap a wrapper is not a call of it: the worked answer passes."""
    def dp_forward(net, X, devices):
        net = net.module if isinstance(net, nn.DataParallel) else net
        return torch.cat([o.to(devices[0]) for o in _outputs(net, X, devices)])
    result = quiet(helpers.checks.check_dp_forward, dp_forward)
    assert result.status == "passed", result
