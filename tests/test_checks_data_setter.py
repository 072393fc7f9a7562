"""`t.data = new`, the setter Module._apply moves parameters with, on the simulated GPUs and in the
checks that judge where results live: on real devices `t` takes `new`'s storage and device, so
a replica's gradient re-pointed at one sum shares it (no copy reached the other devices) and a
parameter moved with `p.data = p.data.to(d)` is on d (tests/check_cases.py)."""
import copy

import torch
from check_cases import other, parametrize_cases, shortcut
from test_checks_splits import _cuts

import helpers
from helpers.checks._core import FakeGPUs

OWN = "got new storage"


# ---- the simulated GPUs follow the setter --------------------------------------------------------
def test_a_simulated_tensor_takes_the_new_data_and_its_device():
    gpus = FakeGPUs(3)
    f, total = gpus.tensor(torch.randn(4), 2), gpus.tensor(torch.randn(4), 0)
    with gpus.active():
        f.data = total
    assert f.device == gpus.devices[0]
    assert f.untyped_storage()._cdata == total.untyped_storage()._cdata


def test_a_real_parameter_given_simulated_data_moves_there():
    gpus = FakeGPUs(2)
    layer = torch.nn.Linear(3, 2)
    with gpus.active():
        for p in layer.parameters():
            p.data = p.data.to(gpus.devices[1])
    for p in layer.parameters():
        assert p.device == gpus.devices[1] and p.requires_grad
        assert isinstance(p, torch.nn.Parameter)


def test_a_simulated_tensor_given_real_data_lives_on_the_cpu():
    gpus = FakeGPUs(2)
    f = gpus.tensor(torch.randn(4), 1)
    with gpus.active():
        f.data = torch.zeros(5)
    assert f.device == torch.device("cpu") and f.shape == (5,)


# ---- reduce_then_broadcast: every replica keeps its own gradient ---------------------------------
@shortcut("check_reduce_then_broadcast", "every .grad re-pointed at the one sum (.data =)", OWN)
def reduce_then_broadcast_data_total(grads):
    total = sum(g.to(grads[0].device) for g in grads)
    for g in grads:
        g.data = total


@shortcut("check_reduce_then_broadcast", "summed into device 0's, the others re-pointed at it",
          OWN)
def reduce_then_broadcast_data_no_to(grads):
    total = grads[0]
    for g in grads[1:]:
        total += g.to(total.device)
    for g in grads[1:]:
        g.data = total


@shortcut("check_reduce_then_broadcast", "copies on the CPU, re-pointed on the devices", OWN)
def reduce_then_broadcast_data_on_devices(grads):
    total = sum(g.to(grads[0].device) for g in grads)
    for g in grads:
        if g.is_cuda:
            g.data = total
        else:
            g.copy_(total)


@shortcut("check_reduce_then_broadcast", "a copy per device, in new storage (.data =)", OWN)
def reduce_then_broadcast_data_copies(grads):
    total = sum(g.to(grads[0].device) for g in grads)
    for g in grads:
        g.data = total.to(g.device, copy=True)


# ---- the other in-place checks refuse the same route ---------------------------------------------
@shortcut("check_allreduce_spread", "the sum re-pointed at (.data =)", "storage was replaced")
def allreduce_spread_data(data):
    total = sum(t.to(data[0].device) for t in data)
    for t in data:
        t.data = total.to(t.device)


@shortcut("check_sharded_server_step", "every replica re-pointed at one vector", "in place")
def sharded_server_step_data(params, grads, devices, lr):
    k = len(devices)
    for j in range(k):
        total = sum(g.tensor_split(k)[j].to(devices[j]) for g in grads)
        params[j].tensor_split(k)[j].sub_(lr * total)
    full = torch.cat([params[j].tensor_split(k)[j].to(devices[0]) for j in range(k)])
    for p in params:
        p.data = full


@shortcut("check_bucket_allreduce", "the sums re-pointed at (.data =)", OWN)
def bucket_allreduce_data(grads, bucket_bytes):
    for i in range(len(grads[0])):
        total = sum(r[i].to(grads[0][i].device) for r in grads)
        for r in grads:
            r[i].data = total.to(r[i].device)


@shortcut("check_ring_allreduce", "the sum re-pointed at (.data =)", OWN)
def ring_allreduce_data(data):
    total = sum(t.to(data[0].device) for t in data)
    for t in data:
        t.data = total.to(t.device)
    return [0] * len(data)


# ---- placement judged as on real devices: moving with .data = is right --------------------------
@other("check_split_by_params", "parameters moved with p.data = p.data.to(d)")
def split_by_params_data_move(net, devices):
    sizes = [helpers.num_params(layer) for layer in net]
    bounds = [0, *_cuts(sizes, len(devices)), len(net)]
    stages = []
    for a, b, d in zip(bounds, bounds[1:], devices):
        stage = copy.deepcopy(net[a:b])
        for p in stage.parameters():
            p.data = p.data.to(d)
        stages.append(stage)
    return stages


@other("check_dp_forward", "replicas moved with p.data = p.data.to(d)")
def dp_forward_data_move(net, X, devices):
    outs = []
    for d, x in zip(devices, X.chunk(len(devices))):
        replica = copy.deepcopy(net)
        for p in replica.parameters():
            p.data = p.data.to(d)
        outs.append(replica(x.to(d)).to(devices[0]))
    return torch.cat(outs)


test_case = parametrize_cases(__name__)
