"""Context parallelism (helpers/context_parallel): ring attention by hand on 3 gloo processes
equals unsplit attention in values and gradients (contiguous and zig-zag, causal); it sends what
the cost model says; with the half-block rule zig-zag lowers the busiest rank's products to
(w + 1) / 2w of the contiguous last rank's, counted; a rank never holds more than its own K/V
block and two (forward) or three (backward) more, counted from below by RingCensus, which sees
an all-gather's w; all-to-all (Ulysses) attention equals the ring and sends 8 (w-1)/w blocks;
the attention layer's activations per rank grow linearly with the sequence; torch's
context_parallel says why it does not run on a CPU. The same code on 2 to 8 thread-ranks."""
import part7_ranks
import pytest
import torch
from thread_ranks import run_threads

from helpers import run_ranks
from helpers.context_parallel.experiments import (
    cp_activation_memory,
    cp_attention_run,
    cp_torch_run,
    cp_ulysses_run,
    qkv_inputs,
)
from helpers.context_parallel.scratch import (
    attention_reference,
    block_work,
    causal_block,
    ring_attention,
    shard_sequence,
    split_positions,
    unshard_sequence,
)
from helpers.context_parallel.torch_api import context_parallel_status
from helpers.context_parallel.ulysses import ulysses_attention
from helpers.transformer_costs import ring_attention_bytes, ulysses_attention_bytes

WORLD = 4
SIZE = dict(B=1, H=4, T=32, D=2)
RUNS = [("attention", cp_attention_run,
         dict(SIZE, causal=True, layouts=("contiguous", "zigzag"))),
        ("ulysses", cp_ulysses_run, dict(SIZE, causal=True)),
        ("memory", cp_activation_memory, dict(width=8, heads=2, batch=1, seqs=[16, 32, 64])),
        ("kept", part7_ranks.census_of_kept_blocks, {})]


@pytest.fixture(scope="module")
def ranks():
    """The chapter's runs and a ring that keeps every block, in one launch of 4 processes."""
    return run_ranks(WORLD, RUNS)


def reference(causal=True, size=SIZE):
    q, k, v, g = qkv_inputs(**size)
    for t in (q, k, v):
        t.requires_grad_()
    out = attention_reference(q, k, v, causal)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), g)]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_equals_unsplit_in_values_and_gradients(ranks, layout):
    want = reference()
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        got = unshard_sequence([getattr(r["attention"][layout], name) for r in ranks], layout)
        torch.testing.assert_close(got, want[i], rtol=1e-5, atol=1e-6, msg=name)


def test_bytes_match_the_cost_model(ranks):
    B, H, T, D = SIZE.values()
    for r in ranks:
        got = r["attention"]["zigzag"]
        assert got.fwd_bytes + got.bwd_bytes == ring_attention_bytes(
            B * T // WORLD, H * D, WORLD)
        assert got.fwd_bytes == (WORLD - 1) * 2 * B * H * (T // WORLD) * D * 4


def test_zigzag_lowers_the_busiest_rank_to_the_formula(ranks):
    formed = {lay: [sum(b["products"] for b in r["attention"][lay].blocks
                        if b["phase"] == phase) for r in ranks]
              for lay in ("contiguous", "zigzag") for phase in ("forward", "backward")}
    L = SIZE["T"] // WORLD
    assert formed["contiguous"] == [L * L * (r + 1) for r in range(WORLD)]
    assert formed["zigzag"] == [L * L * (WORLD + 1) // 2] * WORLD
    assert max(formed["zigzag"]) * 2 * WORLD == max(formed["contiguous"]) * (WORLD + 1)
    assert formed["zigzag"] == block_work(SIZE["T"], WORLD, "zigzag")
    for r in ranks:           # the half blocks: every block after the first is (L/2) x L
        later = [b for b in r["attention"]["zigzag"].blocks if b["step"] > 0]
        assert later and all(b["products"] == L * L // 2 for b in later)


def test_a_rank_holds_three_blocks_not_the_sequence(ranks):
    for r in ranks:
        for lay in ("contiguous", "zigzag"):
            assert r["attention"][lay].live_fwd == 3.0     # its own, computing, arriving
            assert r["attention"][lay].live_bwd == 4.0     # ... and the gradient block


def test_the_census_sees_what_an_all_gather_holds(ranks):
    assert [r["kept"] for r in ranks] == [float(WORLD)] * WORLD


def test_ulysses_equals_the_ring_with_constant_bytes(ranks):
    want = reference()
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        got = unshard_sequence([getattr(r["ulysses"], name) for r in ranks], "contiguous")
        torch.testing.assert_close(got, want[i], rtol=1e-5, atol=1e-6, msg=name)
    B, H, T, D = SIZE.values()
    for r in ranks:
        assert r["ulysses"].sent == ulysses_attention_bytes(B * T // WORLD, H * D, WORLD)
        assert r["ulysses"].calls == 8                      # q, k, v, out; and back


def test_activation_memory_per_rank_is_linear_in_the_sequence(ranks):
    for r in ranks:
        rows = r["memory"]
        assert max(row.max_diff for row in rows) < 1e-5
        per_token = {row.saved_bytes / row.T for row in rows}
        assert len(per_token) == 1                      # twice the tokens, twice the bytes


def test_torch_context_parallel_runs_only_on_cuda():
    ok, why = context_parallel_status("cpu")
    assert not ok and "CUDA" in why
    # it has context_parallel and says only what is missing (no "and a torch that has it")
    assert why.count("context_parallel") == 1, why
    got = cp_torch_run(0, 1, dict(device=torch.device("cpu"), width=8, heads=2, batch=1, T=8))
    assert {m: r.ran for m, r in got.runs.items()} == {"allgather": False,
                                                       "alltoall": False}


def _ring_rank(comm, q, k, v, g, world, layout, causal, attention=ring_attention):
    ql, kl, vl = (shard_sequence(t, world, comm.rank, layout).requires_grad_()
                  for t in (q, k, v))
    stats = []
    kw = dict(stats=stats) if attention is ring_attention else {}
    out = attention(ql, kl, vl, comm, causal, layout, **kw)
    out.backward(shard_sequence(g, world, comm.rank, layout))
    return out.detach(), ql.grad, kl.grad, vl.grad, stats


@pytest.mark.parametrize("world,layout,causal", [
    (2, "zigzag", True), (3, "contiguous", False), (4, "zigzag", True), (5, "zigzag", True),
    (8, "contiguous", True), (8, "zigzag", False)])
def test_ring_on_threads(world, layout, causal):
    size = dict(SIZE, H=2, T=4 * world)
    q, k, v, g = qkv_inputs(**size)
    results, comms = run_threads(_ring_rank, world, q, k, v, g, world, layout, causal)
    want = reference(causal, size)
    for i in range(4):
        got = unshard_sequence([r[i] for r in results], layout)
        torch.testing.assert_close(got, want[i], rtol=1e-5, atol=1e-6)
    for c in comms:      # only ever to the next rank of the ring
        assert {r.dst for r in c.traffic.records if r.op == "send"} == {(c.rank + 1) % world}
    for phase in ("forward", "backward"):
        formed = [sum(b["products"] for b in r[4] if b["phase"] == phase) for r in results]
        assert formed == block_work(size["T"], world, layout, causal)


@pytest.mark.parametrize("world,layout,causal", [(2, "zigzag", True), (4, "contiguous", True),
                                                  (4, "zigzag", False)])
def test_ulysses_on_threads(world, layout, causal):
    size = dict(SIZE, H=4, T=4 * world)
    q, k, v, g = qkv_inputs(**size)
    results, _ = run_threads(_ring_rank, world, q, k, v, g, world, layout, causal,
                             ulysses_attention)
    want = reference(causal, size)
    for i in range(4):
        got = unshard_sequence([r[i] for r in results], layout)
        torch.testing.assert_close(got, want[i], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="3 heads do not split over 2 ranks"):
        run_threads(_ring_rank, 2, *qkv_inputs(1, 3, 8, 2), 2, "contiguous", True,
                    ulysses_attention)


def test_the_half_block_rule():
    # zig-zag, 4 ranks, 16 tokens: rank 2 holds [4, 5, 10, 11]
    mine = split_positions(16, 4, 2)
    assert causal_block(mine, split_positions(16, 4, 0))[:2] == (0, 2)   # its first half
    assert causal_block(mine, split_positions(16, 4, 3))[:2] == (2, 4)   # late queries
    first, cols, mask = causal_block(mine, mine)
    assert (first, cols) == (0, 4) and mask is not None
    assert causal_block(split_positions(8, 2, 0, "contiguous"),
                        split_positions(8, 2, 1, "contiguous"))[:2] == (4, 0)   # skipped
    assert block_work(16, 4, "zigzag") == [40] * 4 and block_work(16, 4, "contiguous") == [
        16, 32, 48, 64]
    assert block_work(16, 4, "zigzag", useful=True) == [34] * 4


def test_split_refuses_a_sequence_that_does_not_divide():
    with pytest.raises(ValueError, match="multiple of 8"):
        split_positions(12, 4, 0, "zigzag")
    assert split_positions(8, 2, 0, "zigzag").tolist() == [0, 1, 6, 7]
