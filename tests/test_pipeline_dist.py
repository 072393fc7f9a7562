"""Pipeline across processes (helpers/pipeline_parallel/): GPipe, 1F1B and zero bubble from
scratch with send/recv, and torch.distributed.pipelining (interleaved and zero bubble too), each
equal to the unsplit model (loss and every gradient) on 2 gloo ranks; the schedules' live
micro-batches; the same code on 4 thread-ranks. Emulated, beside a busy process, the bubble
follows its formula; bad cuts, m, batch sizes and orders are refused before any
work."""
import subprocess
import sys
import time

import pytest
import torch
from thread_ranks import run_threads

from helpers import (
    LOOPED_SCHEDULES,
    RankFailed,
    Rates,
    balanced_cuts,
    box_model,
    bubble_fraction,
    interleaved_bubble,
    launch,
    one_f_one_b_rank_order,
    pingpong_run,
    pipeline_model_time,
    pipeline_net,
    pipeline_rank_step,
    pipeline_run,
    pipelining_run,
    run_ranks,
    stage_of,
    timeline_bubble,
    unsplit_step,
    validate_pipelining,
    zero_bubble_bubble,
    zero_bubble_rank_order,
)
from helpers.pipeline_parallel.schedules import gpipe_rank_order

NET = dict(vocab=64, width=16, depth=4)
N, M = 16, 4
FREE = dict(flops_per_s=50e12, alpha=0.0, beta=float("inf"), source="free messages")
# emulated boxes: the smallest (a forward of N/8 rows) lasts 10 ms of wall time
SCALE = 0.01 / box_model(pipeline_net(**NET), [3], Rates(**FREE), equal=True)(0, "F", N // 8)


def run(schedule, m=M, cuts=(3,), **kw):
    """(label, launch target, cfg) of one run: torch's schedules (Schedule*) by pipelining_run,
    the hand-built ones by pipeline_run."""
    fn = pipelining_run if schedule.startswith("Schedule") else pipeline_run
    label = schedule + (f"-m{m}-emulated" if "emulate" in kw else "")
    return label, fn, dict(net=NET, batch_size=N, seed=3, rates=FREE, schedule=schedule, m=m,
                           cuts=list(cuts), **kw)


EMULATED = [run(s, m, emulate=SCALE, equal=True) for s in ("gpipe", "1f1b") for m in (1, 2, 8)]
EMULATED += [run("zb", 8, emulate=SCALE, equal=True),
             run("ScheduleInterleaved1F1B", 8, [2, 3, 5], emulate=SCALE, equal=True)]
RUNS = [run("gpipe"), run("1f1b"), run("ScheduleGPipe", repeats=2),
        run("Schedule1F1B", repeats=2), run("ScheduleInterleaved1F1B", cuts=[2, 3, 5]),
        run("zb"), run("ScheduleInterleavedZeroBubble", cuts=[2, 3, 5])] + EMULATED
LABELS = [label for label, _, _ in RUNS]


def batch(seed=3):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, NET["vocab"], (N,), generator=g),
            torch.randint(0, 10, (N,), generator=g))


@pytest.fixture(scope="module")
def ranks():
    """One launch of 2 gloo processes for every run, a busy process beside them (2 cores)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        return run_ranks(2, RUNS)
    finally:
        busy.kill()
        busy.wait()


@pytest.fixture(scope="module")
def reference():
    X, y = batch()
    return unsplit_step(pipeline_net(**NET), X, y)


def stitched(results, label):
    grads = {}
    for rank in results:
        grads.update(rank[label].grads)
    return [g for stage in sorted(grads) for g in grads[stage]]


@pytest.mark.parametrize("label", LABELS)
def test_equal_to_unsplit(ranks, reference, label):
    loss, grads = reference
    last = ranks[-1][label]
    assert last.loss == pytest.approx(loss, rel=1e-5, abs=1e-6)
    got = stitched(ranks, label)
    assert len(got) == len(grads), "every parameter of the net has a gradient on some rank"
    for a, b in zip(got, grads):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_stages_really_split(ranks):
    """Each rank holds only its stage: rank 0 the embedding and two blocks, rank 1 the rest."""
    n0, n1 = len(ranks[0]["gpipe"].grads[0]), len(ranks[1]["gpipe"].grads[1])
    assert (n0, n1) == (1 + 2 * 2, 2 * 2 + 2)
    assert ranks[0]["gpipe"].bytes_sent > 0 and ranks[1]["gpipe"].bytes_sent > 0


@pytest.mark.parametrize("gpipe,one_f_one_b", [("gpipe", "1f1b"),
                                                ("ScheduleGPipe", "Schedule1F1B")],
                         ids=["scratch", "pipelining"])
def test_live_microbatches(ranks, gpipe, one_f_one_b):
    """GPipe holds all m micro-batches on every rank; 1F1B at most p - rank (measured from
    what autograd saves), from scratch and in torch.distributed.pipelining alike."""
    assert [r[gpipe].peak_live for r in ranks] == [M, M]
    assert [r[one_f_one_b].peak_live for r in ranks] == [2, 1]
    assert 0 < ranks[0][one_f_one_b].peak_bytes < ranks[0][gpipe].peak_bytes
    assert ranks[1][one_f_one_b].peak_bytes * M == pytest.approx(
        ranks[1][gpipe].peak_bytes, rel=0.3)


def test_timelines_give_a_bubble(ranks):
    tls = [r["gpipe"].timelines[0] for r in ranks]
    assert all(len(tl) == 2 * M for tl in tls)
    assert 0 < timeline_bubble(tls) < 1


def test_orders():
    for m, p in [(1, 4), (3, 4), (8, 4), (5, 2)]:
        for rank in range(p):
            for order in (gpipe_rank_order(p, m, rank), one_f_one_b_rank_order(p, m, rank)):
                assert sorted(order) == sorted([("F", j) for j in range(m)] +
                                               [("B", j) for j in range(m)])
                assert all(order.index(("F", j)) < order.index(("B", j)) for j in range(m))
    assert one_f_one_b_rank_order(2, 4, 0) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1),
                                               ("F", 3), ("B", 2), ("B", 3)]


def _thread_step(comm, net, cuts, X, y, m, schedule):
    stage = stage_of(net, cuts, comm.rank)
    order = schedule(comm.world, m, comm.rank)
    out = pipeline_rank_step(stage, comm, order, X if comm.rank == 0 else None,
                             y if comm.rank == comm.world - 1 else None, m, X.shape[0],
                             (net[0].embedding_dim,))
    return out, [p.grad for p in stage.parameters()]


@pytest.mark.parametrize("schedule", [gpipe_rank_order, one_f_one_b_rank_order,
                                      zero_bubble_rank_order])
def test_four_stages_on_threads(schedule):
    """The same rank code on 4 ranks (threads standing in for processes), 6 micro-batches."""
    net = pipeline_net(**NET)
    X, y = batch(5)
    loss, grads = unsplit_step(net, X, y)
    cuts = balanced_cuts([1] * len(net), 4)
    results, comms = run_threads(_thread_step, 4, net, cuts, X, y, 6, schedule)
    assert results[-1][0]["loss"] == pytest.approx(loss, rel=1e-5)
    got = [g for _, gs in results for g in gs]
    for a, b in zip(got, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    peaks = [r[0]["peak_live"] for r in results]
    assert peaks == ([6] * 4 if schedule is gpipe_rank_order else [4, 3, 2, 1])
    assert [c.traffic.calls("send") for c in comms] == [6, 12, 12, 6]
    phases = {b["phase"] for r in results for b in r[0]["timeline"]}
    assert phases == ({"F", "B", "W"} if schedule is zero_bubble_rank_order else {"F", "B"})


def test_balanced_cuts_takes_any_iterable():
    assert balanced_cuts([10, 1, 1, 1, 1], 2) == [1]
    assert balanced_cuts((0.0, 1, 1, 1, 1), 2) == [3]
    assert balanced_cuts((t for t in [10, 1, 1, 1, 1]), 2) == [1]   # measured times, lazily


def test_a_missing_send_times_out_with_a_message():
    def lonely(comm):
        if comm.rank == 1:
            comm.recv(0, (2,))
    with pytest.raises(TimeoutError, match="never sent"):
        run_threads(lonely, 2, timeout=0.2)


# ---- emulated: the schedule apart from the machine ------------------------------------------
def _formula(cfg):
    m = cfg["m"]
    return {"gpipe": bubble_fraction(2, m), "1f1b": bubble_fraction(2, m),
            "zb": zero_bubble_bubble(2, m),
            "ScheduleInterleaved1F1B": interleaved_bubble(2, m, 2)}[cfg["schedule"]]


@pytest.mark.parametrize("label,cfg", [(label, cfg) for label, _, cfg in EMULATED],
                         ids=[label for label, _, _ in EMULATED])
def test_emulated_bubble_follows_its_formula_beside_a_busy_process(ranks, label, cfg):
    """Each box's math ran for real (test_equal_to_unsplit), each rank slept out the box's
    modelled time, and on the model's clock the bubble is the formula's (within 10%), though
    a busy process shared the 2 cores with the ranks."""
    tls = [r[label].timelines[0] for r in ranks]
    stages = 4 if cfg["schedule"] in LOOPED_SCHEDULES else 2
    modelled = pipeline_model_time(tls, stages, NET["width"] * 4, Rates(**FREE))
    want = _formula(cfg)
    assert timeline_bubble(modelled) == pytest.approx(want, rel=0.1)
    for tl in tls:                    # the ranks waited: every box lasted its scaled time
        for b in tl:
            assert b["end"] - b["start"] >= b["modelled"] * SCALE * 0.999


def test_emulated_bubble_falls_with_m(ranks):
    for s in ("gpipe", "1f1b"):
        got = []
        for label, _, cfg in EMULATED:
            if cfg["schedule"] == s:
                tls = [r[label].timelines[0] for r in ranks]
                got.append(timeline_bubble(pipeline_model_time(tls, 2, 64, Rates(**FREE))))
        assert got == sorted(got, reverse=True) and got[0] > 2 * got[-1]


# ---- refused before any work ------------------------------------------------------------------
def test_cuts_are_checked_against_the_ranks_and_the_layers():
    net = pipeline_net(**NET)
    with pytest.raises(ValueError, match="make 3 stages for 2 ranks"):
        stage_of(net, [2, 4], 0, stages=2)
    with pytest.raises(ValueError, match="strictly increasing"):
        stage_of(net, [4, 2], 0, stages=3)
    with pytest.raises(ValueError, match="empty"):
        stage_of(net, [0], 0, stages=2)
    with pytest.raises(ValueError, match="strictly increasing"):
        stage_of(net, [len(net)], 0)


def test_a_run_refuses_three_stages_on_two_ranks_before_any_work():
    """Cuts that make more stages than ranks once ran silently, a hidden activation
    taken as the logits; now refused before any work of that run."""
    start = time.monotonic()
    small = dict(net=NET, batch_size=8, seed=0, schedule="1f1b", m=2)
    with pytest.raises(RankFailed, match="3 stages for 2 ranks"):
        run_ranks(2, [("two stages", pipeline_run, dict(small, cuts=[2])),
                      ("three stages", pipeline_run, dict(small, cuts=[2, 4]))],
                  threads=True, timeout=20)
    assert time.monotonic() - start < 5


def test_pingpong_times_each_round_trip_after_a_warm_up():
    got = launch(pingpong_run, 2, dict(shape=(4, 8), repeats=3), threads=True, timeout=20)
    assert len(got[0].seconds) == 3 and all(t > 0 for t in got[0].seconds)


@pytest.mark.parametrize("cfg,words", [
    (dict(schedule="ScheduleGPipe"), "pick one of.*pipelining_run"),
    (dict(m=0), "m must be at least 1"),
    (dict(m=True), r"m must be a whole number \(int\), got True"),
    (dict(repeats=0), "repeats must be at least 1"),
])
def test_pipeline_run_refuses_what_it_cannot_run(cfg, words):
    small = dict(net=NET, batch_size=8, seed=0, schedule="1f1b", m=2, cuts=[3])
    with pytest.raises(RankFailed, match=words):
        launch(pipeline_run, 2, dict(small, **cfg), threads=True, timeout=20)


@pytest.mark.parametrize("change,words", [
    (dict(m=0), "num_microbatches must be at least 1"),
    (dict(batch_size=5), r"pass batch_size=[Xy]\.shape\[0\]"),   # the first rank to see it
    (dict(order=[("F", 0), ("B", 0)]), "once for each of the 2"),
    (dict(order=[("B", 0), ("F", 0), ("F", 1), ("B", 1)]), "out of order"),
])
def test_a_step_refuses_bad_input_before_any_message(change, words):
    net = pipeline_net(**NET)
    X, y = batch()
    X, y = X[:8], y[:8]

    def step(comm):
        m = change.get("m", 2)
        order = change.get("order") or one_f_one_b_rank_order(2, max(m, 1), comm.rank)
        stage = stage_of(net, [3], comm.rank, stages=2)
        pipeline_rank_step(stage, comm, order, X if comm.rank == 0 else None,
                           y if comm.rank == 1 else None, m, change.get("batch_size", 8),
                           (NET["width"],))
    with pytest.raises(ValueError, match=words):
        run_threads(step, 2, timeout=2)


def test_torch_schedules_refuse_a_batch_m_does_not_divide():
    """Left to torch, Schedule1F1B with 10 rows in 4 micro-batches fails on the last rank while
    the other blocks until the timeout; the course's wrapper refuses it on every rank, first."""
    with pytest.raises(ValueError, match="do not divide a batch of 10.*multiple of 4"):
        validate_pipelining("Schedule1F1B", 10, 4, 2, 6, [3])
    with pytest.raises(ValueError, match="2 cuts make 3 stages for 4 ranks"):
        validate_pipelining("ScheduleInterleaved1F1B", 8, 4, 2, 6, [2, 4])
    assert validate_pipelining("ScheduleInterleaved1F1B", 8, 4, 2, 6, [1, 3, 5]) == 4
    with pytest.raises(ValueError, match="has no"):
        validate_pipelining("ScheduleNoSuch", 8, 4, 2, 6, [3])
