"""Tensor parallel across processes (helpers/tensor_parallel/): the Megatron SmallMLP and the
block with attention split by heads, from scratch (f/g over torch.distributed) and with DTensor,
equal to the unsplit block (outputs, parameter and input gradients) on 2 gloo ranks, with the
communication each does counted; the same code on 4 thread-ranks."""
import pytest
import torch

from helpers import (TPBlock, TPMLP, block_inputs, block_loss, gather_shards, run_threads,
                     small_block, launch, split_dims, tp_worker)

BLOCK = dict(width=16, heads=4)
INPUTS = dict(batch=2, seq=6, width=16)
ACT_BYTES = 2 * 6 * 16 * 4          # one (batch, seq, width) float32 activation


@pytest.fixture(scope="module")
def ranks():
    return launch(tp_worker, 2, dict(block=BLOCK, inputs=INPUTS), quiet=True)


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
        torch.testing.assert_close(r[name]["out"], out, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r[name]["x_grad"], x_grad, rtol=1e-5, atol=1e-6)
    got = gather_shards([r[name]["grads"] for r in ranks])
    assert set(got) == set(grads)
    for n in grads:
        torch.testing.assert_close(got[n], grads[n], rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("name", ["mlp", "block", "dtensor"])
def test_shards_are_half(ranks, name):
    _, grads, _ = reference("mlp" if name == "mlp" else "block")
    dims = split_dims(grads)
    for n, g in ranks[0][name]["grads"].items():
        want = list(grads[n].shape)
        if dims[n] is not None:
            want[dims[n]] //= 2
        assert list(g.shape) == want, n


def test_one_all_reduce_each_way_per_sublayer(ranks):
    """Megatron: one all-reduce of one activation in forward and one in backward, per SmallMLP (and
    per attention); DTensor with PrepareModuleInput does the same, without it one per q/k/v."""
    ops = lambda log: [(op, b) for op, _, b in log]                          # noqa: E731
    r = ranks[0]
    assert ops(r["mlp"]["fwd"]) == [("all_reduce", ACT_BYTES)]
    assert ops(r["mlp"]["bwd"]) == [("all_reduce", ACT_BYTES)]
    assert ops(r["block"]["fwd"]) == ops(r["block"]["bwd"]) == [("all_reduce", ACT_BYTES)] * 2
    assert ops(r["dtensor"]["fwd"]) == ops(r["dtensor"]["bwd"]) == [("all_reduce", ACT_BYTES)] * 2
    assert len(r["dtensor_plain"]["bwd"]) == 4
    assert sum(r["dtensor"]["comm_counts"].values()) == 4


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
    assert comms[0].calls("all_reduce") == (2 if part == "mlp" else 4)


def test_heads_must_divide():
    block = small_block(width=12, heads=3)
    with pytest.raises(ValueError, match="heads do not split"):
        run_threads(lambda comm: TPBlock(block, comm), 2)
