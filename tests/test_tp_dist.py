"""Tensor parallel across processes (helpers/tensor_parallel/): the Megatron SmallMLP and the
block with attention split by heads, from scratch (f/g over torch.distributed) and with DTensor,
equal to the unsplit block (outputs, parameter and input gradients) on 2 gloo ranks, with the
communication each does counted; the same code on 4 thread-ranks. Sequence parallelism (by hand
and SequenceParallel) and the vocabulary split (by hand and loss_parallel), equal to one
process, their collectives and saved activations measured."""
import pytest
import torch
from thread_ranks import run_threads

from helpers import (
    TPMLP,
    SPBlock,
    TPBlock,
    block_inputs,
    block_loss,
    gather_shards,
    launch,
    small_block,
    split_dims,
    tiny_tp_lm,
    tp_worker,
)
from helpers.tensor_parallel.scratch import copy_to_tp, reduce_from_tp

BLOCK = dict(width=16, heads=4)
INPUTS = dict(batch=2, seq=6, width=16)
ACT_BYTES = 2 * 6 * 16 * 4          # one (batch, seq, width) float32 activation
LM = dict(model=dict(vocab=32, width=16, heads=4), batch=2, seq=6)


@pytest.fixture(scope="module")
def ranks():
    return launch(tp_worker, 2, dict(block=BLOCK, inputs=INPUTS, lm=LM), quiet=True)


def reference(part):
    block = small_block(**BLOCK)
    module = block.mlp if part == "mlp" else block
    X, R = block_inputs(**INPUTS)
    X.requires_grad_()
    out = module(X)
    block_loss(out, R).backward()
    return out.detach(), {n: p.grad for n, p in module.named_parameters()}, X.grad


@pytest.mark.parametrize("name", ["mlp", "block", "dtensor", "dtensor_plain"])
def test_equal_to_unsplit(ranks, name):
    out, grads, x_grad = reference("mlp" if name == "mlp" else "block")
    for r in ranks:
        torch.testing.assert_close(r[name].out, out, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r[name].x_grad, x_grad, rtol=1e-5, atol=1e-6)
    got = gather_shards([r[name].grads for r in ranks])
    assert set(got) == set(grads)
    for n in grads:
        torch.testing.assert_close(got[n], grads[n], rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("name", ["mlp", "block", "dtensor"])
def test_shards_are_half(ranks, name):
    _, grads, _ = reference("mlp" if name == "mlp" else "block")
    dims = split_dims(grads)
    for n, g in ranks[0][name].grads.items():
        want = list(grads[n].shape)
        if dims[n] is not None:
            want[dims[n]] //= 2
        assert list(g.shape) == want, n


def test_one_all_reduce_each_way_per_sublayer(ranks):
    """Megatron: one all-reduce of one activation in forward and one in backward, per SmallMLP (and
    per attention); DTensor with PrepareModuleInput does the same, without it one per q/k/v."""
    ops = lambda log: [(t.op, t.payload) for t in log]
    r = ranks[0]
    assert ops(r["mlp"].fwd) == [("all_reduce", ACT_BYTES)]
    assert ops(r["mlp"].bwd) == [("all_reduce", ACT_BYTES)]
    assert ops(r["block"].fwd) == ops(r["block"].bwd) == [("all_reduce", ACT_BYTES)] * 2
    assert ops(r["dtensor"].fwd) == ops(r["dtensor"].bwd) == [("all_reduce", ACT_BYTES)] * 2
    assert len(r["dtensor_plain"].bwd) == 4
    assert sum(r["dtensor"].comm_counts.values()) == 4


def _thread_block(comm, block, X, R, part):
    module = TPMLP(block.mlp, comm) if part == "mlp" else TPBlock(block, comm)
    X = X.clone().requires_grad_()
    out = module(X)
    block_loss(out, R).backward()
    return out.detach(), {n: p.grad for n, p in module.named_parameters()}, X.grad


@pytest.mark.parametrize("part", ["mlp", "block"])
def test_four_ranks_on_threads(part):
    out, grads, x_grad = reference(part)
    block = small_block(**BLOCK)
    X, R = block_inputs(**INPUTS)
    results, comms = run_threads(_thread_block, 4, block, X, R, part)
    for o, _, xg in results:
        torch.testing.assert_close(o, out, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(xg, x_grad, rtol=1e-5, atol=1e-6)
    got = gather_shards([g for _, g, _ in results])
    for n in grads:
        torch.testing.assert_close(got[n], grads[n], rtol=1e-5, atol=1e-6, msg=n)
    assert comms[0].traffic.calls("all_reduce") == (2 if part == "mlp" else 4)


def test_heads_must_divide():
    block = small_block(width=12, heads=3)
    with pytest.raises(ValueError, match="heads do not split"):
        run_threads(lambda comm: TPBlock(block, comm), 2)


# ---- sequence parallelism ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sp", "sp_dtensor"])
def test_sequence_parallel_equals_unsplit(ranks, name):
    """Each rank holds half the positions: the halves put together are the unsplit output and
    input gradient, and the gradients (the replicated ones summed over ranks) are too."""
    out, grads, x_grad = reference("block")
    torch.testing.assert_close(torch.cat([r[name].out for r in ranks], 1), out,
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.cat([r[name].x_grad for r in ranks], 1), x_grad,
                               rtol=1e-5, atol=1e-6)
    got = gather_shards([r[name].grads for r in ranks])
    for n in grads:
        torch.testing.assert_close(got[n], grads[n], rtol=1e-5, atol=1e-6, msg=n)


def test_sequence_parallel_moves_the_same_bytes_and_saves_less(ranks):
    """An all-gather of a half and a reduce-scatter of the whole replace each all-reduce: per
    rank the ring sends (k-1)/k of an activation for each, 2(k-1)/k for the pair, as the
    all-reduce; the activations autograd saves per rank shrink (the norm regions hold half)."""
    ops = lambda log: [(t.op, t.payload) for t in log]
    r = ranks[0]
    pair = [("all_gather", ACT_BYTES // 2), ("reduce_scatter", ACT_BYTES)]
    assert ops(r["sp"].fwd) == pair * 2
    regather = [("all_gather", ACT_BYTES // 2)]     # the saved positions, gathered again
    assert ops(r["sp"].bwd)[:6] == (regather + pair) * 2   # then the replicated gradients
    assert {op for op, _ in ops(r["sp"].bwd)[6:]} == {"all_reduce"}
    dt = ops(r["sp_dtensor"].fwd)
    assert [op for op, _ in dt] == ["all_gather_into_tensor", "reduce_scatter_tensor"] * 2
    wire = lambda log: sum(t.wire for t in log)
    assert wire(r["sp"].fwd) == wire(r["tp"].fwd) == wire(r["sp_dtensor"].fwd) > 0
    assert all(r["sp"].saved < r["tp"].saved < r["unsplit"].saved for r in ranks)
    # DTensor's SequenceParallel keeps the two gathered inputs whole; the hand-written one
    # keeps their halves (GatherLinears)
    assert r["sp_dtensor"].saved - r["sp"].saved == 2 * ACT_BYTES // 2


def test_sp_needs_the_sequence_to_divide():
    block = small_block(**BLOCK)
    X = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="does not split into 2"):
        run_threads(lambda comm: SPBlock(block, comm)(X[:, :3] if comm.rank == 0
                                                      else X[:, 3:]), 2)


# ---- the vocabulary split ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["vocab", "vocab_dtensor"])
def test_vocab_parallel_loss_and_gradients_equal_one_process(ranks, name):
    lm = tiny_tp_lm(**LM["model"])
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 32, (LM["batch"], LM["seq"]), generator=g)
    y = torch.randint(0, 32, ids.shape, generator=g)
    loss = torch.nn.functional.cross_entropy(lm(ids).flatten(0, 1), y.flatten())
    loss.backward()
    for r in ranks:
        assert r[name].loss == pytest.approx(loss.item(), rel=1e-5)
        assert r[name].logits_bytes == LM["batch"] * LM["seq"] * 16 * 4   # half the vocab
    for key in ("emb.weight", "head.weight"):
        got = torch.cat([r[name].grads[key] for r in ranks])
        want = lm.get_parameter(key).grad
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=key)


def test_the_two_f_g_pairs_are_the_same_operators():
    """Part I's f/g over simulated devices (copy_to_shards, reduce_from_shards) and Part VI's over
    a comm (copy_to_tp, reduce_from_tp): each chapter builds its own, and around a column-split
    then row-split pair of layers they give the same output and input gradient, the unsplit
    ones."""
    import helpers
    g = torch.Generator().manual_seed(0)
    X, A, B, R = (torch.randn(*s, generator=g) for s in ((3, 8), (8, 4), (4, 8), (3, 8)))
    k = 2
    As, Bs = A.chunk(k, dim=1), B.chunk(k, dim=0)
    devices = [torch.device("cpu")] * k
    Xs = X.clone().requires_grad_()
    shards = helpers.copy_to_shards(Xs, devices)
    Y = helpers.reduce_from_shards([x @ a @ b for x, a, b in zip(shards, As, Bs)], devices)
    (Y * R).sum().backward()

    def rank(r, world, cfg):
        x = X.clone().requires_grad_()
        y = reduce_from_tp(copy_to_tp(x, cfg["comm"]) @ As[r] @ Bs[r], cfg["comm"])
        (y * R).sum().backward()
        return y.detach(), x.grad

    for y, dx in helpers.launch(rank, k, threads=True, timeout=10):
        torch.testing.assert_close(y, Y.detach())
        torch.testing.assert_close(dx, Xs.grad)
    torch.testing.assert_close(Y.detach(), X @ A @ B)
    torch.testing.assert_close(Xs.grad, R @ (A @ B).T)
