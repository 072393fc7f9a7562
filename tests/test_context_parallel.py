"""Context parallelism (helpers/context_parallel): ring attention by hand on 2 gloo processes
equals unsplit attention in values and gradients (contiguous and zig-zag, causal), sends what
the cost model says, balances the causal work with the zig-zag split; the attention layer's
activations per rank grow linearly with the sequence; torch's context_parallel is attempted
and either matches or reports why not. The same code on 3 and 4 thread-ranks."""
import pytest
import torch

from helpers.context_parallel import (attention_reference, block_work, cp_chapter,
                                      ring_attention, shard_sequence, split_positions,
                                      unshard_sequence)
from helpers.context_parallel.experiments import qkv_inputs
from helpers.transformer_costs import ring_attention_bytes
from helpers import launch, run_threads

SIZE = dict(B=1, H=2, T=16, D=4)
CFG = dict(attention=dict(SIZE, causal=True, layouts=("contiguous", "zigzag")),
           memory=dict(width=8, heads=2, batch=1, seqs=[8, 16, 32]),
           torch=dict(width=8, heads=2, batch=1, T=8))


@pytest.fixture(scope="module")
def ranks():
    return launch(cp_chapter, 2, CFG, quiet=True)


def reference(causal=True):
    q, k, v, g = qkv_inputs(**SIZE)
    for t in (q, k, v):
        t.requires_grad_()
    out = attention_reference(q, k, v, causal)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), g)]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_equals_unsplit_in_values_and_gradients(ranks, layout):
    want = reference()
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        got = unshard_sequence([r["attention"][layout][name] for r in ranks], layout)
        torch.testing.assert_close(got, want[i], rtol=1e-5, atol=1e-6, msg=name)


def test_bytes_match_the_cost_model(ranks):
    B, H, T, D = SIZE.values()
    for r in ranks:
        got = r["attention"]["zigzag"]
        assert got["fwd_bytes"] + got["bwd_bytes"] == ring_attention_bytes(B * T // 2, H * D, 2)
        assert got["fwd_bytes"] == 2 * B * H * (T // 2) * D * 4      # K and V, once


def test_zigzag_balances_causal_work(ranks):
    work = {lay: [sum(r["attention"][lay]["work"]) for r in ranks]
            for lay in ("contiguous", "zigzag")}
    assert work["zigzag"][0] == work["zigzag"][1]
    assert work["contiguous"][0] < work["contiguous"][1]
    assert work == {lay: block_work(SIZE["T"], 2, lay) for lay in work}


def test_activation_memory_per_rank_is_linear_in_the_sequence(ranks):
    for r in ranks:
        rows = r["memory"]
        assert max(row["max_diff"] for row in rows) < 1e-5
        per_token = {row["saved_bytes"] / row["T"] for row in rows}
        assert len(per_token) == 1                      # twice the tokens, twice the bytes


def test_torch_context_parallel_matches_or_says_why(ranks):
    for r in ranks:
        got = r["torch"]
        if got["ran"]:
            assert got["max_diff"] < 1e-4
        else:
            assert got["device"] == "cpu" and got["error"]


@pytest.mark.parametrize("world,layout,causal", [(3, "zigzag", True), (4, "contiguous", True),
                                                  (4, "zigzag", False)])
def test_ring_on_threads(world, layout, causal):
    size = dict(SIZE, T=24)
    q, k, v, g = qkv_inputs(**size)

    def rank_fn(comm):
        ql, kl, vl = (shard_sequence(t, world, comm.rank, layout).requires_grad_()
                      for t in (q, k, v))
        out = ring_attention(ql, kl, vl, comm, causal, layout)
        out.backward(shard_sequence(g, world, comm.rank, layout))
        return out.detach(), ql.grad, kl.grad, vl.grad

    results, comms = run_threads(rank_fn, world)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = attention_reference(q, k, v, causal)
    want = [out.detach(), *torch.autograd.grad(out, (q, k, v), g)]
    for i in range(4):
        got = unshard_sequence([r[i] for r in results], layout)
        torch.testing.assert_close(got, want[i], rtol=1e-5, atol=1e-6)
    for c in comms:      # only ever to the next rank of the ring
        assert {peer for op, peer, _ in c.log if op == "send"} == {(c.rank + 1) % world}


def test_split_refuses_a_sequence_that_does_not_divide():
    with pytest.raises(ValueError, match="multiple of 8"):
        split_positions(12, 4, 0, "zigzag")
    assert split_positions(8, 2, 0, "zigzag").tolist() == [0, 1, 6, 7]
