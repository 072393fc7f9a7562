"""The planner and Part VII's cost formulas (helpers/transformer_costs.py,
helpers/composed/planner.py): Korthikanti's activation counts and their TP/SP/AC variants, the
layouts the planner lists, and its refusals of bad input."""
import pytest

from helpers.composed.planner import candidate_layouts, layout_costs, plan
from helpers.transformer_costs import (activation_bytes_per_token, block_params,
                                       moe_dispatch_bytes, ring_attention_bytes)

BIG = dict(layers=32, width=4096, heads=32, vocab=32000, seq=4096, batch=512)
H100 = dict(memory=80 * 2**30, flops=989e12, bandwidth=450e9)


@pytest.mark.parametrize("tp,sp,rec,want", [
    (1, False, "none", lambda h, a, s, t: 34 + 5 * a * s / h),
    (8, False, "none", lambda h, a, s, t: 10 + 24 / t + 5 * a * s / (h * t)),
    (8, True, "none", lambda h, a, s, t: (34 + 5 * a * s / h) / t),
    (8, True, "selective", lambda h, a, s, t: 34 / t),
    (1, False, "full", lambda h, a, s, t: 2)])
def test_korthikanti(tp, sp, rec, want):
    h, a, s = 4096, 32, 2048
    got = activation_bytes_per_token(h, a, s, tp, sp, rec, dtype_bytes=2, flash=False,
                                     dropout=True, ln_stats=False)
    assert got / h == pytest.approx(want(h, a, s, tp))


def test_block_params_and_bytes():
    assert block_params(32) == 12 * 32 * 32 + 13 * 32          # SmallBlock, unsplit
    assert block_params(32, 2) * 2 - block_params(32) == 6 * 32   # replicated part twice
    assert ring_attention_bytes(8, 16, 1) == 0
    assert ring_attention_bytes(8, 16, 2) == 8 * 8 * 16 * 4
    assert moe_dispatch_bytes(16, 8, 4, 2, 1.0, 2) == 4 * 2 * 8 * 8 * 4


def test_layouts_respect_the_model():
    rows = candidate_layouts(BIG, 64)
    assert rows and all(r["dp"] * r["tp"] * r["pp"] * r["cp"] == 64 for r in rows)
    assert all(BIG["heads"] % r["tp"] == 0 and BIG["layers"] % r["pp"] == 0 for r in rows)
    assert {r["zero"] for r in rows if r["dp"] * r["cp"] == 1} <= {"dp"}


def test_plan_fits_and_ranks():
    rows = plan(BIG, H100, 64)
    assert rows and all(r["memory"] <= H100["memory"] for r in rows)
    assert [r["seconds"] for r in rows] == sorted(r["seconds"] for r in rows)
    small = dict(H100, memory=1 * 2**30)
    assert all(r["memory"] <= small["memory"] for r in plan(BIG, small, 64))
    one = layout_costs(BIG, H100, dict(dp=64, zero="dp", m=1))
    assert not one["fits"]          # 7B parameters with Adam state on every GPU: no
    moe = plan(dict(BIG, experts=8, k=2), H100, 64, top=3)
    assert moe


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="needs heads"):
        plan(dict(layers=2, width=8, vocab=8, seq=8, batch=2), H100, 2)
    with pytest.raises(ValueError, match="must be > 0"):
        plan(dict(BIG, width=0), H100, 2)
    with pytest.raises(ValueError, match="whole number"):
        plan(BIG, H100, 2.5)
    with pytest.raises(ValueError, match="recompute"):
        activation_bytes_per_token(8, 2, 8, recompute="some")
