"""CPUSyncBatchNorm over 2 real gloo ranks equals one BatchNorm on the combined batch (forward,
running statistics, input and parameter gradients), and convert_sync_batchnorm keeps every
setting of the layers it replaces."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

import helpers
import helpers.data_parallel.torch_api as hd

SHAPES = {1: (6, 3), 2: (6, 3, 4, 5), 3: (6, 3, 2, 3, 4)}
BN = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}


def _inputs(dim):
    g = torch.Generator().manual_seed(dim)
    X = torch.randn(SHAPES[dim], generator=g) * 3 + 1e3   # a large mean: E[x^2]-E[x]^2 fails
    w = torch.randn(SHAPES[dim], generator=g)              # a random upstream gradient
    return X, w


def _worker(rank, world_size, cfg):
    """A launch target: the layer's outputs, gradients and statistics on this rank's shard."""
    results = {}
    for dim in SHAPES:
        X, w = _inputs(dim)
        torch.manual_seed(0)
        bn = BN[dim](3, momentum=0.3)
        with torch.no_grad():
            bn.weight.uniform_(0.5, 2)
            bn.bias.uniform_(-1, 1)
        sync = hd.convert_sync_batchnorm(nn.Sequential(bn), "cpu")[0]
        rows = torch.tensor([4, 2])                       # unequal shards: 4 and 2 examples
        Xr = X.split(rows.tolist())[rank].clone().requires_grad_()
        wr = w.split(rows.tolist())[rank]
        for _ in range(2):                                # two steps: running stats compound
            Y = sync(Xr)
        (Y * wr).sum().backward()
        grads = [p.grad.clone() for p in sync.parameters()]
        for gr in grads:
            dist.all_reduce(gr)                           # what DDP does with the sum of losses
        results[dim] = dict(Y=Y.detach(), dX=Xr.grad, grads=grads, type=type(sync).__name__,
                            mean=sync.running_mean.clone(), var=sync.running_var.clone())
    return results


@pytest.fixture(scope="module")
def two_ranks():
    return helpers.launch(_worker, 2, backend="gloo", quiet=True)


@pytest.mark.parametrize("dim", sorted(SHAPES))
def test_two_gloo_ranks_equal_one_batchnorm_on_the_combined_batch(two_ranks, dim):
    X, w = _inputs(dim)
    torch.manual_seed(0)
    bn = BN[dim](3, momentum=0.3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2)
        bn.bias.uniform_(-1, 1)
    X = X.clone().requires_grad_()
    for _ in range(2):
        Y = bn(X)
    (Y * w).sum().backward()
    r0, r1 = two_ranks[0][dim], two_ranks[1][dim]
    assert r0["type"] == "CPUSyncBatchNorm"
    torch.testing.assert_close(torch.cat([r0["Y"], r1["Y"]]), Y.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat([r0["dX"], r1["dX"]]), X.grad, atol=1e-4, rtol=1e-4)
    for r in (r0, r1):
        torch.testing.assert_close(r["mean"], bn.running_mean, atol=1e-3, rtol=1e-6)
        torch.testing.assert_close(r["var"], bn.running_var, atol=1e-4, rtol=1e-4)
        for got, p in zip(r["grads"], bn.parameters()):
            torch.testing.assert_close(got, p.grad, atol=1e-4, rtol=1e-4)


def test_the_naive_variance_would_fail_here():
    """The inputs above are chosen so that E[x^2] - E[x]^2 in float32 is visibly wrong: the
    test above would catch the unstable formula."""
    X, _ = _inputs(2)
    dims = (0, 2, 3)
    naive = (X * X).mean(dims) - X.mean(dims) ** 2
    assert (naive - X.var(dims, unbiased=False)).abs().max() > 1e-2


@pytest.mark.parametrize("cls", [nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d])
@pytest.mark.parametrize("affine,track", [(True, True), (False, True), (True, False),
                                          (False, False)])
def test_convert_keeps_every_setting(cls, affine, track):
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(cls(5, eps=1e-3, momentum=0.25,
                                                             affine=affine,
                                                             track_running_stats=track)))
    if affine:
        with torch.no_grad():
            model[1][0].weight.fill_(2.0)
    if track:
        model[1][0].running_mean.fill_(0.5)
    new = hd.convert_sync_batchnorm(model, "cpu")[1][0]
    assert isinstance(new, hd.CPUSyncBatchNorm)
    assert (new.num_features, new.eps, new.momentum, new.affine, new.track_running_stats) == \
        (5, 1e-3, 0.25, affine, track)
    if affine:
        assert torch.equal(new.weight, torch.full((5,), 2.0))
    if track:
        assert torch.equal(new.running_mean, torch.full((5,), 0.5))
    else:
        assert new.running_mean is None


def test_exported():
    assert helpers.CPUSyncBatchNorm is hd.CPUSyncBatchNorm


def _alone_worker(rank, world_size, cfg):
    """The control of the SyncBatchNorm cost: AloneSyncBatchNorm on a group of this rank alone
    runs the Python autograd function and computes what one BatchNorm2d computes."""
    from helpers.data_parallel.syncbn_experiments import _alone
    alone = [dist.new_group([r]) for r in range(world_size)][rank]
    X, w = _inputs(2)
    X = X.split([3, 3])[rank]
    torch.manual_seed(0)
    ref = nn.BatchNorm2d(3, momentum=0.3)
    net = _alone(hd.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(3, momentum=0.3)),
                                           "cpu", alone), alone)
    Xa, Xr = X.clone().requires_grad_(), X.clone().requires_grad_()
    Ya, Yr = net(Xa), ref(Xr)
    (Ya * w[:3]).sum().backward()
    (Yr * w[:3]).sum().backward()
    return dict(node=type(Ya.grad_fn).__name__, layer=type(net[0]).__name__,
                dY=(Ya - Yr).abs().max().item(), dX=(Xa.grad - Xr.grad).abs().max().item(),
                dmean=(net[0].running_mean - ref.running_mean).abs().max().item())


def test_the_cost_control_runs_the_python_function_alone():
    for r in helpers.launch(_alone_worker, 2, backend="gloo", quiet=True):
        assert r["layer"] == "AloneSyncBatchNorm" and "SyncBatchNormFunction" in r["node"], r
        assert r["dY"] < 1e-4 and r["dX"] < 1e-4 and r["dmean"] < 1e-4, r
    assert helpers.AloneSyncBatchNorm is not None and helpers.syncbn_cost_times
