"""Each split within a layer (and the Megatron MLP over its ring) computes what the unsplit model
computes (outputs and gradients); the network split and the pipeline: test_pipeline_splits.py;
the cost model: test_split_costs.py.

Every equality test also runs a deliberately broken split (a dropped shard, partial sum or bias)
through the same comparison and requires it to be caught: the comparison can fail.
"""
import pytest
import torch
from torch.nn import functional as F

import helpers
from helpers import (
    ByteLog,
    all_close,
    copy_to_shards,
    dense_split_rows,
    lenet,
    lenet_gathered_shards,
    max_diff,
    megatron_mlp,
    reduce_from_shards,
    ring_bytes_per_device,
)
from helpers.models import LENET_SHAPES
from helpers.ring import ring_all_reduce, ring_reduce_scatter
from helpers.tensor_parallel.simulated import (
    all_gather_shards,
    conv_split_channels,
    dense_split_columns,
    lenet_within_layer,
)

torch.backends.cudnn.allow_tf32 = False   # exact float32 convolutions on GPUs too


def devices(k):
    return helpers.get_devices(k)


def leaves(*shapes, seed=0):
    """Random tensors (biases too, so a dropped bias shows) that require gradients."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(s, generator=g) * 0.1).requires_grad_() for s in shapes]


def same_as_unsplit(split, full, tensors, X):
    """Outputs and gradients (w.r.t. `tensors`) of split(X, *tensors) equal those of
    full(X, *tensors)."""
    outs, grads = [], []
    for fn in (split, full):
        for t in tensors:
            t.grad = None
        Y = fn(X, *tensors)
        (Y * torch.arange(Y.numel(), dtype=Y.dtype, device=Y.device)
         .reshape(Y.shape).cos()).sum().backward()
        outs.append(Y)
        grads.append([t.grad.clone() if t.grad is not None else torch.zeros_like(t)
                      for t in tensors])
    return all_close(outs[0], outs[1]) and all_close(grads[0], grads[1])


# deliberately broken splits: each must be caught by same_as_unsplit
def conv_drop_shard(X, W, b, devs):
    Ys = [F.conv2d(X, Wi, bi)
          for Wi, bi in zip(W.tensor_split(len(devs)), b.tensor_split(len(devs)))]
    return torch.cat(Ys[:-1] + [torch.zeros_like(Ys[-1])], dim=1)   # last device's shard lost


def columns_no_bias(X, W, b, devs):
    return torch.cat([X @ Wi for Wi in W.tensor_split(len(devs), dim=1)], dim=1)


def rows_drop_partial(X, W, b, devs):
    parts = [Xi @ Wi for Xi, Wi in zip(X.tensor_split(len(devs), dim=1), W.tensor_split(len(devs)))]
    return sum(parts[:-1]) + b   # one partial sum never added


def rows_bias_each(X, W, b, devs):
    parts = [Xi @ Wi + b
             for Xi, Wi in zip(X.tensor_split(len(devs), dim=1), W.tensor_split(len(devs)))]
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
            assert not same_as_unsplit(lambda X, W, b, broken=broken: broken(X, W, b, devs),
                                       full, [W, b], X), broken
    log = ByteLog()
    dense_split_rows(X, W, b, devs, log)
    assert log.wire_bytes("partial sum") == (k - 1) * 5 * 4 * 4   # k-1 partial sums, (5, 4)


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


@pytest.mark.parametrize("k", [2, 3, 4])
def test_lenet_gathered_shards(k):
    """The column split with all-gathers of the pooled shards: a reduce-scatter backward gives
    the unsplit gradients, and each collective moves (k-1)/k of its tensor per device."""
    params = leaves(*LENET_SHAPES)
    X, devs = torch.randn(3, 1, 28, 28), devices(k)
    assert same_as_unsplit(lambda X, *p: lenet_gathered_shards(X, p, devs),
                           lambda X, *p: lenet(X, p), params, X)
    log = ByteLog()
    out = lenet_gathered_shards(X, params, devs, log)
    out.square().sum().backward()
    # floats per example: pooled outputs all-gathered, the inputs of layers 2-4 reduce-scattered
    assert log.wire_bytes("all-gather") == (k - 1) * 3 * 4 * (3380 + 800 + 128 + 10)
    assert log.wire_bytes("reduce-scatter") == (k - 1) * 3 * 4 * (3380 + 800 + 128)
    assert log.wire_bytes() / k == pytest.approx(3 * 4 * (k - 1) / k * (4318 + 4308))


def test_gather_shards_backward_is_a_reduce_scatter():
    """Device j gets the sum over devices of its own slice of the gradient, nothing more."""
    devs = devices(3)
    shards = [torch.randn(2, c, requires_grad=True) for c in (2, 1, 2)]
    full = all_gather_shards(shards, devs)
    assert all(torch.equal(f, torch.cat(shards, 1)) for f in full)
    grads = [torch.randn(2, 5) for _ in devs]
    torch.autograd.backward(full, grads)
    total = sum(grads)
    for s, want in zip(shards, total.split([2, 1, 2], 1), strict=True):
        torch.testing.assert_close(s.grad, want)


def test_gather_shards_sends_each_shard_round_the_ring():
    """The traffic of all_gather_shards, send by send (helpers.ring's, on the shards as chunks):
    forward, at step s device i passes shard (i - s) % k to device i+1; backward, device i
    passes its partial sum of shard (i - s - 1) % k, so that shard j ends summed on device j."""
    devs, sizes = devices(3), (2, 1, 3)
    shards = [torch.randn(2, c, requires_grad=True) for c in sizes]
    log = ByteLog()
    torch.autograd.backward(all_gather_shards(shards, devs, log), [torch.ones(2, 6)] * 3)
    got = [(t.op, t.src, t.dst, t.payload) for t in log.records]
    ring = [(s, i) for s in range(2) for i in range(3)]
    assert got == [("all-gather", i, (i + 1) % 3, 2 * 4 * sizes[(i - s) % 3]) for s, i in ring] \
        + [("reduce-scatter", i, (i + 1) % 3, 2 * 4 * sizes[(i - s - 1) % 3]) for s, i in ring]


def test_ring_reduce_scatter_cuts_as_told():
    """cut(x) gives the k chunks in place of the flat near-equal ones; chunk (i+1) % k ends
    summed on device i, as without it."""
    xs = [torch.randn(2, 5) for _ in range(3)]
    chunks = ring_reduce_scatter(xs, devices(3), cut=lambda x: x.split([1, 3, 1], dim=1))
    want = sum(xs).split([1, 3, 1], dim=1)
    for i in range(3):
        torch.testing.assert_close(chunks[i][(i + 1) % 3], want[(i + 1) % 3])


# ---- tensor_parallel: the ring all-reduce and the Megatron MLP over simulated devices -----------


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_ring_all_reduce_sums_and_sends_2_k_minus_1_over_k(k):
    devices = [torch.device("cpu")] * k
    xs = [torch.randn(4, 3 * k) for _ in range(k)]
    originals = [x.clone() for x in xs]
    log = ByteLog()
    out = ring_all_reduce(xs, devices, log)
    want = sum(originals)
    assert all(torch.allclose(o, want, atol=1e-6) for o in out)
    assert all(torch.equal(x, o) for x, o in zip(xs, originals))   # the inputs are left alone
    nbytes = 4 * xs[0].numel()
    for i in range(k):   # 12k elements: chunks are equal, so the formula holds exactly
        assert log.wire_bytes(src=i) == ring_bytes_per_device(nbytes, k)
    assert log.wire_bytes("all-reduce: reduce-scatter") \
        == log.wire_bytes("all-reduce: all-gather") == (k - 1) * nbytes


def test_ring_all_reduce_uneven_chunks_total():
    k, devices = 4, [torch.device("cpu")] * 4
    xs = [torch.randn(7) for _ in range(k)]
    log = ByteLog()
    out = ring_all_reduce(xs, devices, log)
    assert torch.allclose(out[2], sum(xs), atol=1e-6)
    assert log.wire_bytes() == 2 * (k - 1) * 7 * 4       # every chunk goes k-1 hops, twice


def test_ring_all_reduce_rejects_wrong_count():
    with pytest.raises(ValueError, match="one per device"):
        ring_all_reduce([torch.ones(2)], [torch.device("cpu")] * 2)


def test_f_and_g_communicate_only_where_megatron_says():
    devices = [torch.device("cpu")] * 3
    X = torch.randn(4, 6, requires_grad=True)
    log = ByteLog()
    Xs = copy_to_shards(X, devices, log)
    assert log.wire_bytes() == 0 and all(torch.equal(x, X) for x in Xs)   # f forward: identity
    assert all(x.data_ptr() != X.data_ptr() for x in Xs)             # real copies
    Y = reduce_from_shards([x * (i + 1) for i, x in enumerate(Xs)], devices, log)
    assert torch.allclose(Y, 6 * X) and log.wire_bytes("g forward: reduce-scatter") > 0
    fwd = log.wire_bytes()
    Y.sum().backward()                                               # g backward: identity,
    assert torch.allclose(X.grad, torch.full_like(X, 6.0))           # f backward: all-reduce
    assert log.wire_bytes("f backward: reduce-scatter") > 0 and log.wire_bytes() == 2 * fwd


@pytest.mark.parametrize("k", [1, 2, 4])
def test_megatron_mlp_equals_unsplit_mlp(k):
    devices = [torch.device("cpu")] * k
    g = torch.Generator().manual_seed(k)
    n, d, h, o = 6, 5, 12, 4
    tensors = [torch.randn(*s, generator=g).requires_grad_()
               for s in [(n, d), (d, h), (h,), (h, o), (o,)]]
    log = ByteLog()
    Y = megatron_mlp(*tensors, devices, log)
    R = torch.randn(Y.shape, generator=g)
    got = torch.autograd.grad((Y * R).sum(), tensors)
    X, W1, b1, W2, b2 = tensors
    Y0 = torch.relu(X @ W1 + b1) @ W2 + b2
    want = torch.autograd.grad((Y0 * R).sum(), tensors)
    assert max_diff(Y, Y0) < 1e-4 and max_diff(list(got), list(want)) < 1e-4
    # one all-reduce of the output forward, one of the input gradient backward
    assert log.wire_bytes("g forward: reduce-scatter") + log.wire_bytes("g forward: all-gather") \
        == 2 * (k - 1) * n * o * 4
    assert log.wire_bytes("f backward: reduce-scatter") + log.wire_bytes("f backward: all-gather") \
        == 2 * (k - 1) * n * d * 4
    assert log.wire_bytes() == 2 * (k - 1) * (n * o + n * d) * 4


def test_one_comparator_for_tensors_lists_and_dicts():
    assert max_diff(torch.zeros(3), torch.tensor([0.0, -2.0, 1.0])) == 2.0
    assert max_diff([torch.ones(2)], [torch.ones(2)]) == 0.0
    a, b = {"w": torch.ones(2), "b": torch.zeros(1)}, {"w": torch.ones(2), "b": torch.ones(1)}
    assert helpers.max_diff(a, b) == 1.0
    assert all_close(a, a) and not all_close(a, b)
    # what does not pair up is refused (max_diff) or unequal (all_close), never half compared
    for x, y in [([torch.ones(2)], [torch.ones(2)] * 2), (a, {"w": torch.ones(2)}),
                 (torch.ones(2), torch.ones(3)), ([], [])]:
        with pytest.raises(ValueError):
            helpers.max_diff(x, y)
        assert not all_close(x, y)
    assert helpers.max_diff(torch.tensor([1.0]), torch.tensor([1.0 + 2**-20])) == 2**-20
