"""2D parallelism (helpers.tensor_parallel.experiments.mesh2d_worker): a 2x2 device mesh of 4 gloo
processes, tensor parallel over "tp", data parallel (FSDP2) over "dp", trains like one process."""
import pytest
import torch

from helpers import block_inputs, block_loss, launch, mesh2d_worker, small_block

BLOCK = dict(width=16, heads=4)
INPUTS = dict(batch=4, seq=4, width=16)
STEPS, LR = 2, 0.1


@pytest.fixture(scope="module")
def ranks():
    return launch(mesh2d_worker, 4, dict(block=BLOCK, inputs=INPUTS, steps=STEPS, lr=LR),
                  quiet=True)


def one_process():
    block = small_block(**BLOCK)
    opt = torch.optim.SGD(block.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        X, R = block_inputs(**dict(INPUTS, seed=step))
        opt.zero_grad()
        loss = block_loss(block(X), R) / X.shape[0]
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, dict(block.named_parameters())


def test_equal_to_one_process(ranks):
    losses, weights = one_process()
    for r in ranks:
        assert r["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    got = ranks[0]["weights"]
    assert set(got) == set(weights)
    for n, w in weights.items():
        torch.testing.assert_close(got[n], w.detach(), rtol=1e-5, atol=1e-6, msg=n)


def test_mesh_coordinates_and_shards(ranks):
    assert [r["coords"] for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    shapes = ranks[0]["local_shapes"]
    # up: split by tp (columns) and by dp (FSDP's dim-0 shard): a quarter of the rows
    assert shapes["mlp.up.weight"] == (64 // 4, 16)
    # down: split by tp along its input (dim 1), then by FSDP along dim 0
    assert shapes["mlp.down.weight"] == (16 // 2, 64 // 2)
    assert shapes["ln1.weight"] == (16 // 2,)
    assert all(r["how"] == ranks[0]["how"] for r in ranks)
