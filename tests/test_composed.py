"""Everything at once (helpers/composed): the small GPT trained on a 2x2x2 mesh (pp x dp x tp)
of 8 gloo processes, from the course's pieces and with torch's engines, equals one process in
losses and weights; both build the groups of helpers.rank_grid; and the planner's cost model
predicts each rank's memory within 15% and its bytes per step exactly."""
import pytest
import torch

import helpers
from helpers import gather_shards, launch, run_ranks
from helpers.composed.experiments import train_3d_scratch, train_3d_torch
from helpers.composed.planner import stage_costs
from helpers.composed.scratch import one_process_run
from helpers.runtime.mesh import rank_grid

SHAPE = (2, 2, 2)
MODEL = dict(vocab=16, width=16, layers=2, heads=2, seq=8)
CFG = dict(shape=SHAPE, model=MODEL, batch=4, m=2, steps=2)


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(8, [("scratch", train_3d_scratch, CFG), ("torch", train_3d_torch, CFG)])


@pytest.fixture(scope="module")
def reference():
    return one_process_run(CFG)


def _weights(ranks, kind):
    got = {}
    if kind == "torch":          # full_tensor() gathered them; one rank per stage keeps them
        for r in ranks:
            got.update(r["torch"].weights or {})
        return got
    for p in range(SHAPE[0]):    # dp replicas agree; the tp slices are concatenated
        got.update(gather_shards([r["scratch"].weights for r in ranks
                                  if r["scratch"].coords["pp"] == p
                                  and r["scratch"].coords["dp"] == 0]))
    return got


@pytest.mark.parametrize("kind", ["scratch", "torch"])
def test_equal_to_one_process(ranks, reference, kind):
    losses, weights = reference
    last = [r[kind] for r in ranks if r[kind].coords["pp"] == SHAPE[0] - 1]
    assert len(last) == 4
    for r in last:
        assert r.losses == pytest.approx(losses, rel=1e-5, abs=1e-6)
    got = _weights(ranks, kind)
    assert set(got) == set(weights)
    for n, w in weights.items():
        torch.testing.assert_close(got[n], w, rtol=1e-5, atol=1e-6, msg=n)


def test_groups_are_the_mesh(ranks):
    grid = rank_grid(SHAPE)
    for rank, r in enumerate(ranks):
        for name in ("pp", "dp", "tp"):
            mine = [g for g in grid[name] if rank in g]
            assert r["scratch"].groups[name] == mine[0] == r["torch"].groups[name]


def test_planner_predicts_memory_and_bytes(ranks):
    model = dict(MODEL, batch=CFG["batch"])
    lay = dict(dp=2, tp=2, pp=2, m=2, zero="dp")
    stages = stage_costs(model, lay, optimizer="momentum", dtype_bytes=4)
    for r in ranks:
        got, want = r["scratch"], stages[r["scratch"].coords["pp"]]
        mem = got.memory
        assert [mem.params, mem.grads, mem.optim] == [want[p] for p in ("params", "grads", "optim")]
        measured = mem.total
        assert abs(want["memory"] - measured) <= 0.15 * measured
        assert (got.sent.tp, got.sent.pp) == (want["bytes"]["tp"], want["bytes"]["pp"])
        # DDPFromScratch all-reduces one "used" flag per parameter tensor with its last bucket
        flags = helpers.ring_bytes_per_device(4 * len(got.weights), lay["dp"])
        assert got.sent.dp == want["bytes"]["dp"] + flags


# ---- the planner's other axes: ZeRO-2, cp = 2, recomputation ---------------------------------
CP_CFG = dict(shape=(2, 2), model=dict(MODEL, layers=2), batch=4, steps=2)


@pytest.fixture(scope="module")
def cp_ranks():
    return launch(helpers.train_cp_zero2, 4, CP_CFG, quiet=True)


@pytest.mark.parametrize("rec", ["none", "full"])
def test_cp_zero2_equals_one_process_and_the_planner(cp_ranks, rec):
    losses, weights = one_process_run(CP_CFG)
    got = cp_ranks[0][rec]
    assert got.losses == pytest.approx(losses, rel=1e-5, abs=1e-6)
    for n, w in weights.items():
        torch.testing.assert_close(got.weights[n], w, rtol=1e-5, atol=1e-6, msg=n)
    model = dict(CP_CFG["model"], batch=CP_CFG["batch"])
    want = stage_costs(model, dict(dp=2, cp=2, zero="zero2", recompute=rec, m=1),
                       optimizer="momentum", dtype_bytes=4)[0]
    tensors = len(weights)                 # Zero2's "used" flags, one float per tensor
    for r in cp_ranks:
        mem, sent = r[rec].memory, r[rec].sent
        assert [mem.params, mem.grads, mem.optim] == [
            want[p] for p in ("params", "grads", "optim")]
        assert sent.cp == want["bytes"]["cp"]
        assert sent.dp == want["bytes"]["dp"] + helpers.ring_bytes_per_device(4 * tensors, 4)
        # the count keeps what forward saved; the allocator also holds what backward makes
        recomputed = want["tokens"] * helpers.activation_bytes_per_token(
            16, 2, 8, dtype_bytes=4) if rec == "full" else 0
        assert abs(mem.acts_kept - (want["acts"] - recomputed)) <= 0.25 * mem.acts_kept
        assert mem.peak > want["acts"]


def test_a_model_cfg_may_leave_sizes_to_the_gpts_defaults():
    """cfg["model"] names only the sizes it changes; gpt's own defaults give the rest, read
    from its signature (no second copy of them, no KeyError), and a misspelt size is refused."""
    cfg = dict(shape=(1, 1, 1), model={"width": 64}, batch=2, steps=1)
    losses, weights = one_process_run(cfg)
    assert weights["0.tok.weight"].shape == (32, 64) and len(losses) == 1   # gpt's vocab 32
    (got,) = launch(train_3d_scratch, 1, cfg, quiet=True, timeout=120)
    assert got.weights["0.tok.weight"].shape == (32, 64) and len(got.losses) == 1
    with pytest.raises(TypeError, match="'widht' -> 'width'"):
        one_process_run(dict(cfg, model={"widht": 64}))
