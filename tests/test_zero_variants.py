"""ZeRO's variants (helpers/sharding/variants.py, variants_experiments.py): ZeRO-R's activation
partitioning and constant buffers priced by the course's counts, FSDP2's CPU offload run on two
processes (same weights, state on the host, the bytes a step copies across PCIe as the model
says), qwZ's block quantization within its bound through a gather, and ZeRO++'s bytes per
collective."""
import pytest
import torch
from torch import nn

import helpers
from helpers.checks._core import World
from helpers.sharding import variants as v


def test_activation_partitioning_keeps_1_over_tp_for_a_twelfth_of_tp_traffic():
    for tp in (2, 4, 8):
        c = v.activation_partition_costs(512, 8, 256, 12, 2, tp, dtype_bytes=2)
        one = 2 * 256 * 512 * 2               # one (b, s, h) bf16 activation
        assert c["kept_bytes"] == 12 * one
        assert c["partitioned_bytes"] == pytest.approx(12 * one / tp)
        assert c["pa_sent_bytes"] == pytest.approx(12 * one * (tp - 1) / tp)
        assert c["pa_sent_bytes"] / c["tp_sent_bytes"] == pytest.approx(1 / 12)
    assert v.activation_partition_costs(512, 8, 256, 12, 2, 1)["pa_sent_bytes"] == 0


def test_a_constant_buffer_is_the_largest_bucket_not_the_model():
    net = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)])
    whole = sum(p.numel() for p in net.parameters()) * 4
    assert v.fused_buffer_bytes(net.parameters()) == whole
    const = v.fused_buffer_bytes(net.parameters(), bucket_mb=0.25)
    buckets = helpers.make_buckets(list(net.parameters()), 0.25)
    assert const == max(sum(p.numel() for p in b) for b in buckets) * 4
    assert const < whole / 3
    assert v.fused_buffer_bytes(net.parameters(), 0.25, dtype_bytes=2) == const / 2


def test_offload_costs_move_the_state_to_the_host():
    c = v.offload_costs(1000, 4)
    z3 = helpers.sharding_costs(1000, 4, "zero3")
    assert c["host_bytes"] == z3["total_bytes"] and c["device_state_bytes"] == 0
    assert c["h2d_bytes"] == 2 * z3["params_bytes"] and c["d2h_bytes"] == z3["grads_bytes"]


@pytest.mark.parametrize("bits", [8, 4])
def test_block_quantization_stays_within_half_a_step_of_each_block(bits):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g) * (10 ** (torch.rand(1000, generator=g) * 4 - 2))
    x[:64] = 0                                       # an all-zero block: no division by zero
    q, s = v.quantize_blocks(x, 64, bits)
    assert q.dtype == torch.int8 and q.numel() == 1024 and s.numel() == 16
    assert q.abs().max() <= 2 ** (bits - 1) - 1
    back = v.dequantize_blocks(q, s, x.numel())
    err = (back - x).abs()
    per = (s / 2).repeat_interleave(64)[:1000]
    assert torch.all(err <= per * (1 + 1e-6) + 1e-12)
    assert err.max() <= v.quantization_bound(x, 64, bits) * (1 + 1e-6)
    assert torch.all(back[:64] == 0)


def test_quantize_refuses_bad_settings_in_one_line():
    with pytest.raises(ValueError, match="bits 4 or 8"):
        v.quantize_blocks(torch.ones(4), 2, bits=3)
    with pytest.raises(ValueError, match="block"):
        v.quantize_blocks(torch.ones(4), 0)


def test_quantized_all_gather_equals_the_gather_within_the_bound_for_a_quarter_the_bytes():
    g = torch.Generator().manual_seed(1)
    world, n, block = 3, 250, 32
    shards = [torch.randn(n, generator=g) * 10 ** r for r in range(world)]
    w = World(world)
    got = w.run(lambda comm: v.quantized_all_gather(shards[comm.rank], world, block))
    want = torch.cat(shards)
    bound = max(v.quantization_bound(s, block) for s in shards)
    for r in range(world):
        assert (got[r] - want).abs().max() <= bound * (1 + 1e-6)
        sent = sum(m.nbytes for m in w.sent(rank=r))
        blocks = -(-n // block)
        assert sent == blocks * block + 4 * blocks        # int8 values + a float32 scale each
        assert sent < 0.3 * 4 * n


def test_zeropp_costs_follow_each_technique():
    n, k, g = 10**9, 64, 8
    base = v.zeropp_costs(n, k, g)
    z3 = helpers.sharding_costs(n, k, "zero3", "mixed_adam", 2)
    assert base["inter_bytes"] == pytest.approx(z3["sent_bytes"]) and base["intra_bytes"] == 0
    rows = base["rows"]
    q = v.zeropp_costs(n, k, g, qwz=True)["rows"]
    assert q["forward all-gather"][0] == pytest.approx(
        rows["forward all-gather"][0] * (1 + 4 / 256) / 2)
    h = v.zeropp_costs(n, k, g, hpz=True)
    assert h["rows"]["backward all-gather"] == (pytest.approx((g - 1) / g * 2 * n), "intra")
    assert h["extra_memory_bytes"] == 2 * n / g
    assert h["memory_bytes"] == pytest.approx(z3["total_bytes"] + 2 * n / g)
    qg = v.zeropp_costs(n, k, g, qgz=True)["rows"]["gradient reduce-scatter"][0]
    assert qg == pytest.approx(rows["gradient reduce-scatter"][0] * (0.5 + 4 / 256) / 2)
    allz = v.zeropp_costs(n, k, g, qwz=True, hpz=True, qgz=True)
    assert allz["inter_bytes"] < base["inter_bytes"] / 3
    with pytest.raises(ValueError, match="divide"):
        v.zeropp_costs(n, 10, 4)


def test_plot_variants_draws_a_bar_per_variant():
    import matplotlib
    matplotlib.use("Agg")
    a = v.activation_partition_costs(1024, 16, 1024, 24, 1, 8)
    mem = v.variant_memory(10**9, 64, a["kept_bytes"], buffer_elements=10**8,
                           tp_partitioned=a["partitioned_bytes"])
    assert mem["+ Offload"]["host"] == helpers.sharding_costs(
        10**9, 64, "zero3", "mixed_adam", 2)["total_bytes"]
    traffic = v.variant_traffic(10**9, 64, 8)
    assert list(traffic) == ["ZeRO-3", "+ qwZ", "+ hpZ", "+ qgZ"]
    fig = v.plot_variants(mem, traffic)
    top, bottom = (ax.get_title(loc="left") for ax in fig.axes[:2])
    assert "memory" in top and "sent" in bottom
    assert len(fig.axes[1].patches) == 1 + 1 + 2 + 2           # one or two parts per bar
    matplotlib.pyplot.close(fig)


def test_fsdp2_cpu_offload_trains_the_same_and_copies_what_the_model_says():
    out = helpers.run_ranks(2, [("off", helpers.offload_run, dict(
        sizes=dict(width=64, depth=3), num_steps=2))], backend="gloo")
    for rank in out:
        r = rank["off"]
        assert r.diff <= 1e-6        # the same steps; CPU Adam vs device Adam may round
        off = r.offload
        assert off.weights == off.grads == off.optimizer == "cpu"
        assert off.state_bytes == 2 * off.shard_bytes          # AdamW: two moments
        assert off.h2d_per_step == 2 * off.shard_bytes         # forward + backward
        assert off.d2h_per_step == off.shard_bytes             # float32 gradient shard
        want = v.offload_costs(off.n_params, 2)
        assert off.h2d_per_step == want["h2d_bytes"]
