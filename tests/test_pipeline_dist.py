"""Pipeline across processes (helpers/pipeline_parallel/): GPipe and 1F1B from scratch with
send/recv, and torch.distributed.pipelining, each equal to the unsplit model (loss and every
gradient) on 2 gloo ranks; the schedules' live micro-batches; the same code on 4 thread-ranks."""
import pytest
import torch

from helpers import (cuts_by, gpipe_rank_order, one_f_one_b_rank_order, pipeline_net,
                     pipeline_rank_step, pipeline_worker, run_threads, launch, stage_of,
                     timeline_bubble, unsplit_step)

NET = dict(vocab=64, width=16, depth=4)
N, M = 12, 4
RUNS = [dict(schedule="gpipe", m=M, cuts=[3]), dict(schedule="1f1b", m=M, cuts=[3]),
        dict(kind="pipelining", schedule="ScheduleGPipe", m=M, cuts=[3], repeats=2),
        dict(kind="pipelining", schedule="Schedule1F1B", m=M, cuts=[3], repeats=2),
        dict(kind="pipelining", schedule="ScheduleInterleaved1F1B", m=M, cuts=[3])]


def batch(seed=3):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, NET["vocab"], (N,), generator=g),
            torch.randint(0, 10, (N,), generator=g))


@pytest.fixture(scope="module")
def ranks():
    """One launch of 2 gloo processes for every run."""
    return launch(pipeline_worker, 2, dict(net=NET, batch_size=N, seed=3, runs=RUNS),
                  quiet=True)


@pytest.fixture(scope="module")
def reference():
    X, y = batch()
    return unsplit_step(pipeline_net(**NET), X, y)


def stitched(results, i):
    grads = {}
    for rank in results:
        grads.update(rank[i]["grads"])
    return [g for stage in sorted(grads) for g in grads[stage]]


@pytest.mark.parametrize("i", range(len(RUNS)), ids=[r["schedule"] for r in RUNS])
def test_equal_to_unsplit(ranks, reference, i):
    if ranks[0][i]["skipped"]:
        pytest.skip(ranks[0][i]["skipped"])
    loss, grads = reference
    last = ranks[-1][i]
    assert last["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-6)
    got = stitched(ranks, i)
    assert len(got) == len(grads), "every parameter of the net has a gradient on some rank"
    for a, b in zip(got, grads):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_stages_really_split(ranks):
    """Each rank holds only its stage: rank 0 the embedding and two blocks, rank 1 the rest."""
    n0, n1 = len(ranks[0][0]["grads"][0]), len(ranks[1][0]["grads"][1])
    assert (n0, n1) == (1 + 2 * 2, 2 * 2 + 2)
    assert ranks[0][0]["bytes_sent"] > 0 and ranks[1][0]["bytes_sent"] > 0


@pytest.mark.parametrize("gpipe,one_f_one_b", [(0, 1), (2, 3)], ids=["scratch", "pipelining"])
def test_live_microbatches(ranks, gpipe, one_f_one_b):
    """GPipe holds all m micro-batches on every rank; 1F1B at most p - rank (measured from
    what autograd saves), from scratch and in torch.distributed.pipelining alike."""
    if ranks[0][gpipe]["skipped"] or ranks[0][one_f_one_b]["skipped"]:
        pytest.skip("schedule unavailable")
    assert [r[gpipe]["peak_live"] for r in ranks] == [M, M]
    assert [r[one_f_one_b]["peak_live"] for r in ranks] == [2, 1]
    assert 0 < ranks[0][one_f_one_b]["peak_bytes"] < ranks[0][gpipe]["peak_bytes"]
    assert ranks[1][one_f_one_b]["peak_bytes"] * M == pytest.approx(
        ranks[1][gpipe]["peak_bytes"], rel=0.3)


def test_timelines_give_a_bubble(ranks):
    tls = [r[0]["timelines"][0] for r in ranks]
    assert all(len(tl) == 2 * M for tl in tls)
    assert 0 < timeline_bubble(tls) < 1


def test_orders():
    for m, p in [(1, 4), (3, 4), (8, 4), (5, 2)]:
        for rank in range(p):
            for order in (gpipe_rank_order(m, p, rank), one_f_one_b_rank_order(m, p, rank)):
                assert sorted(order) == sorted([("F", j) for j in range(m)] +
                                               [("B", j) for j in range(m)])
                assert all(order.index(("F", j)) < order.index(("B", j)) for j in range(m))
    assert one_f_one_b_rank_order(4, 2, 0) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1),
                                          ("F", 3), ("B", 2), ("B", 3)]


def _thread_step(comm, net, cuts, X, y, m, schedule):
    stage = stage_of(net, cuts, comm.rank)
    order = schedule(m, comm.world, comm.rank)
    out = pipeline_rank_step(stage, comm, order, X if comm.rank == 0 else None,
                             y if comm.rank == comm.world - 1 else None, m, X.shape[0],
                             (net[0].embedding_dim,))
    return out, [p.grad for p in stage.parameters()]


@pytest.mark.parametrize("schedule", [gpipe_rank_order, one_f_one_b_rank_order])
def test_four_stages_on_threads(schedule):
    """The same rank code on 4 ranks (threads standing in for processes), 6 micro-batches."""
    net = pipeline_net(**NET)
    X, y = batch(5)
    loss, grads = unsplit_step(net, X, y)
    cuts = cuts_by([1] * len(net), 4)
    results, comms = run_threads(_thread_step, 4, net, cuts, X, y, 6, schedule)
    assert results[-1][0]["loss"] == pytest.approx(loss, rel=1e-5)
    got = [g for _, gs in results for g in gs]
    for a, b in zip(got, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    peaks = [r[0]["peak_live"] for r in results]
    assert peaks == ([6] * 4 if schedule is gpipe_rank_order else [4, 3, 2, 1])
    assert [c.calls("send") for c in comms] == [6, 12, 12, 6]


def test_cuts_by_balance():
    assert cuts_by([10, 1, 1, 1, 1], 2) == [1]
    assert cuts_by([0.0, 1, 1, 1, 1], 2) == [3]


def test_a_missing_send_times_out_with_a_message():
    def lonely(comm):
        if comm.rank == 1:
            comm.recv(0, (2,))
    with pytest.raises(TimeoutError, match="never sent"):
        run_threads(lonely, 2, timeout=0.2)
