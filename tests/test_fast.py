"""Part IV: every speed fix gives the same result as the plain Part II path (across processes:
test_fast_processes.py)."""
import warnings

import pytest
import torch

import helpers
from helpers import (
    FastDataParallel,
    OverlapReducer,
    ResidentLoader,
    allreduce,
    bucketed_allreduce,
    flat_allreduce,
    flatten,
    get_params,
    init_lenet_params,
    ring_allreduce,
    ring_bytes_per_device,
    train_batch,
    train_batch_overlap,
    unflatten_into,
)

CPU = torch.device("cpu")


def fake_data(n=150, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def grad_lists(k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in helpers.models.LENET_SHAPES] for _ in range(k)]


def max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


# --- the resident loader ---------------------------------------------------------------------

def test_resident_loader_order_is_the_seeded_permutation():
    X, y = fake_data(37)
    loader = ResidentLoader(X, y, 8, seed=5)
    g = torch.Generator().manual_seed(5)
    assert len(loader) == 5
    epochs = []
    for _ in range(2):
        perm = torch.randperm(37, generator=g)
        batches = list(loader)
        assert [len(b[0]) for b in batches] == [8, 8, 8, 8, 5]
        assert torch.equal(torch.cat([b[0] for b in batches]), X[perm])
        assert torch.equal(torch.cat([b[1] for b in batches]), y[perm])   # pairs kept
        epochs.append(perm)
    assert not torch.equal(epochs[0], epochs[1]), "each epoch must reshuffle"
    again = ResidentLoader(X, y, 8, seed=5)
    assert torch.equal(torch.cat(again.index_batches()), epochs[0]), "same seed, same order"


def test_resident_loader_without_shuffle_keeps_order():
    X, y = fake_data(10)
    assert torch.equal(torch.cat(ResidentLoader(X, y, 4, shuffle=False).index_batches()),
                       torch.arange(10))


# --- flat, bucketed and ring allreduce --------------------------------------------------------

def test_flatten_unflatten_round_trip():
    ts = grad_lists(1)[0]
    flat = flatten(ts)
    assert flat.shape == (129068,)
    out = [torch.zeros_like(t) for t in ts]
    unflatten_into(flat, out)
    assert all(torch.equal(a, b) for a, b in zip(ts, out))
    with pytest.raises(ValueError):
        unflatten_into(flat[:-1], out)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("variant", ["flat", "bucketed"])
def test_flat_and_bucketed_allreduce_equal_the_naive_one(k, variant):
    grads, expected = grad_lists(k, seed=k), grad_lists(k, seed=k)
    objects = [list(g) for g in grads]
    for i in range(len(expected[0])):
        allreduce([expected[c][i] for c in range(k)])
    if variant == "flat":
        flat_allreduce(grads)
    else:
        buckets = bucketed_allreduce(grads, bucket_bytes=20_000)
        assert len(buckets) > 1 and sorted(sum(buckets, [])) == list(range(8))
    for c in range(k):
        assert all(a is b for a, b in zip(grads[c], objects[c])), "must work in place"
        assert all(torch.equal(a, b) for a, b in zip(grads[c], expected[c]))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [3, 1001, 4099])
def test_ring_allreduce_equals_the_naive_one(k, n):
    g = torch.Generator().manual_seed(n + k)
    data = [torch.randn(n, generator=g) for _ in range(k)]
    naive = [d.clone() for d in data]
    allreduce(naive)
    storages = [d.data_ptr() for d in data]
    sent = ring_allreduce(data)
    assert [d.data_ptr() for d in data] == storages
    for d in data:
        torch.testing.assert_close(d, naive[0], rtol=1e-5, atol=1e-5)
    assert sum(sent) == 2 * (k - 1) * n, "a ring moves 2(k-1)/k of the data per device"
    assert max(sent) <= ring_bytes_per_device(n, k) + 2, sent
    ints = [torch.randint(-50, 50, (n,), generator=g).float() for _ in range(k)]
    total = sum(t.clone() for t in ints)
    ring_allreduce(ints)
    assert all(torch.equal(t, total) for t in ints), "integer sums must be exact"


def test_ring_allreduce_keeps_shapes():
    data = [torch.ones(4, 5) * (i + 1) for i in range(3)]
    ring_allreduce(data)
    assert all(torch.equal(d, torch.full((4, 5), 6.0)) for d in data)


def test_the_in_place_ring_is_part_ones_ring_counted_on_its_byte_log(monkeypatch):
    """One ring in the course: Part IV's in-place ring_allreduce runs Part I's ring_all_reduce,
    and the counts it returns are what that ring's ByteLog recorded per device."""
    data = [torch.arange(10.0) + i for i in range(3)]
    log = helpers.ByteLog()
    helpers.ring.ring_all_reduce([d.clone() for d in data], [CPU] * 3, log)
    calls = []
    real = helpers.data_parallel.allreduce.ring_all_reduce
    monkeypatch.setattr(helpers.data_parallel.allreduce, "ring_all_reduce",
                        lambda *a: calls.append(a) or real(*a))
    sent = ring_allreduce(data)
    assert len(calls) == 1
    assert sent == [log.numbers(src=i) for i in range(3)] == [14, 13, 13]


# --- overlap via gradient hooks ---------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 3])
def test_overlap_trainer_equals_train_batch(k):
    X, y = fake_data()
    devices = [CPU] * k
    p0 = init_lenet_params(seed=1)
    ref = [get_params(p0, d) for d in devices]
    ov = [get_params(p0, d) for d in devices]
    reducer = OverlapReducer(ov, bucket_bytes=100_000)
    assert len(reducer.buckets) > 1
    assert reducer.buckets[0][0] == 7, "the last layer's gradients arrive first"
    loader = ResidentLoader(X, y, 64, seed=3)
    for _ in range(2):
        for idx in loader.index_batches():
            l_ref = train_batch(X[idx], y[idx], ref, devices, 0.2)
            l_ov = train_batch_overlap(X[idx], y[idx], ov, devices, 0.2, reducer)
            assert torch.allclose(l_ref, l_ov)
    assert reducer.reduced[:len(reducer.buckets)] == list(range(len(reducer.buckets)))
    for c in range(k):
        assert max_diff(ref[c], ov[c]) < 1e-6
    reducer.remove()


def test_overlap_reducer_reduces_during_backward():
    """When the first layer's gradient lands, the later buckets must already be summed."""
    devices = [CPU, CPU]
    X, y = fake_data(32)
    ov = [get_params(init_lenet_params(seed=2), d) for d in devices]
    reducer = OverlapReducer(ov, bucket_bytes=100_000)
    seen = []
    ov[1][0].register_post_accumulate_grad_hook(lambda p: seen.append(list(reducer.reduced)))
    train_batch_overlap(X, y, ov, devices, 0.1, reducer)
    assert seen and len(seen[0]) >= len(reducer.buckets) - 1


def test_overlap_reducer_complains_when_a_replica_skipped_backward():
    ov = [get_params(init_lenet_params(seed=2), CPU) for _ in range(2)]
    reducer = OverlapReducer(ov)
    X, y = fake_data(8)
    helpers.loss(helpers.lenet(X, ov[0]), y).sum().backward()
    with pytest.raises(RuntimeError, match="never"):
        reducer.wait()


# --- the fast trainer -------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 3])
def test_fast_step_equals_train_batch(k):
    X, y = fake_data(150)
    devices = [CPU] * k
    p0 = init_lenet_params(seed=1)
    ref = [get_params(p0, d) for d in devices]
    net = FastDataParallel(p0, devices, 0.2, X, y)
    loader = ResidentLoader(X, y, 64, seed=3)   # batches of 64, 64, 22
    for _ in range(3):
        for idx in loader.index_batches():
            l_ref = train_batch(X[idx], y[idx], ref, devices, 0.2)
            l_fast = net.step(idx)
            torch.testing.assert_close(l_fast, l_ref, rtol=1e-5, atol=1e-5)
    for c in range(k):
        assert max_diff(ref[c], net.params[c]) < 1e-6
        assert max_diff(ref[c], p0) > 1e-3, "training must have moved the parameters"
    for c in range(k):   # views into the flat buffers, gradients still views after training
        assert net.params[c][0].grad.data_ptr() == net.flat_grads[c].data_ptr()
        assert net.params[c][-1].data_ptr() > net.flat_params[c].data_ptr()
        assert net.flat_grads[c].abs().max() == 0, "gradients must be cleared after a step"


def test_fast_replicas_own_their_storage():
    net = FastDataParallel(init_lenet_params(seed=0), [CPU, CPU], 0.1, *fake_data(8))
    assert net.flat_params[0].data_ptr() != net.flat_params[1].data_ptr()


def test_cuda_graph_refused_where_it_cannot_work():
    with pytest.raises(ValueError, match="CUDA graph"):
        FastDataParallel(init_lenet_params(seed=0), [CPU], 0.1, *fake_data(8), cuda_graph=True)
    with pytest.raises(ValueError, match="replica_streams"):
        FastDataParallel(init_lenet_params(seed=0), [CPU, CPU], 0.1, *fake_data(8),
                         replica_streams=True)


def test_compile_falls_back_to_eager(monkeypatch):
    def broken(fn, *a, **kw):
        raise RuntimeError("no compiler here")
    monkeypatch.setattr(torch, "compile", broken)
    X, y = fake_data(40)
    p0 = init_lenet_params(seed=1)
    eager = FastDataParallel(p0, [CPU], 0.2, X, y)
    comp = FastDataParallel(p0, [CPU], 0.2, X, y, compile=True)
    idx = torch.arange(40)
    eager.step(idx)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        comp.step(idx)
    assert any("torch.compile failed" in str(x.message) for x in w)
    assert max_diff(eager.params[0], comp.params[0]) == 0


def test_compile_falls_back_when_a_later_call_fails(monkeypatch):
    """A recompile (here: the second call, a new batch size) that fails must not crash training."""
    calls = []

    def flaky(fn, *a, **kw):
        def compiled(*args):
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("recompile failed")
            return fn(*args)
        return compiled
    monkeypatch.setattr(torch, "compile", flaky)
    X, y = fake_data(40)
    p0 = init_lenet_params(seed=1)
    eager = FastDataParallel(p0, [CPU], 0.2, X, y)
    comp = FastDataParallel(p0, [CPU], 0.2, X, y, compile=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for idx in (torch.arange(40), torch.arange(30), torch.arange(20)):
            eager.step(idx)
            comp.step(idx)
    assert sum("torch.compile failed" in str(x.message) for x in w) == 1, "warn once"
    assert len(calls) == 2, "after a failure, stay eager"
    # the first step ran the stand-in "compiled" function, the fused LeNet: rounding apart
    assert max_diff(eager.params[0], comp.params[0]) < 1e-6


def test_lr_change_takes_effect():
    """lr is a tensor the step reads: a schedule that sets net.lr is obeyed, never ignored."""
    X, y = fake_data(64)
    p0 = init_lenet_params(seed=2)
    devices = [CPU, CPU]
    net = FastDataParallel(p0, devices, 0.2, X, y)
    ref = [get_params(p0, d) for d in devices]
    idx = torch.arange(64)
    for lr in (0.2, 0.05, 0.0):
        net.lr = lr
        before = [p.detach().clone() for p in net.params[0]]
        net.step(idx)
        if lr > 0:   # train_batch refuses lr 0; the reference replicas simply stay put
            train_batch(X[idx], y[idx], ref, devices, lr)
        assert net.lr == pytest.approx(lr)
        assert max_diff(ref[0], net.params[0]) < 1e-6
    assert max_diff(before, net.params[0]) == 0, "lr 0 must leave the parameters unchanged"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_lr_change_reaches_the_cuda_graph():
    dev = torch.device("cuda:0")
    X, y = (t.to(dev) for t in fake_data(64))
    net = FastDataParallel(init_lenet_params(seed=2), [dev], 0.2, X, y, cuda_graph=True, warmup=1)
    idx = torch.arange(64, device=dev)
    for _ in range(3):                  # warm-up, capture, replay
        net.step(idx)
    net.lr = 0.0
    before = [p.detach().clone() for p in net.params[0]]
    net.step(idx)                       # a replay
    torch.cuda.synchronize()
    assert max_diff(before, net.params[0]) == 0, "the graph ignored the new lr"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("k,streams", [(1, False), (2, False), (2, True), (3, True)])
def test_cuda_graph_step_equals_train_batch(k, streams):
    dev = torch.device("cuda:0")
    X, y = fake_data(300)
    X, y = X.to(dev), y.to(dev)
    devices = [dev] * k
    p0 = init_lenet_params(seed=1)
    ref = [get_params(p0, d) for d in devices]
    net = FastDataParallel(p0, devices, 0.2, X, y, cuda_graph=True, warmup=2,
                           replica_streams=streams)
    loader = ResidentLoader(X, y, 64, seed=3)
    for _ in range(5):   # full batches become a graph in epoch 1, the short one in epoch 3
        for idx in loader.index_batches():
            train_batch(X[idx], y[idx], ref, devices, 0.2)
            net.step(idx)
    assert set(net.graphs) == {64, 300 % 64}
    torch.cuda.synchronize()
    for c in range(k):
        assert max_diff(ref[c], net.params[c]) < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_graph_of_the_compiled_step_equals_train_batch():
    """compile=True inside a CUDA graph (the benchmark's fast-compile row on a GPU)."""
    dev = torch.device("cuda:0")
    X, y = (t.to(dev) for t in fake_data(256))
    p0 = init_lenet_params(seed=1)
    ref = [get_params(p0, dev)]
    net = FastDataParallel(p0, [dev], 0.2, X, y, cuda_graph=True, warmup=2, compile=True)
    loader = ResidentLoader(X, y, 64, seed=3)   # one batch size: warm-up, capture, replays
    for _ in range(3):
        for idx in loader.index_batches():
            train_batch(X[idx], y[idx], ref, [dev], 0.2)
            net.step(idx)
    torch.cuda.synchronize()
    assert set(net.graphs) == {64} and net.compiled
    assert max_diff(ref[0], net.params[0]) < 1e-4


def test_train_fast_follows_the_resident_loader_order():
    """train_fast = train_batch over ResidentLoader's batches, with the same init and seed."""
    r = helpers.train_fast(2, 128, 0.2, num_epochs=2, subset=300, seed=4, verbose=False)
    X, y = helpers.load_tensors(True, 300)
    devices = [CPU, CPU]
    ref = [get_params(init_lenet_params(seed=4), d) for d in devices]
    loader = ResidentLoader(X, y, 128, seed=4)
    for _ in range(2):
        for idx in loader.index_batches():
            train_batch(X[idx], y[idx], ref, devices, 0.2)
    assert max_diff(ref[0], r["params"]) < 1e-6
    assert len(r["epoch_times"]) == 2 and 0 <= r["test_acc"] <= 1
