"""Part VII's edge cases: nothing silently wrong, nothing dying by a signal. The 3-D GPT refuses
a batch that does not split over its data-parallel ranks; dropless expert parallelism finishes
backward when every token goes to one expert and the input needs no gradient; ring attention
and capacity-limited expert parallelism refuse unequal token counts, naming them, on gloo
processes (where a size mismatch would abort a rank); a capacity factor must be a finite
number > 0."""
import math

import part7_ranks
import pytest
import torch
from thread_ranks import run_threads

from helpers import ExpertParallelMoE, MoE, RankFailed, launch, train_3d_scratch
from helpers.expert_parallel.moe import expert_capacity


def test_3d_gpt_refuses_a_batch_that_does_not_split_over_dp():
    cfg = dict(shape=(1, 2, 1), model=dict(vocab=8, width=8, layers=1, heads=2, seq=4),
               batch=5, m=1, steps=1)
    with pytest.raises(RankFailed, match=r"batch of 5 sequences does not split over dp=2"):
        launch(train_3d_scratch, 2, cfg, quiet=True, timeout=120)


def test_unequal_token_counts_are_refused_by_name_on_gloo():
    got = launch(part7_ranks.uneven_tokens, 2, dict(tokens=[4, 2]), quiet=True, timeout=120)
    for r in got:
        assert "rank 0: 4, rank 1: 2 tokens" in r["ring"]
        assert "rank 0: 4 x 8, rank 1: 2 x 8" in r["expert"]


def _one_expert_unsplit(world):
    moe = MoE(width=8, hidden=16, n_experts=2 * world, k=1, capacity_factor=None)
    with torch.no_grad():
        moe.router.bias[0] += 100.0
    xs, Rs = [], []
    for rank in range(world):
        g = torch.Generator().manual_seed(rank)
        xs.append(torch.randn(6, 8, generator=g))
        Rs.append(torch.randn(6, 8, generator=g))
    y, aux = moe(torch.cat(xs), groups=world)
    (y * torch.cat(Rs)).sum().backward()
    assert aux["tokens_per_expert"][0] == 6 * world        # every token on expert 0
    return y.detach(), {n: p.grad for n, p in moe.named_parameters() if n.startswith("experts")}


def test_every_token_on_one_expert_finishes_backward_on_gloo():
    got = launch(part7_ranks.all_tokens_to_one_expert, 2, {}, quiet=True, timeout=120)
    y, grads = _one_expert_unsplit(2)
    torch.testing.assert_close(torch.cat([r["y"] for r in got]), y)
    for r in got:
        for n, gr in r["grads"].items():
            want = grads[n] if grads[n] is not None else torch.zeros_like(gr)
            torch.testing.assert_close(gr, want, msg=n)


def test_every_token_on_one_expert_finishes_backward_on_threads():
    y, _ = _one_expert_unsplit(4)
    results, _ = run_threads(_on_threads, 4, timeout=5.0)
    torch.testing.assert_close(torch.cat([r["y"] for r in results]), y)


def _on_threads(comm):
    moe = MoE(width=8, hidden=16, n_experts=8, k=1, capacity_factor=None)
    with torch.no_grad():
        moe.router.bias[0] += 100.0
    ep = ExpertParallelMoE(moe, comm)
    g = torch.Generator().manual_seed(comm.rank)
    x, R = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    y, _ = ep(x)
    (y * R).sum().backward()
    return dict(y=y.detach())


@pytest.mark.parametrize("factor", [math.nan, math.inf, -math.inf, 0, -1.0, True, "1.25"])
def test_capacity_factor_must_be_a_finite_positive_number(factor):
    with pytest.raises(ValueError, match="capacity factor must be a finite number > 0"):
        expert_capacity(16, 4, 2, factor)
    with pytest.raises(ValueError, match="capacity factor"):
        MoE(capacity_factor=factor)
