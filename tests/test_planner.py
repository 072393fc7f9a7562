"""The planner and Part VII's cost formulas (helpers/transformer_costs.py,
helpers/composed/planner.py): Korthikanti's activation counts and their TP/SP/AC variants, the
layouts the planner lists, its refusals of bad input; and that it prices what it chooses:
accumulation both ways against Part V's wrappers (bytes, gradient memory, on 2 gloo ranks),
ring attention hop by hop (cp = 2 and cp = 32 no longer tie), expert gradients over their own
group."""
import pytest

from helpers.composed.planner import (
    _stage_params,
    candidate_layouts,
    data_parallel_costs,
    layout_costs,
    plan,
    ring_exposed_seconds,
    stage_costs,
)
from helpers.transformer_costs import (
    activation_bytes_per_token,
    block_params,
    moe_dispatch_bytes,
    ring_attention_bytes,
)

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


# ---- what the planner prices, against what runs measure -------------------------------------
H70 = dict(layers=80, width=8192, heads=64, vocab=32000, seq=4096, batch=512)


def test_accumulation_is_a_dimension():
    rows = candidate_layouts(BIG, 64)
    both = {(r["zero"], r["m"] > 1): set() for r in rows}
    for r in rows:
        both[(r["zero"], r["m"] > 1)].add(r["acc"])
    assert both[("zero2", True)] == both[("zero3", True)] == {"every", "no_sync"}
    assert both[("zero2", False)] == {"every"} and both[("dp", True)] == {"no_sync"}
    n, k, m = 1000, 4, 8
    every = data_parallel_costs(n, k, "zero2", m, "every", "adam", 2)
    quiet = data_parallel_costs(n, k, "zero2", m, "no_sync", "adam", 2)
    assert every["sent_bytes"] == (m + 1) / 2 * quiet["sent_bytes"]
    assert every["grads_bytes"] * k == quiet["grads_bytes"] == n * 2
    z3 = data_parallel_costs(n, k, "zero3", m, "every", "adam", 2)
    assert z3["sent_bytes"] == 3 * m * (k - 1) / k * n * 2 and z3["params_bytes"] == n * 2 / k
    z3q = data_parallel_costs(n, k, "zero3", m, "no_sync", "adam", 2)
    assert z3q["params_bytes"] == z3q["grads_bytes"] == n * 2
    with pytest.raises(ValueError, match="acc must be one of"):
        data_parallel_costs(n, k, "zero2", m, "sometimes")


@pytest.fixture(scope="module")
def measured():
    """Part V's wrappers accumulating over 4 micro-batches on 2 gloo ranks, both ways."""
    import part7_ranks

    from helpers import launch
    return launch(part7_ranks.accumulation_measured, 2, dict(m=4), quiet=True)[0]


def test_accumulation_prices_match_part_v(measured):
    from helpers import make_model, ring_bytes_per_device
    m, k, n = 4, 2, measured["n_params"]
    net = make_model("mlp")
    flags = ring_bytes_per_device(4 * len(list(net.parameters())), k)   # Zero2's "used" flags
    for acc in ("every", "no_sync"):
        want = data_parallel_costs(n, k, "zero2", m, acc, "adam", 4)["sent_bytes"]
        assert getattr(measured["zero2"], acc).sent == want + flags, acc
    # ZeRO-3 from scratch: backward gathers a unit's weights again only where autograd kept
    # them, and the first layer's (whose input needs no gradient) it did not
    saved = m * (k - 1) / k * 4 * sum(p.numel() for p in net[0].parameters())
    want = data_parallel_costs(n, k, "zero3", m, "every", "adam", 4)["sent_bytes"]
    assert measured["fsdp_sent_every"] == want - saved
    # what the gradients hold before the last micro-batch: no_sync the full gradients; the
    # course's wrappers keep each micro-batch's reduced shard until finish (torch adds it in)
    shard = data_parallel_costs(n, k, "zero3", m, "every", "adam", 4)["grads_bytes"]
    full = data_parallel_costs(n, k, "zero3", m, "no_sync", "adam", 4)["grads_bytes"]
    other = measured["fsdp_held_no_sync"] - full
    assert 0 <= other < 0.05 * full
    assert measured["fsdp_held_every"] - (m - 1) * shard == other


def test_context_parallel_pays_per_hop_and_hides_only_behind_attention():
    gpu = dict(memory=80e9, flops=989e12, bandwidth=450e9)
    rows = plan(H70, gpu, 64, optimizer="mixed_adam")
    by_cp = {}
    for r in rows:
        if r["tp"] == r["pp"] == 1 and r["zero"] == "zero3" and r["recompute"] == "none":
            by_cp.setdefault(r["cp"], r["seconds"])
    assert by_cp[32] > by_cp[2] * 1.2          # 31 hops of 128 tokens cannot hide
    lay = dict(dp=32, cp=2, m=16)
    free = ring_exposed_seconds(1024, H70, lay, 1e15, 1e15, 0.0)
    slow = ring_exposed_seconds(1024, H70, lay, 1e15, 1e9, 10e-6)
    assert free < 1e-6 < slow          # only the last hop (the gradients home) shows
    again = ring_exposed_seconds(1024, H70, dict(lay, recompute="full"), 1e15, 1e9, 10e-6)
    assert again > slow


def test_a_ring_hop_hides_behind_half_a_block_after_the_first():
    """Causal zig-zag: the first hop overlaps the rank's own block, whole; later hops overlap
    half a block. A hop between half and a whole block's time hides at cp = 2 and shows at 3."""
    tokens, h, s, rate = 1024, H70["width"], H70["seq"], 1e15
    own3 = 4 * h * s * tokens / 3 / rate             # the own block's attention at cp = 3
    link = 2 * tokens * h * 2 / (0.75 * own3)        # a hop of 3/4 of it
    hop = 2 * tokens * h * 2 / link                  # K and V of the rank, no latency
    for cp in (2, 3, 4):
        own = 4 * h * s * tokens / cp / rate
        lay = dict(dp=1, cp=cp, m=1)
        got = ring_exposed_seconds(tokens, H70, lay, rate, link, 0.0)
        fwd = max(0.0, hop - own) + (cp - 2) * max(0.0, hop - own / 2)
        bwd = max(0.0, 2 * hop - 2 * own) + (cp - 2) * max(0.0, 2 * hop - own) + hop
        assert got == pytest.approx(fwd + bwd)
    assert own3 / 2 < hop < own3                     # the case that tells whole from half
    assert ring_exposed_seconds(tokens, H70, dict(cp=3), rate, link, 0.0) > hop + 1e-9


def test_no_sync_reduction_hides_only_behind_the_last_micro_batch():
    """Gradients reduced once (no_sync; plain dp, ZeRO-1) overlap the last micro-batch's
    backward; reduced every micro-batch (ZeRO-2/3 "every") they overlap the whole backward."""
    gpu = dict(memory=1e15, flops=989e12, bandwidth=20e9, latency=0.0)
    base = dict(dp=64, tp=1, pp=1, cp=1, m=8, recompute="none")
    rows = {acc: layout_costs(BIG, gpu, dict(base, zero="zero2", acc=acc), "mixed_adam")
            for acc in ("every", "no_sync")}
    for acc, r in rows.items():
        window = r["compute_s"] * 2 / 3 / (8 if acc == "no_sync" else 1)
        dp = r["stages"][0]["bytes"]["dp"] / gpu["bandwidth"]
        assert r["exposed_s"] == pytest.approx(max(0.0, dp - window))
    assert rows["no_sync"]["exposed_s"] > 0        # 26 GB at 20 GB/s > 1/8 of the backward
    plain = layout_costs(BIG, gpu, dict(base, zero="dp", acc="every"), "mixed_adam")
    assert plain["exposed_s"] == pytest.approx(rows["no_sync"]["exposed_s"])


def test_expert_gradients_are_reduced_over_their_own_group():
    moe = dict(BIG, experts=8, k=2)
    lay = dict(dp=8, ep=4, zero="dp", m=1)
    st = stage_costs(moe, lay)[0]
    dense, expert = _stage_params(moe, lay, 0)
    want = (data_parallel_costs(dense, 8, "dp")["sent_bytes"]
            + data_parallel_costs(expert, 2, "dp")["sent_bytes"])
    assert st["bytes"]["dp"] == want
    assert st["bytes"]["dp"] < data_parallel_costs(dense + expert, 8, "dp")["sent_bytes"]
