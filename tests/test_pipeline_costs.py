"""Pipeline and stage cost models: the bubble of unequal stages, schedules replayed with
modelled durations, interleaved 1F1B, the network split's cuts, the step-time model of
split_costs, and the cost rows' keys against their TypedDicts."""
import itertools
import random

import pytest
import torch

import helpers
from helpers import (
    ByteLog,
    all_close,
    balanced_cuts,
    bubble_fraction,
    clock_ticks,
    gpipe_order,
    interleaved_bubble,
    interleaved_order,
    interleaved_ticks,
    layer_sizes,
    lenet_module,
    loss,
    measured_bubble,
    multiply_adds,
    network_cuts,
    one_f_one_b_order,
    run_interleaved,
    split_costs,
    split_sequential,
    stage_times,
    unequal_bubble,
    with_durations,
)

CPU = torch.device("cpu")


def _schedule(orders):
    """A recorded-schedule skeleton (no model run) from per-stage orders."""
    return [dict(stage=s, phase=ph, micro=j, tick=t, start=0.0, end=1.0, live=0)
            for (s, ph, j), t in clock_ticks(orders).items()]


# ---- the bubble of unequal stages --------------------------------------------------------------
@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (2, 4), (4, 8), (3, 5)])
def test_unequal_bubble_is_the_formula_for_equal_stages(p, m):
    assert unequal_bubble([1.0] * p, [2.0] * p, m) == pytest.approx(bubble_fraction(p, m))


@pytest.mark.parametrize("seed", range(6))
def test_unequal_bubble_equals_the_replay_of_gpipe(seed):
    rng = random.Random(seed)
    p, m = rng.randint(2, 5), rng.randint(1, 8)
    f = [rng.uniform(0.1, 3) for _ in range(p)]
    b = [rng.uniform(0.1, 3) for _ in range(p)]   # the bottleneck may differ from f's
    replayed = with_durations(_schedule(gpipe_order(p, m)), f, b)
    assert measured_bubble(replayed) == pytest.approx(unequal_bubble(f, b, m), abs=1e-12)
    assert stage_times(replayed) == (pytest.approx(f), pytest.approx(b))
    assert unequal_bubble(f, b, m) > bubble_fraction(p, m) - 1e-12   # never below equal stages


def test_unequal_bubble_refuses_bad_input():
    with pytest.raises(ValueError, match="one forward and one backward"):
        unequal_bubble([1.0, 2.0], [1.0], 4)
    with pytest.raises(ValueError, match="at least one micro-batch"):
        unequal_bubble([1.0], [1.0], 0)


# ---- interleaved 1F1B ----------------------------------------------------------------------------
@pytest.mark.parametrize("p,v,mult", list(itertools.product([2, 3, 4], [1, 2, 3], [1, 2])))
def test_interleaved_order_is_complete_and_meets_its_formula(p, v, mult):
    m = mult * p
    orders = interleaved_order(p, m, v)
    for ops in orders:   # every device runs F and B of each (micro, chunk) once
        assert sorted(ops) == sorted((ph, j, c) for ph in "FB" for j in range(m)
                                     for c in range(v))
    ticks = 1 + max(interleaved_ticks(orders, v).values())
    assert 1 - 2 * m * v / ticks == pytest.approx(interleaved_bubble(p, m, v))
    if v == 1:      # one chunk per device: 1F1B's clock
        assert ticks == 1 + max(clock_ticks(one_f_one_b_order(p, m)).values())


def test_interleaved_order_refuses_micro_batches_that_do_not_fill_groups():
    with pytest.raises(ValueError, match="multiple of p"):
        interleaved_order(3, 4, 2)


def test_interleaved_run_takes_the_one_device_step():
    torch.manual_seed(0)
    net = lenet_module()
    for q in net.parameters():
        torch.nn.init.normal_(q, std=0.1)
    X, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    net.zero_grad()
    want = loss(net(X), y).mean()
    want.backward()
    ref = [q.grad.clone() for q in net.parameters()]
    devices, m = [CPU] * 2, 4
    chunks = split_sequential(net, [3, 6, 8], devices * 2)
    log = ByteLog()
    got, sched = run_interleaved(chunks, X, y, loss, devices, interleaved_order(2, m, 2), log)
    assert got == pytest.approx(want.item(), rel=1e-5)
    assert all_close([q.grad for c in chunks for q in c.parameters()], ref)
    assert log.calls() == m * 2 * (2 * 2 - 1)           # every chunk boundary, both ways
    assert {e["chunk"] for e in sched} == {0, 1} and {e["stage"] for e in sched} == {0, 1}
    with pytest.raises(ValueError, match="spread evenly"):
        run_interleaved(chunks[:3], X, y, loss, devices, interleaved_order(2, m, 2))


# ---- the network split's cuts --------------------------------------------------------------------
def _brute(memory, sent, k):
    n = len(memory)
    best = None
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = [0, *cuts, n]
        mem = max(sum(memory[x:z]) for x, z in zip(b, b[1:]))
        out = max((sent[x - 1] if x > 0 else 0) + (sent[z - 1] if z < n else 0)
                  for x, z in zip(b, b[1:]))
        if best is None or (mem, out) < best[:2]:
            best = (mem, out, list(cuts))
    return best


@pytest.mark.parametrize("seed", range(8))
def test_network_cuts_balance_memory_then_send_least(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 8)
    k = rng.randint(2, n)
    memory = [rng.choice([1, 2, 5, 5, 9]) for _ in range(n)]      # ties are common
    sent = [rng.randint(1, 20) for _ in range(n)]
    mem, out, _ = _brute(memory, sent, k)
    cuts = network_cuts(memory, sent, k)
    b = [0, *cuts, n]
    assert max(sum(memory[x:z]) for x, z in zip(b, b[1:])) == mem
    assert max((sent[x - 1] if x > 0 else 0) + (sent[z - 1] if z < n else 0)
               for x, z in zip(b, b[1:])) == out


def test_lenets_cuts_no_longer_send_the_most_for_nothing():
    """Memory-balanced cuts (balanced_cuts alone) make LeNet's first ReLU a stage of its own,
    whose whole output crosses a cut; network_cuts weighs what crosses."""
    sizes = layer_sizes(lenet_module(), (1, 28, 28))
    memory = [16 * r["params"] + 256 * 4 * r["acts"] for r in sizes]
    crossing = [2 * 256 * 4 * r["out"] for r in sizes]
    old = balanced_cuts(memory, 4)
    new = network_cuts(memory, crossing, 4)
    c = split_costs(sizes, 4, 256, 16.0, optimizer="adam")["network"]
    assert c["cuts"] == new and c["microbatches"] == 1
    worst = lambda cuts: max(crossing[x - 1] * (x > 0) for x in [0, *cuts]) if cuts else 0
    assert worst(new) <= worst(old)
    assert c["sent"] < 27.68896e6        # what the lone-ReLU stage sent (balanced_cuts' cuts)
    with pytest.raises(ValueError, match="cannot place"):
        network_cuts(memory, crossing, len(memory) + 1)


# ---- the step-time model -------------------------------------------------------------------------
def test_layer_sizes_count_the_multiply_adds():
    for net, shape in ((lenet_module(), (1, 28, 28)), (helpers.resnet18(width=8), (1, 28, 28))):
        macs = [r["macs"] for r in layer_sizes(net, shape)]
        assert macs == multiply_adds(net, shape)


def test_split_costs_step_seconds():
    sizes = layer_sizes(lenet_module(), (1, 28, 28))
    flops = 6 * 64 * sum(r["macs"] for r in sizes)
    one = split_costs(sizes, 1, 64, 16.0, tflops=2.0)["data"]
    assert one["seconds_step"] == pytest.approx(flops / 2e12) and one["seconds_exposed"] == 0
    c = split_costs(sizes, 4, 64, 16.0, latency_us=10.0, tflops=2.0, zero=True,
                    num_microbatches=4)
    for row in c.values():
        assert row["seconds_step"] == pytest.approx(row["seconds_compute"]
                                                    + row["seconds_exposed"])
    d = c["data"]
    assert d["seconds_compute"] == pytest.approx(flops / 2e12 / 4)
    assert d["seconds_exposed"] == pytest.approx(max(0.0, d["seconds"]
                                                     - 2 / 3 * d["seconds_compute"]))
    assert c["within layer"]["seconds_exposed"] == pytest.approx(c["within layer"]["seconds"])
    assert c["network"]["seconds_compute"] >= flops / 2e12 / 4    # never better than k-fold
    assert "seconds_step" not in split_costs(sizes, 4, 64, 16.0)["data"]
    with pytest.raises(ValueError, match="tflops must be > 0"):
        split_costs(sizes, 2, 64, 16.0, tflops=0)


def test_the_cost_rows_hold_the_keys_their_typeddicts_document():
    """SplitCost and ShardingCost say what a row holds: every required key is there, and no
    key is left undocumented (with tflops and zero: every optional one too)."""
    from helpers.costs import ShardingCost, SplitCost, sharding_costs
    sizes = layer_sizes(lenet_module(), (1, 28, 28))
    for tflops in (None, 2.0):
        for name, row in split_costs(sizes, 4, 64, 16.0, zero=True, tflops=tflops).items():
            assert SplitCost.__required_keys__ <= set(row) <= set(SplitCost.__annotations__), \
                (name, sorted(set(row) ^ set(SplitCost.__annotations__)))
    assert set(sharding_costs(100, 4, "zero2")) == set(ShardingCost.__annotations__)
