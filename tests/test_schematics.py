"""The schematics draw what the code does: each picture's data is checked against the code it
shows (the ring's chunk rule, the Megatron MLP's shards and collectives, the schedules' bubbles,
the cut's bytes, who holds which shard in the real ZeRO/FSDP classes, DDP's buckets)."""
import matplotlib
import pytest
import torch
from torch import nn

import helpers
from helpers.pipeline_parallel.schematics import schedule_timelines, split_picture
from helpers.sharding.schematics import shard_owners
from helpers.tensor_parallel import schematics as tp_pictures
from helpers.tiny_models import deep_mlp

matplotlib.use("Agg")


# ---- the ring all-reduce -----------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_ring_steps_follow_the_ring_rule(k):
    steps = helpers.ring_steps(k)
    assert [s["phase"] for s in steps] == ["reduce-scatter"] * (k - 1) + ["all-gather"] * (k - 1)
    every = frozenset(range(k))
    for n, step in enumerate(steps):
        assert sorted((src, dst) for src, dst, *_ in step["moves"]) == \
            [(i, (i + 1) % k) for i in range(k)]
        for src, _, chunk, parts in step["moves"]:
            if step["phase"] == "reduce-scatter":   # device i sends chunk (i - s) mod k ...
                assert chunk == (src - n) % k
                assert len(parts) == n + 1          # ... holding one part more each step
            else:
                assert parts == every               # the all-gather passes full sums on
    after_rs = steps[k - 2]["holds"]
    for i in range(k):                              # device i: the full sum of chunk i+1
        assert [c for c in range(k) if after_rs[i][c] == every] == [(i + 1) % k]
    assert all(h == every for row in steps[-1]["holds"] for h in row)


def test_ring_steps_catch_a_ring_that_gathers_the_wrong_chunk():
    def wrong_gather(chunks, devices, log=None, what="all-gather"):
        k = len(chunks)
        chunks = [list(c) for c in chunks]
        for step in range(k - 1):
            for i in range(k):
                c, dst = (i - step) % k, (i + 1) % k        # not the newest full chunk
                chunks[dst][c] = helpers.send(chunks[i][c], i, dst, devices, log, what)
        return chunks

    def ring(xs, devices, log):
        chunks = helpers.ring_reduce_scatter(xs, devices, log, "all-reduce: reduce-scatter")
        chunks = wrong_gather(chunks, devices, log, "all-reduce: all-gather")
        return [torch.cat(c) for c in chunks]

    with pytest.raises(RuntimeError, match="full sum"):
        helpers.ring_steps(4, ring=ring)


# ---- the Megatron MLP ------------------------------------------------------------------------
def test_megatron_trace_reads_the_shards_and_the_collectives():
    k, n, d, h = 4, 8, 6, 10
    t = helpers.megatron_trace(k=k, n=n, d=d, h=h)
    assert t["units"] == [(0, 3), (3, 6), (6, 8), (8, 10)]     # tensor_split of 10 hidden units
    per_device = helpers.ring_bytes_per_device(4 * n * d, k)
    assert t["sent"] == {"g forward": per_device, "f backward": per_device}


def test_megatron_trace_sees_a_split_that_is_not_column_then_row(monkeypatch):
    def rows_then_columns(X, W1, b1, W2, b2, devices, log=None):
        Xs = helpers.copy_to_shards(X, devices, log)
        parts = [Xi[:, a] @ W1[a] @ W2 for Xi, a in
                 zip(Xs, torch.arange(X.shape[1]).tensor_split(len(devices)))]
        return helpers.reduce_from_shards(parts, devices, log) + b2

    monkeypatch.setattr(tp_pictures, "megatron_mlp", rows_then_columns)
    with pytest.raises(RuntimeError, match="not a column split"):
        helpers.megatron_trace(k=2, n=4, d=6, h=8)


# ---- pipelines --------------------------------------------------------------------------------
@pytest.mark.parametrize("p,m", [(2, 2), (4, 4), (3, 6), (4, 8)])
def test_schedule_timelines_have_the_formulas_bubbles(p, m):
    s = schedule_timelines(p, m, v=2)
    bubble = {name: b for name, (_, b) in s.items()}
    assert bubble["GPipe"] == pytest.approx(helpers.bubble_fraction(p, m))
    assert bubble["1F1B"] == pytest.approx(helpers.bubble_fraction(p, m))
    assert bubble["interleaved, 2 chunks"] == pytest.approx(helpers.interleaved_bubble(p, m, 2))
    assert bubble["zero bubble"] == pytest.approx(helpers.zero_bubble_bubble(p, m))
    for name, (tl, _) in s.items():
        for boxes in tl:
            ends = {(b["phase"], b["micro"], b.get("chunk", 0)): b["end"] for b in boxes}
            chunks = 2 if name.startswith("interleaved") else 1
            phases = "FBW" if name == "zero bubble" else "FB"
            assert sorted(ends) == sorted((ph, j, c) for ph in phases for j in range(m)
                                          for c in range(chunks))
            assert all(a["end"] <= b["start"] for a, b in zip(boxes, boxes[1:]))
            # the same work everywhere: a forward 1, a backward 2, per micro-batch
            assert sum(b["end"] - b["start"] for b in boxes) == pytest.approx(3 * m)


def test_split_picture_counts_what_crosses_each_cut():
    torch.manual_seed(0)
    net = helpers.lenet_module()
    early, pooled = (split_picture(net, cuts, (1, 28, 28)) for cuts in ([1], [3]))
    assert early["mac_share"] == pytest.approx(pooled["mac_share"])   # a tie in multiply-adds
    assert (early["crossing"], pooled["crossing"]) == ([20 * 26 * 26], [20 * 13 * 13])
    assert pooled["layers"][0] == ["conv", "relu", "pool"]
    assert sum(map(len, early["layers"])) == len(net)


# ---- who holds which shard ---------------------------------------------------------------------
@pytest.fixture
def fake_world():
    """Rank r of a world of 4 in this one process (collectives do nothing), for each r."""
    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    import torch.distributed as dist

    def at(rank):
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=rank, world_size=4)
    yield at
    if dist.is_initialized():
        dist.destroy_process_group()


def _elements(param, piece):
    """Element range of `param` that `piece` (a view of the same buffer) covers."""
    start = (piece.data_ptr() - param.data_ptr()) // param.element_size()
    return start, start + piece.numel()


def test_shard_owners_are_what_the_classes_hold(fake_world):
    owners = shard_owners(helpers.TinyLM(tied=False), 4)
    sizes = [p.numel() for p in helpers.TinyLM(tied=False).parameters()]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    for rank in range(4):
        fake_world(rank)
        lm = helpers.TinyLM(tied=False)
        opt = helpers.ShardedOptimizer(lm.parameters(), torch.optim.Adam, lr=1e-3)
        zero1 = owners["ZeRO-1"]["optimizer state"]
        for i, p in enumerate(lm.parameters()):
            assert (opt.owner[id(p)] == rank) == bool(zero1[starts[i]] == rank)
        z2 = helpers.Zero2(helpers.TinyLM(tied=False), torch.optim.Adam, lr=1e-3)
        mine = torch.zeros(sum(sizes), dtype=torch.bool)
        index = {id(p): i for i, p in enumerate(z2.module.parameters())}
        for p, piece, *_ in z2.pieces:
            a, b = _elements(p, piece)
            mine[starts[index[id(p)]] + a:starts[index[id(p)]] + b] = True
        assert torch.equal(mine, owners["ZeRO-2"]["gradients"] == rank)
        f3 = helpers.FSDPFromScratch(helpers.TinyLM(tied=False))
        zero3 = owners["ZeRO-3 (FSDP from scratch)"]["weights"]
        held = int((zero3 == rank).sum())
        real = sum(min(u.shard.numel(), max(0, sum(s.numel() for s in u.shapes)
                                            - rank * u.shard.numel()))
                   for u in f3.units)
        assert held == real


def test_fsdp2_rows_are_what_fully_shard_keeps(fake_world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    make = lambda: nn.Sequential(nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 3))
    owners = shard_owners(make(), 4)["FSDP2 (fully_shard)"]["weights"]
    sizes = [p.numel() for p in make().parameters()]
    for rank in range(4):
        fake_world(rank)
        net = make()
        fully_shard(net, mesh=init_device_mesh("cpu", (4,)))
        start = 0
        for p, n in zip(net.parameters(), sizes):
            assert p.to_local().numel() == int((owners[start:start + n] == rank).sum())
            start += n


def test_data_parallel_holds_everything_everywhere_and_zero1_shards_only_the_state():
    owners = shard_owners(deep_mlp(8, 16, 2), 2)
    assert all((o == -1).all() for o in owners["data parallel"].values())
    z1 = owners["ZeRO-1"]
    assert (z1["weights"] == -1).all() and (z1["optimizer state"] >= 0).all()


# ---- DDP's buckets ------------------------------------------------------------------------------
def test_bucket_timeline_launches_in_order_and_exposes_the_last_bucket():
    net = helpers.make_model("frozen", d_in=8, width=16, depth=4)
    trainable = [p for p in net.parameters() if p.requires_grad]
    t = helpers.bucket_timeline(net, (torch.zeros(2, 8),), bucket_mb=0.001)
    index = {id(p): i for i, p in enumerate(trainable)}
    assert [b["params"] for b in t["buckets"]] == \
        [[index[id(p)] for p in b] for b in helpers.make_buckets(net.parameters(), 0.001)]
    assert sorted(t["ready"]) == list(range(len(trainable)))   # frozen layer left out
    for prev, b in zip([None, *t["buckets"]], t["buckets"]):
        assert b["start"] >= max(t["ready"][i] for i in b["params"])
        assert prev is None or b["start"] >= prev["end"]
    last = t["buckets"][-1]
    assert 0 in last["params"] and last["complete"] == pytest.approx(t["backward"])
    assert t["exposed"] >= last["end"] - last["start"] > 0
    assert all(p.grad is None for p in net.parameters())      # the recording left no gradient



def test_a_buckets_last_tick_is_drawn_over_the_next_buckets_first():
    """Ticks of gradients ready at almost the same instant overlap: each is drawn over every
    later one, so the tick where a bucket completes (and its bar starts) stays visible."""
    import matplotlib.pyplot as plt
    t = helpers.bucket_timeline(deep_mlp(8, 16, 4), (torch.zeros(2, 8),), 0.001)
    fig = helpers.plot_buckets(t)
    ticks = [ln.get_xdata()[0] for ln in fig.axes[0].lines if ln.get_linewidth() == 3]
    plt.close(fig)
    assert len(ticks) == len(t["ready"]) and ticks == sorted(ticks, reverse=True), ticks

# ---- Part I's data-parallel steps ---------------------------------------------------------------
def _dp_steps_figure(start):
    two = [torch.tensor([-16.5, -19.5]), torch.tensor(-14.0)]   # the chapter's widths
    shards = [torch.zeros(3, 2)] * 2, [torch.ones(3)] * 2
    return helpers.plot_data_parallel_steps(*shards, [two] * 2, two, [two] * 2, start=start)


@pytest.mark.parametrize("with_start", [True, False])
def test_data_parallel_steps_draw_step_0_and_arrows_that_stop_at_the_boxes(with_start):
    """With `start` the first column is step 0's broadcast, every device holding the start;
    the blue arrows from device 0's sum end at the left edge of the broadcast boxes, not in
    them."""
    import matplotlib.pyplot as plt
    start = [torch.tensor([0.5, 0.25]), torch.tensor(0.0)]
    fig = _dp_steps_figure(start if with_start else None)
    ax = fig.axes[0]
    heads = [t.get_text() for t in ax.texts if t.get_position()[1] == -0.8]
    assert heads[0].startswith("0 broadcast" if with_start else "1 split"), heads
    col = 4 if with_start else 3          # the column of step 4, the broadcast
    if with_start:
        assert [t.get_text() for t in ax.texts if t.get_position() in ((0, 0), (0, 1))] \
            == ["w 0.500, 0.250\nb 0.000"] * 2
    fig.canvas.draw()
    to_data = ax.transData.inverted()
    blue = [a for a in ax.texts if isinstance(a, matplotlib.text.Annotation)
            and a.arrow_patch is not None and a.arrow_patch.get_edgecolor()[:3]
            == matplotlib.colors.to_rgb("tab:blue")]
    box = next(t for t in ax.texts if t.get_position() == (col, 1))
    (left, y0), (_, y1) = to_data.transform(box.get_bbox_patch().get_window_extent().get_points())
    # it starts left of the box: ending on its left edge, it never crosses the box
    assert len(blue) == 1 and blue[0].xyann[0] < left, (blue[0].xyann, left)
    x, y = blue[0].xy
    assert x <= left + 1e-9 and min(y0, y1) <= y <= max(y0, y1), (blue[0].xy, left, y0, y1)
    plt.close(fig)


# ---- the figures draw ----------------------------------------------------------------------------
def test_every_schematic_draws():
    import matplotlib.pyplot as plt
    torch.manual_seed(0)
    figs = [helpers.plot_ring_allreduce(3), helpers.plot_megatron_mlp(k=2),
            helpers.plot_network_split(helpers.lenet_module(), {"a": [7], "b": [1, 3]},
                                       (1, 28, 28)),
            helpers.plot_pipeline_schedules(2, 2),
            helpers.plot_shards(deep_mlp(8, 16, 2), 2),
            helpers.plot_buckets(helpers.bucket_timeline(deep_mlp(8, 16, 2),
                                                         (torch.zeros(2, 8),), 0.001)),
            helpers.plot_data_parallel_steps(
                [torch.zeros(3, 2)] * 2, [torch.ones(3)] * 2, [[torch.ones(2), torch.ones(())]] * 2,
                [torch.ones(2), torch.ones(())], [[torch.ones(2), torch.ones(())]] * 2)]
    for fig in figs:
        assert fig.get_facecolor()[:3] == (1.0, 1.0, 1.0)   # a light panel in dark mode too
        texts = [t for ax in fig.axes for t in ax.texts]
        assert texts and min(t.get_fontsize() for t in texts) >= 8   # readable on a phone
        plt.close(fig)
