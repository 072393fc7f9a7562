"""2D parallelism (helpers.tensor_parallel.experiments): a 2x2 device mesh of 4 gloo processes,
tensor parallel over "tp" and FSDP2 over "dp" (per block, and on the root only), and HSDP
(replicate x shard), each training like one process; the collectives of a step counted per
mesh dimension; FSDP2's torch.chunk shards of rows that do not divide."""
import pytest
import torch

from helpers import block_inputs, block_loss, hsdp_worker, mesh2d_worker, run_ranks, small_stack

BLOCK = dict(width=16, heads=4)
INPUTS = dict(batch=4, seq=4, width=16)
STEPS, LR, BLOCKS = 1, 0.1, 2


@pytest.fixture(scope="module")
def ranks():
    base = dict(block=BLOCK, inputs=INPUTS, steps=STEPS, lr=LR, blocks=BLOCKS)
    return run_ranks(4, [("block", mesh2d_worker, dict(base, wrap="block")),
                         ("root", mesh2d_worker, dict(base, wrap="root")),
                         ("hsdp", hsdp_worker, base)])


def one_process():
    model = small_stack(BLOCKS, **BLOCK)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        X, R = block_inputs(**dict(INPUTS, seed=step))
        opt.zero_grad()
        loss = block_loss(model(X), R) / X.shape[0]
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, dict(model.named_parameters())


@pytest.mark.parametrize("label", ["block", "root", "hsdp"])
def test_equal_to_one_process(ranks, label):
    losses, weights = one_process()
    for r in ranks:
        assert r[label].losses == pytest.approx(losses, rel=1e-5, abs=1e-6)
    got = ranks[0][label].weights
    assert set(got) == set(weights)
    for n, w in weights.items():
        torch.testing.assert_close(got[n], w.detach(), rtol=1e-5, atol=1e-6, msg=n)


def test_mesh_coordinates_and_shards(ranks):
    assert [r["block"].coords for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    shapes = ranks[0]["block"].local_shapes
    # up: split by tp (columns) and by dp (FSDP's dim-0 shard): a quarter of the rows
    assert shapes["0.mlp.up.weight"] == (64 // 4, 16)
    # down: split by tp along its input (dim 1), then by FSDP along dim 0
    assert shapes["1.mlp.down.weight"] == (16 // 2, 64 // 2)
    assert shapes["0.ln1.weight"] == (16 // 2,)


def _calls(traffic, word):
    return sum(n for op, (n, _) in traffic.items() if word in op)


def test_traffic_per_mesh_dimension(ranks):
    """The root-only wrap all-gathers once per step (nothing again in backward); per
    block, each block is all-gathered before its forward and its backward (ZeRO-3)."""
    block, root = ranks[0]["block"].traffic, ranks[0]["root"].traffic
    assert _calls(block["dp"], "all_gather") == 2 * BLOCKS
    assert _calls(block["dp"], "reduce_scatter") == BLOCKS
    assert _calls(root["dp"], "all_gather") == 1 and _calls(root["dp"], "reduce_scatter") == 1
    assert _calls(block["tp"], "all_reduce") == 4 * BLOCKS == _calls(root["tp"], "all_reduce")
    assert "all_reduce" not in str(block["dp"])


def test_hsdp_all_reduces_across_replicas_and_shards_unevenly(ranks):
    h = ranks[0]["hsdp"]
    assert set(h.traffic["replicate"]) == {"all_reduce"}
    assert _calls(h.traffic["shard"], "all_gather") == 2 * BLOCKS
    assert "Replicate" in h.placements and "Shard(dim=0)" in h.placements
    # nn.Linear(5, 3) over 2 ranks: torch.chunk gives 2 rows and 1
    assert [r["hsdp"].odd_local["weight"] for r in ranks] == [(2, 5), (1, 5)] * 2
    assert all(r["hsdp"].odd_equal for r in ranks)
