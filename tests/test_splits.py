"""Each split computes what the unsplit model computes (outputs and gradients), the pipeline's
recorded schedule has the bubble of the formula, and the cost model counts LeNet by hand.

Every equality test also runs a deliberately broken split (a dropped shard, partial sum or bias)
through the same comparison and requires it to be caught: the comparison can fail.
"""
import pytest
import torch
from torch.nn import functional as F

import helpers
from helpers import (CommLog, all_close, bubble_fraction, conv_split_channels, dense_split_columns,
                     dense_split_rows, layer_sizes, lenet, lenet_module, lenet_within_layer,
                     network_split_forward, pipeline_step, schedule_bubble, split_costs,
                     split_sequential)
from helpers.models import LENET_SHAPES

torch.backends.cudnn.allow_tf32 = False   # exact float32 convolutions on GPUs too


def devices(k):
    return helpers.get_devices(k)


def leaves(*shapes, seed=0):
    """Random tensors (biases too, so a dropped bias shows) that require gradients."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(s, generator=g) * 0.1).requires_grad_() for s in shapes]


def same_as_unsplit(split, full, tensors, X):
    """Outputs and gradients (w.r.t. `tensors`) of split(X, *tensors) equal those of full(X, *tensors)."""
    outs, grads = [], []
    for fn in (split, full):
        for t in tensors:
            t.grad = None
        Y = fn(X, *tensors)
        (Y * torch.arange(Y.numel(), dtype=Y.dtype, device=Y.device).reshape(Y.shape).cos()).sum().backward()
        outs.append(Y)
        grads.append([t.grad.clone() if t.grad is not None else torch.zeros_like(t) for t in tensors])
    return all_close(outs[0], outs[1]) and all_close(grads[0], grads[1])


# deliberately broken splits: each must be caught by same_as_unsplit
def conv_drop_shard(X, W, b, devs):
    Ys = [F.conv2d(X, Wi, bi) for Wi, bi in zip(W.tensor_split(len(devs)), b.tensor_split(len(devs)))]
    return torch.cat(Ys[:-1] + [torch.zeros_like(Ys[-1])], dim=1)   # last device's shard lost


def columns_no_bias(X, W, b, devs):
    return torch.cat([X @ Wi for Wi in W.tensor_split(len(devs), dim=1)], dim=1)


def rows_drop_partial(X, W, b, devs):
    parts = [Xi @ Wi for Xi, Wi in zip(X.tensor_split(len(devs), dim=1), W.tensor_split(len(devs)))]
    return sum(parts[:-1]) + b   # one partial sum never added


def rows_bias_each(X, W, b, devs):
    parts = [Xi @ Wi + b for Xi, Wi in zip(X.tensor_split(len(devs), dim=1), W.tensor_split(len(devs)))]
    return sum(parts)            # bias added k times


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_conv_split_channels(k):
    devs = devices(k)
    W, b = leaves((6, 3, 3, 3), (6,))
    X = torch.randn(4, 3, 8, 8)
    full = lambda X, W, b: F.conv2d(X, W, b)
    assert same_as_unsplit(lambda X, W, b: conv_split_channels(X, W, b, devs), full, [W, b], X)
    if k > 1:
        assert not same_as_unsplit(lambda X, W, b: conv_drop_shard(X, W, b, devs), full, [W, b], X)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_dense_split_columns(k):
    devs = devices(k)
    W, b = leaves((7, 9), (9,))
    X = torch.randn(5, 7)
    full = lambda X, W, b: X @ W + b
    assert same_as_unsplit(lambda X, W, b: dense_split_columns(X, W, b, devs), full, [W, b], X)
    assert not same_as_unsplit(lambda X, W, b: columns_no_bias(X, W, b, devs), full, [W, b], X)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_dense_split_rows(k):
    devs = devices(k)
    W, b = leaves((10, 4), (4,))
    X = torch.randn(5, 10)
    full = lambda X, W, b: X @ W + b
    assert same_as_unsplit(lambda X, W, b: dense_split_rows(X, W, b, devs), full, [W, b], X)
    if k > 1:
        for broken in (rows_drop_partial, rows_bias_each):
            assert not same_as_unsplit(lambda X, W, b: broken(X, W, b, devs), full, [W, b], X), broken
    log = CommLog()
    dense_split_rows(X, W, b, devs, log)
    assert log.total("partial sum") == (k - 1) * 5 * 4 * 4   # k-1 partial sums of (5, 4) floats


@pytest.mark.parametrize("k", [2, 3])
def test_lenet_within_layer(k):
    params = leaves(*LENET_SHAPES)
    X = torch.randn(3, 1, 28, 28)
    devs = devices(k)
    assert same_as_unsplit(lambda X, *p: lenet_within_layer(X, p, devs), lambda X, *p: lenet(X, p),
                           params, X)
    # the same comparison catches one layer whose last shard is lost
    def broken(X, *p):
        W1, b1 = p[0], p[1]
        h1 = F.avg_pool2d(F.relu(conv_drop_shard(X, W1, b1, devs)), 2, 2)
        h2 = F.avg_pool2d(F.relu(F.conv2d(h1, p[2], p[3])), 2, 2).reshape(X.shape[0], -1)
        return torch.mm(F.relu(torch.mm(h2, p[4]) + p[5]), p[6]) + p[7]
    assert not same_as_unsplit(broken, lambda X, *p: lenet(X, p), params, X)


def reference(seed=0, n=12):
    torch.manual_seed(seed)
    net = lenet_module()
    for p in net.parameters():   # non-zero biases, so a dropped bias would show
        torch.nn.init.normal_(p, std=0.1)
    X, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
    l = helpers.loss(net(X), y).sum() / n
    l.backward()
    return net, X, y, l.item(), [p.grad for p in net.parameters()]


@pytest.mark.parametrize("cuts", [[7], [3, 7], [1, 4, 8]])
def test_network_split_forward_and_gradients(cuts):
    net, X, y, l, grads = reference()
    devs = devices(len(cuts) + 1)
    stages = split_sequential(net, cuts, devs)
    out = network_split_forward(stages, X, devs)
    assert all_close(out, net(X))
    (helpers.loss(out, y.to(out.device)).sum() / len(y)).backward()
    assert all_close([p.grad for s in stages for p in s.parameters()], grads)
    # stages are copies: their gradients did not land in the unsplit net
    assert all(p.grad is g for p, g in zip(net.parameters(), grads))


def test_network_split_catches_a_missing_stage():
    net, X, y, l, grads = reference()
    devs = devices(2)
    stages = split_sequential(net, [7], devs)
    stages[1] = stages[1][1:]    # drop the first dense layer: shapes break
    with pytest.raises(RuntimeError):
        network_split_forward(stages, X, devs)


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (3, 3), (4, 6)])
def test_pipeline_gradients_and_bubble(p, m):
    net, X, y, l, grads = reference(n=12)
    cuts = {2: [7], 3: [3, 7], 4: [3, 6, 8]}[p]
    devs = devices(p)
    stages = split_sequential(net, cuts, devs)
    log = CommLog()
    total, schedule = pipeline_step(stages, X, y, helpers.loss, devs, m, log)
    assert total == pytest.approx(l, rel=1e-5)
    assert all_close([p_.grad for s in stages for p_ in s.parameters()], grads)
    assert len(schedule) == 2 * p * m     # every stage ran every micro-batch forward and back
    assert schedule_bubble(schedule) == pytest.approx(bubble_fraction(p, m))
    # each cut carries m activations forward and m gradients back
    assert len(log.transfers) == 2 * (p - 1) * m


def test_pipeline_drops_nothing():
    """If a micro-batch were skipped, the gradient would differ: check the comparison sees it."""
    net, X, y, l, grads = reference(n=12)
    devs = devices(2)
    stages = split_sequential(net, [7], devs)
    pipeline_step(stages, X[:9], y[:9], helpers.loss, devs, 3)   # a micro-batch short
    assert not all_close([p.grad for s in stages for p in s.parameters()], grads)


def test_bubble_formula():
    assert bubble_fraction(1, 5) == 0
    assert bubble_fraction(4, 1) == pytest.approx(3 / 4)
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)


def test_lenet_costs_by_hand():
    sizes = layer_sizes(lenet_module(), (1, 28, 28))
    # 20*1*3*3+20 + 50*20*5*5+50 + 800*128+128 + 128*10+10
    assert sum(r["params"] for r in sizes) == 200 + 25050 + 102528 + 1290 == 129068
    # activations measured by the hooks: conv1 out 20x26x26, conv2 out 50x9x9, ...
    assert [r["out"] for r in sizes] == [13520, 13520, 3380, 4050, 4050, 800, 800, 128, 128, 10]
    c1 = split_costs(sizes, 1, 256, 16.0)
    c2 = split_costs(sizes, 2, 256, 16.0)
    assert c1["data"]["grads"] == 516272 and c1["data"]["sent"] == 0
    assert c2["data"]["sent"] == pytest.approx(516272)          # ring: 2 (k-1)/k = 1 for k=2
    assert c2["data"]["seconds"] == pytest.approx(516272 / 16e9)
    c4 = split_costs(sizes, 4, 256, 16.0)
    assert c4["data"]["sent"] == pytest.approx(1.5 * 516272)
    assert c4["data"]["acts"] == 64 * sum(r["acts"] for r in sizes) * 4
    # within a layer: weights split 4 ways, 4 all-gathers and 3 all-reduces
    assert c4["within layer"]["params"] == 129068 // 4 * 4 and c4["within layer"]["syncs"] == 7
    # network split at 2 devices: one cut, its activation forward and gradient back
    cut = c2["network"]["cuts"][0]
    assert c2["network"]["sent"] == 256 * sizes[cut - 1]["out"] * 4 and c2["network"]["syncs"] == 2


def test_resnet_costs_measured():
    sizes = layer_sizes(helpers.resnet18(), (1, 28, 28))
    assert sum(r["params"] for r in sizes) == helpers.num_params(helpers.resnet18())
    assert sum(len(r["weighted"]) for r in sizes) == 21   # 17 convs + 3 shortcuts + 1 dense
    c = split_costs(sizes, 4, 128, 16.0)
    assert c["within layer"]["sent"] > c["data"]["sent"]   # activations outweigh gradients
    assert c["network"]["memory"] < c["data"]["memory"] * 4


# ---- tensor_parallel: the ring all-reduce and the Megatron MLP over simulated devices -----------
from helpers import (copy_to_shards, max_abs_diff, megatron_mlp, reduce_from_shards,
                     ring_all_reduce, ring_bytes_per_device)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_ring_all_reduce_sums_and_sends_2_k_minus_1_over_k(k):
    devices = [torch.device("cpu")] * k
    xs = [torch.randn(4, 3 * k) for _ in range(k)]
    originals = [x.clone() for x in xs]
    log = CommLog()
    out = ring_all_reduce(xs, devices, log)
    want = sum(originals)
    assert all(torch.allclose(o, want, atol=1e-6) for o in out)
    assert all(torch.equal(x, o) for x, o in zip(xs, originals))   # the inputs are left alone
    nbytes = 4 * xs[0].numel()
    for i in range(k):   # 12k elements: chunks are equal, so the formula holds exactly
        assert log.sent_by(i) == ring_bytes_per_device(nbytes, k)
    assert log.total("all-reduce: reduce-scatter") == log.total("all-reduce: all-gather") \
        == (k - 1) * nbytes


def test_ring_all_reduce_uneven_chunks_total():
    k, devices = 4, [torch.device("cpu")] * 4
    xs = [torch.randn(7) for _ in range(k)]
    log = CommLog()
    out = ring_all_reduce(xs, devices, log)
    assert torch.allclose(out[2], sum(xs), atol=1e-6)
    assert log.total() == 2 * (k - 1) * 7 * 4       # every chunk goes k-1 hops, twice


def test_ring_all_reduce_rejects_wrong_count():
    with pytest.raises(ValueError, match="one per device"):
        ring_all_reduce([torch.ones(2)], [torch.device("cpu")] * 2)


def test_f_and_g_communicate_only_where_megatron_says():
    devices = [torch.device("cpu")] * 3
    X = torch.randn(4, 6, requires_grad=True)
    log = CommLog()
    Xs = copy_to_shards(X, devices, log)
    assert log.total() == 0 and all(torch.equal(x, X) for x in Xs)   # f forward: identity
    assert all(x.data_ptr() != X.data_ptr() for x in Xs)             # real copies
    Y = reduce_from_shards([x * (i + 1) for i, x in enumerate(Xs)], devices, log)
    assert torch.allclose(Y, 6 * X) and log.total("g forward: reduce-scatter") > 0
    fwd = log.total()
    Y.sum().backward()                                               # g backward: identity,
    assert torch.allclose(X.grad, torch.full_like(X, 6.0))           # f backward: all-reduce
    assert log.total("f backward: reduce-scatter") > 0 and log.total() == 2 * fwd


@pytest.mark.parametrize("k", [1, 2, 4])
def test_megatron_mlp_equals_unsplit_mlp(k):
    devices = [torch.device("cpu")] * k
    g = torch.Generator().manual_seed(k)
    n, d, h, o = 6, 5, 12, 4
    tensors = [torch.randn(*s, generator=g).requires_grad_()
               for s in [(n, d), (d, h), (h,), (h, o), (o,)]]
    log = CommLog()
    Y = megatron_mlp(*tensors, devices, log)
    R = torch.randn(Y.shape, generator=g)
    got = torch.autograd.grad((Y * R).sum(), tensors)
    X, W1, b1, W2, b2 = tensors
    Y0 = torch.relu(X @ W1 + b1) @ W2 + b2
    want = torch.autograd.grad((Y0 * R).sum(), tensors)
    assert max_abs_diff(Y, Y0) < 1e-4 and max_abs_diff(list(got), list(want)) < 1e-4
    # one all-reduce of the output forward, one of the input gradient backward
    assert log.total("g forward: reduce-scatter") + log.total("g forward: all-gather") \
        == 2 * (k - 1) * n * o * 4
    assert log.total("f backward: reduce-scatter") + log.total("f backward: all-gather") \
        == 2 * (k - 1) * n * d * 4
    assert log.total() == 2 * (k - 1) * (n * o + n * d) * 4


def test_max_abs_diff():
    assert max_abs_diff(torch.zeros(3), torch.tensor([0.0, -2.0, 1.0])) == 2.0
    assert max_abs_diff([torch.ones(2)], [torch.ones(2)]) == 0.0
