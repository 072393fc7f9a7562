"""Expert parallelism (helpers/expert_parallel): the MoE layer with its experts spread over 2
gloo processes (all_to_all_single dispatch and combine) equals the unsplit layer in outputs,
input gradients, every weight's gradient and the tokens dropped, with and without a capacity
limit; its all-to-alls send exactly what the cost model says; a skewed router drops tokens
(capacity) or overloads one rank (dropless). Routing rules and 4 thread-ranks too; a shared
expert and the router z-loss; and the production path (EPMoE: torch's functional all-to-all,
DTensor expert weights, grouped GEMM) on 4 processes with EP x DP."""
import pytest
import torch
from thread_ranks import run_threads

from helpers import launch, run_ranks
from helpers.expert_parallel.experiments import (
    AUX,
    Z_LOSS,
    ep_equal_run,
    ep_imbalance_run,
    ep_production_run,
    moe_step,
)
from helpers.expert_parallel.moe import (
    MoE,
    expert_capacity,
    load_balancing_loss,
    moe_inputs,
    route,
    router_z_loss,
)
from helpers.expert_parallel.scratch import ExpertParallelMoE
from helpers.expert_parallel.torch_api import grouped_mm, permute_by_expert
from helpers.transformer_costs import moe_dispatch_bytes

MOE = dict(width=8, hidden=16, n_experts=4, k=2)
TOKENS, FACTORS = 32, [1.25, 0.5, None]
RUNS = [("equal", ep_equal_run, dict(moe=MOE, tokens=TOKENS, factors=FACTORS)),
        ("imbalance", ep_imbalance_run, dict(moe=MOE, tokens=TOKENS, skews=[0.0, 4.0],
                                             factors=[1.25, None], repeats=1))]


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(2, RUNS)


def unsplit(factor, groups):
    moe = MoE(**MOE, capacity_factor=factor)
    X, R = moe_inputs(TOKENS, MOE["width"])
    X.requires_grad_()
    y, aux = moe(X, groups=groups)
    ((y * R).sum() + AUX * aux["loss"] + Z_LOSS * aux["z_loss"]).backward()
    return y.detach(), X.grad, {n: p.grad for n, p in moe.named_parameters()}, aux


@pytest.mark.parametrize("i", range(len(FACTORS)))
def test_equal_to_unsplit(ranks, i):
    y, x_grad, grads, aux = unsplit(FACTORS[i], groups=2)
    runs = [r["equal"][i] for r in ranks]
    torch.testing.assert_close(torch.cat([r.y for r in runs]), y, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.cat([r.x_grad for r in runs]), x_grad,
                               rtol=1e-5, atol=1e-6)
    got = {}
    for r in runs:
        got.update(r.grads)
    assert set(got) == set(grads)
    for n in grads:
        torch.testing.assert_close(got[n], grads[n], rtol=1e-5, atol=1e-6, msg=n)
    assert sum(r.dropped for r in runs) == aux["dropped"]
    assert (aux["dropped"] > 0) == (FACTORS[i] == 0.5)


def test_bytes_match_the_cost_model(ranks):
    for r in ranks:
        for run in r["equal"]:
            if run.factor is None:
                continue
            want = moe_dispatch_bytes(run.tokens, MOE["width"], MOE["n_experts"], MOE["k"],
                                      run.factor, 2)
            assert run.fwd_bytes + run.bwd_bytes == want
            assert run.fwd_bytes == run.bwd_bytes


def test_imbalance_drops_tokens_or_overloads_a_rank(ranks):
    rows = {(row.skew, row.factor, rank): row
            for rank, r in enumerate(ranks) for row in r["imbalance"]}
    dropped = lambda skew: sum(rows[(skew, 1.25, r)].dropped for r in (0, 1))
    assert dropped(4.0) > dropped(0.0)
    # dropless: rank 0 holds expert 0, which a skewed router prefers
    load = [rows[(4.0, None, r)].received for r in (0, 1)]
    assert load[0] > load[1]
    assert sum(load) == sum(rows[(4.0, None, r)].choices for r in (0, 1))
    assert rows[(4.0, None, 0)].aux_loss > rows[(0.0, None, 0)].aux_loss


def test_four_ranks_on_threads():
    y, x_grad, grads, _ = unsplit(1.0, groups=4)
    X, R = moe_inputs(TOKENS, MOE["width"])

    def rank_fn(comm):
        ep = ExpertParallelMoE(MoE(**MOE, capacity_factor=1.0), comm)
        rows = slice(comm.rank * TOKENS // 4, (comm.rank + 1) * TOKENS // 4)
        return moe_step(ep, comm, X[rows], R[rows])

    results, comms, world = run_threads(rank_fn, 4, record=True)
    torch.testing.assert_close(torch.cat([r[0] for r in results]), y, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.cat([r[1] for r in results]), x_grad, rtol=1e-5,
                               atol=1e-6)
    for c in comms:   # every exchange reached every other rank, and counted as one call
        assert {m.dst for m in world.sent("send", rank=c.rank)} == set(range(4)) - {c.rank}
        assert c.traffic.calls("all_to_all") >= 4 and all(
            t.dst is None for t in c.traffic.records if t.op == "all_to_all")


def test_routing_rules():
    logits = torch.tensor([[3.0, 1, 0, 0], [3, 0, 1, 0], [0, 3, 0, 0], [3, 0, 0, 1]])
    r = route(logits, k=2, capacity=2)
    assert r["expert"][:, 0].tolist() == [0, 0, 1, 0]
    # expert 0 takes the first two first choices; the third first choice for it is dropped
    assert r["kept"][:, 0].tolist() == [True, True, True, False]
    assert expert_capacity(32, 4, 2, 1.25) == 20 and expert_capacity(32, 4, 2, None) is None
    uniform = torch.full((8, 4), 0.25)
    assert float(load_balancing_loss(uniform, torch.arange(8).view(4, 2) % 4, 4)) == 1.0
    with pytest.raises(ValueError, match="capacity factor"):
        expert_capacity(8, 4, 2, 0)
    with pytest.raises(ValueError, match="spread evenly"):
        run_threads(lambda comm: ExpertParallelMoE(MoE(**MOE), comm), 3)


# ---- as production code runs it: EPMoE (funcol all-to-all, DTensor weights, grouped GEMM) -----
PROD = dict(width=16, hidden=32, n_experts=4, k=2, shared_hidden=16)


def test_production_moe_with_ep_times_dp_equals_unsplit():
    """4 ranks, ep = 2: experts split over consecutive pairs, each expert's gradient reduced
    over its two replicas only, the router's and the shared expert's over all four."""
    got = launch(ep_production_run, 4, dict(moe=PROD, tokens=16, ep=2), quiet=True)
    moe = MoE(**PROD, capacity_factor=None)
    X, R = moe_inputs(16, PROD["width"])
    X.requires_grad_()
    y, aux = moe(X, groups=4)
    ((y * R).sum() + AUX * aux["loss"] + Z_LOSS * aux["z_loss"]).backward()
    torch.testing.assert_close(torch.cat([r.y for r in got]), y.detach())
    torch.testing.assert_close(torch.cat([r.x_grad for r in got]), X.grad)
    want = dict(moe.named_parameters())
    for rank, r in enumerate(got):
        assert len(r.grads) == 2 + 4 + 2 * 4 and r.first == 2 * (rank % 2)
        for n, g in r.grads.items():
            torch.testing.assert_close(g, want[n].grad, msg=n)
    rows = [sum(r.received) for r in got]
    assert sum(rows) == 16 * PROD["k"]


def test_grouped_gemm_and_its_loop_agree():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(12, 8, generator=g), torch.randn(3, 8, 16, generator=g)
    counts = [5, 0, 7]
    want = torch.cat([x[:5] @ w[0], x[5:5] @ w[1], x[5:] @ w[2]])
    torch.testing.assert_close(grouped_mm(x, w, counts), want)
    torch.testing.assert_close(grouped_mm(x[:, :6], w[:, :6, :], counts),   # unaligned: loop
                               torch.cat([x[:5, :6] @ w[0, :6], x[5:, :6] @ w[2, :6]]))
    order, n = permute_by_expert(torch.tensor([[2, 0], [0, 1], [2, 1]]), 3)
    assert order.tolist() == [1, 2, 3, 5, 0, 4] and n.tolist() == [2, 2, 2]


def test_shared_expert_and_z_loss_on_threads():
    moe_kw = dict(MOE, shared_hidden=8)
    ref = MoE(**moe_kw, capacity_factor=1.25)
    X, R = moe_inputs(TOKENS, MOE["width"])
    Xr = X.clone().requires_grad_()
    y, aux = ref(Xr, groups=2)
    ((y * R).sum() + AUX * aux["loss"] + Z_LOSS * aux["z_loss"]).backward()
    logits = ref.router(X)
    assert float(router_z_loss(logits.detach())) == pytest.approx(
        float((torch.logsumexp(logits, -1) ** 2).mean()))

    def rank_fn(comm):
        ep = ExpertParallelMoE(MoE(**moe_kw, capacity_factor=1.25), comm)
        rows = slice(comm.rank * TOKENS // 2, (comm.rank + 1) * TOKENS // 2)
        y, xg, _ = moe_step(ep, comm, X[rows], R[rows])
        return y, xg, [p.grad for p in ep.shared.parameters()]

    results, _ = run_threads(rank_fn, 2)
    torch.testing.assert_close(torch.cat([r[0] for r in results]), y.detach())
    torch.testing.assert_close(torch.cat([r[1] for r in results]), Xr.grad)
    for got, p in zip(results[0][2], ref.shared.parameters()):
        torch.testing.assert_close(got, p.grad)


def test_a_moe_cfg_may_leave_sizes_to_the_moes_defaults():
    """cfg["moe"] names only what it changes; MoE's own defaults (width 16) give the rest."""
    (rows,) = launch(ep_equal_run, 1, dict(moe={"n_experts": 2}, tokens=8, factors=[None]),
                     quiet=True, timeout=120)
    assert rows[0].y.shape == (8, 16)
