"""The network split and the pipeline compute what the unsplit LeNet computes (outputs and
gradients), the recorded schedules have the bubble of the formula (GPipe, 1F1B, by clock
ticks and by measured time), and the chapter's proof catches stages that share layers."""
import pytest
import torch
from test_splits import devices

import helpers
from helpers import (
    ByteLog,
    all_close,
    bubble_fraction,
    clock_ticks,
    gpipe_order,
    lenet_module,
    measured_bubble,
    one_f_one_b_order,
    one_f_one_b_rank_order,
    peak_live,
    pipeline_1f1b,
    replay,
    run_schedule,
    schedule_bubble,
    split_sequential,
)
from helpers.pipeline_parallel.schedules import gpipe_rank_order
from helpers.pipeline_parallel.simulated import network_split_forward, pipeline_step

torch.backends.cudnn.allow_tf32 = False   # exact float32 convolutions on GPUs too



def reference(seed=0, n=12):
    torch.manual_seed(seed)
    net = lenet_module()
    for p in net.parameters():   # non-zero biases, so a dropped bias would show
        torch.nn.init.normal_(p, std=0.1)
    X, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
    l = helpers.loss(net(X), y).sum() / n
    l.backward()
    return net, X, y, l.item(), [p.grad for p in net.parameters()]



@pytest.mark.parametrize("cuts", [[7], [3, 7], [1, 4, 8]])
def test_network_split_forward_and_gradients(cuts):
    net, X, y, l, grads = reference()
    devs = devices(len(cuts) + 1)
    stages = split_sequential(net, cuts, devs)
    out = network_split_forward(stages, X, devs)
    assert all_close(out, net(X))
    (helpers.loss(out, y.to(out.device)).sum() / len(y)).backward()
    assert all_close([p.grad for s in stages for p in s.parameters()], grads)
    # stages are copies: their gradients did not land in the unsplit net
    assert all(p.grad is g for p, g in zip(net.parameters(), grads))


def test_network_split_catches_a_missing_stage():
    net, X, y, l, grads = reference()
    devs = devices(2)
    stages = split_sequential(net, [7], devs)
    stages[1] = stages[1][1:]    # drop the first dense layer: shapes break
    with pytest.raises(RuntimeError):
        network_split_forward(stages, X, devs)


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (3, 3), (4, 6)])
def test_pipeline_gradients_and_bubble(p, m):
    net, X, y, l, grads = reference(n=12)
    cuts = {2: [7], 3: [3, 7], 4: [3, 6, 8]}[p]
    devs = devices(p)
    stages = split_sequential(net, cuts, devs)
    log = ByteLog()
    total, schedule = pipeline_step(stages, X, y, helpers.loss, devs, m, log)
    assert total == pytest.approx(l, rel=1e-5)
    assert all_close([p_.grad for s in stages for p_ in s.parameters()], grads)
    assert len(schedule) == 2 * p * m     # every stage ran every micro-batch forward and back
    assert schedule_bubble(schedule) == pytest.approx(bubble_fraction(p, m))
    # each cut carries m activations forward and m gradients back
    assert log.calls() == 2 * (p - 1) * m


def test_pipeline_drops_nothing():
    """If a micro-batch were skipped, the gradient would differ: check the comparison sees it."""
    net, X, y, l, grads = reference(n=12)
    devs = devices(2)
    stages = split_sequential(net, [7], devs)
    pipeline_step(stages, X[:9], y[:9], helpers.loss, devs, 3)   # a micro-batch short
    assert not all_close([p.grad for s in stages for p in s.parameters()], grads)


def test_bubble_formula():
    assert bubble_fraction(1, 5) == 0
    assert bubble_fraction(4, 1) == pytest.approx(3 / 4)
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)



@pytest.mark.parametrize("p,m", [(2, 1), (2, 5), (3, 2), (4, 6)])
def test_1f1b_same_step_same_bubble_fewer_live(p, m):
    net, X, y, l, grads = reference(n=12)
    cuts = {2: [7], 3: [3, 7], 4: [3, 6, 8]}[p]
    devs = devices(p)
    runs = {}
    for fn in (pipeline_step, pipeline_1f1b):
        stages = split_sequential(net, cuts, devs)
        log = ByteLog()
        total, schedule = fn(stages, X, y, helpers.loss, devs, m, log)
        assert total == pytest.approx(l, rel=1e-5)
        assert all_close([p_.grad for s in stages for p_ in s.parameters()], grads)
        assert log.calls() == 2 * (p - 1) * m
        runs[fn.__name__] = schedule
    gpipe, ofob = runs["pipeline_step"], runs["pipeline_1f1b"]
    assert schedule_bubble(ofob) == pytest.approx(schedule_bubble(gpipe))
    assert schedule_bubble(ofob) == pytest.approx(bubble_fraction(p, m))
    assert peak_live(gpipe) == [m] * p                                   # GPipe keeps all m
    assert peak_live(ofob) == [min(m, p - s) for s in range(p)]          # 1F1B at most p - s
    # every activation was freed after its backward
    assert all(e["live"] == 0 for e in (gpipe[-1], ofob[-1]))


def test_one_convention_for_every_part():
    """Part I's orders (every stage) and Part VI's (one rank) are the same orders, (p, m) in that
    order everywhere, and GPipe runs its backwards in the order of its forwards."""
    for p in range(1, 5):
        for m in range(1, 7):
            want = [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
            assert gpipe_order(p, m) == [want] * p
            assert [gpipe_rank_order(p, m, r) for r in range(p)] == [want] * p
            assert one_f_one_b_order(p, m) == [one_f_one_b_rank_order(p, m, r) for r in range(p)]


def test_one_f_one_b_is_1f1b():
    """1F1B judged by what defines it, not by how the course builds it: every micro-batch's
    forward and backward once per rank, a backward after its forward, at most p - rank
    micro-batches in flight, the warm-up of p - rank - 1 forwards, then F and B in turn, and
    the critical path of 2(m + p - 1) ticks."""
    assert one_f_one_b_rank_order(2, 3, 0) == [("F", 0), ("F", 1), ("B", 0), ("F", 2),
                                               ("B", 1), ("B", 2)]
    assert one_f_one_b_rank_order(2, 3, 1) == [("F", 0), ("B", 0), ("F", 1), ("B", 1),
                                               ("F", 2), ("B", 2)]
    for p in range(1, 5):
        for m in range(1, 7):
            for r in range(p):
                order = one_f_one_b_rank_order(p, m, r)
                assert sorted(order) == sorted([("F", j) for j in range(m)] +
                                               [("B", j) for j in range(m)])
                live, most = 0, 0
                for phase, j in order:
                    assert phase == "F" or order.index(("F", j)) < order.index(("B", j))
                    live += 1 if phase == "F" else -1
                    most = max(most, live)
                assert most == min(p - r, m)
                warm = min(p - r - 1, m)
                first = min(warm + 1, m)
                assert order[:first] == [("F", j) for j in range(first)]
            assert 1 + max(clock_ticks(one_f_one_b_order(p, m)).values()) == 2 * (m + p - 1)


def test_clock_ticks_and_deadlock():
    ticks = clock_ticks(gpipe_order(2, 3))
    assert ticks[(0, "F", 2)] == 2 and ticks[(1, "F", 2)] == 3 and ticks[(1, "B", 0)] == 4
    assert ticks[(1, "B", 2)] == 6 and ticks[(0, "B", 2)] == 7   # backwards in forward order
    assert 1 + max(clock_ticks(one_f_one_b_order(3, 5)).values()) == 2 * (5 + 3 - 1)
    with pytest.raises(ValueError, match="waits forever"):
        clock_ticks([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])
    net, X, y, l, grads = reference(n=4)
    devs = devices(2)
    with pytest.raises(ValueError, match="once for each micro-batch"):
        run_schedule(split_sequential(net, [7], devs), X, y, helpers.loss, devs,
                     [[("F", 0), ("B", 0)], [("F", 0)]])


def fake_schedule(durations, orders):
    """A recorded schedule whose ops took `durations[stage]` seconds each."""
    return [dict(stage=s, micro=j, phase=ph, tick=t, start=0.0, end=durations[s], live=0)
            for (s, ph, j), t in clock_ticks(orders).items()]


def test_measured_bubble_weighs_time():
    p, m = 2, 4
    equal = fake_schedule([1.0, 1.0], gpipe_order(p, m))
    assert measured_bubble(equal) == pytest.approx(bubble_fraction(p, m))
    # stage 1 takes almost no time: device 1 idles almost all the step, device 0 almost never
    lopsided = fake_schedule([1.0, 1e-6], gpipe_order(p, m))
    assert measured_bubble(lopsided) == pytest.approx(0.5, abs=1e-4)
    assert schedule_bubble(lopsided) == pytest.approx(bubble_fraction(p, m))   # slots can't see it
    ran = replay(fake_schedule([1.0, 2.0], one_f_one_b_order(p, m)))
    for e in ran:    # an op never starts before the op it needs has finished
        if e["phase"] == "F" and e["stage"] == 1:
            (before,) = [f for f in ran if f["stage"] == 0 and f["phase"] == "F"
                         and f["micro"] == e["micro"]]
            assert e["start"] >= before["end"]



def code_cells(path):
    """{cell id: source} of the notebook's code cells."""
    import json
    nb = json.loads(path.read_text())
    return {c.get("id"): "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"}


def test_network_split_proof_catches_shared_layers():
    """The chapter's proof (its own cells, run here) passes the copying split and FAILS for
    stages that are net's own layers, whose gradients come out doubled."""
    from book_files import ROOT
    cells = code_cells(ROOT / "book/part1/network_split.ipynb")
    setup = ["5f59a128", "dc25f92b", "c8032c6e", "1b311bd3"]   # net, split_sequential, ...
    proof = cells["604ec897"]
    missing = [i for i in setup if i not in cells]
    assert not missing, f"network_split.ipynb lost the cells {missing}"
    split_step = [src for src in cells.values() if src.startswith("def split_step")]
    assert len(split_step) == 1
    ns = dict(copy=__import__("copy"), torch=torch, helpers=helpers, ByteLog=ByteLog,
              all_close=all_close, loss=helpers.loss, send=helpers.send,
              lenet_module=lenet_module, glue=lambda *a: None, devices=devices(2))
    for src in [cells[i] for i in setup] + split_step:
        exec(src, ns)
    exec(proof, dict(ns))                   # the chapter's split passes
    buggy = proof.replace("split_sequential(net, [7], devices)", "[net[:7], net[7:]]")
    assert buggy != proof
    with pytest.raises(AssertionError, match="gradients differ"):
        exec(buggy, dict(ns))
