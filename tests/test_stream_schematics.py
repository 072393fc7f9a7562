"""The GPU chapter's picture of asynchrony draws the stamps of a run: a thread as the stream, the
host's submits, its clock read without waiting and the end of its wait, each product's start and
end on the worker."""
import time
from concurrent.futures import ThreadPoolExecutor

import matplotlib
import pytest

import helpers

matplotlib.use("Agg")

FACTS = dict(submitted=[0.0, 0.001, 0.002], read=0.0025, waited=0.041,
             runs=[(0.001, 0.011), (0.011, 0.02), (0.02, 0.04)])


def _bars(ax):
    """(x0, x1, y0) of every bar broken_barh drew, in drawing order."""
    from matplotlib.collections import PolyCollection
    bars = []
    for c in ax.collections:
        if isinstance(c, PolyCollection):
            for path in c.get_paths():
                v = path.vertices
                bars.append((v[:, 0].min(), v[:, 0].max(), v[:, 1].min()))
    return bars


def test_a_thread_stream_runs_the_queued_calls_in_order_after_the_host_moved_on():
    with ThreadPoolExecutor(max_workers=1) as stream:
        facts = helpers.queue_timeline(stream, lambda: time.sleep(0.02), 3)
    runs = facts["runs"]
    assert len(facts["submitted"]) == len(runs) == 3
    assert facts["submitted"] == sorted(facts["submitted"])
    for (start, end), queued in zip(runs, facts["submitted"], strict=True):
        assert queued <= start and end - start >= 0.019       # each call ran after its submit
    assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:]))   # one at a time, in order
    assert facts["read"] < runs[0][1]            # the host read the clock before the first ended
    assert facts["waited"] >= runs[-1][1] >= 0.057


def test_the_picture_draws_the_stamps():
    import matplotlib.pyplot as plt
    fig = helpers.plot_queue_timeline(FACTS)
    ax = fig.axes[0]
    ms = 1e3
    bars = _bars(ax)
    stream = [x for x0, x1, y0 in bars if y0 < 0.5 for x in (x0, x1)]
    host = sorted(x for x0, x1, y0 in bars if y0 >= 0.5 for x in (x0, x1))
    assert stream == pytest.approx([t * ms for run in FACTS["runs"] for t in run])
    assert host == pytest.approx([0, FACTS["read"] * ms, FACTS["read"] * ms,
                                  FACTS["waited"] * ms])
    ticks = [seg[0][0] for c in ax.collections if not _is_poly(c) for seg in c.get_segments()]
    assert ticks == pytest.approx([s * ms for s in FACTS["submitted"]])
    dashed = sorted(line.get_xdata()[0] for line in ax.lines)
    assert dashed == pytest.approx([FACTS["read"] * ms, FACTS["waited"] * ms])
    texts = [t.get_text() for t in ax.texts]
    assert [t for t in texts if t.isdigit()] == ["1", "2", "3"]   # each wide enough to name
    assert "clock read\nwithout waiting" in texts and ".result()\nreturns" in texts
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stream:\n3 products", "host"]
    plt.close(fig)


def _is_poly(c):
    from matplotlib.collections import PolyCollection
    return isinstance(c, PolyCollection)


@pytest.mark.parametrize("runs, why", [
    ([(0.001, 0.015), (0.011, 0.02), (0.02, 0.04)], "in order"),      # two at once
    ([(0.0, 0.0005), (0.0007, 0.02), (0.02, 0.04)], "queued at"),   # before its submit
])
def test_the_picture_refuses_stamps_no_single_stream_makes(runs, why):
    with pytest.raises(ValueError, match=why):
        helpers.plot_queue_timeline(dict(FACTS, runs=runs))
    with pytest.raises(ValueError, match="wait ended"):
        helpers.plot_queue_timeline(dict(FACTS, waited=0.03))


def test_the_machine_schematic_labels_each_hop_with_its_specification():
    import matplotlib.pyplot as plt
    links = helpers.machine_links(helpers.LINK_SPECS, helpers.H200_DATASHEET["bw"])
    # PCIe 5.0 x16 is twice PCIe 4.0's 31.5 GB/s; NVLink 4 18 links of 25 GB/s
    assert links["pcie"] == pytest.approx(63.0, rel=1e-3)
    assert links["nvlink"] == 450 and links["hbm"] == 4800
    fig = helpers.plot_gpu_machine(links)
    texts = [t.get_text() for t in fig.axes[0].texts]
    plt.close(fig)
    assert "PCIe\n63\nGB/s\neach way\n(spec)" in texts
    assert "NVLink 450 GB/s\neach way (spec)" in texts
    assert texts.count("HBM\n4.8 TB/s\nin all") == 2 and texts.count("SMs") == 2
    assert {"GPU 0 (device)", "GPU 1 (device)", "host", "CPU", "DRAM"} <= set(texts)


def test_two_streams_overlap_the_next_copy_and_keep_each_product_after_its_copy():
    import matplotlib.pyplot as plt
    facts = helpers.two_stream_facts(batches=3, copy=1.0, compute=2.0)
    one, two = facts["one"], facts["two"]
    # one stream: nothing overlaps, each call after the one before
    calls = sorted(one["copy"] + one["compute"])
    assert all(a[1] <= b[0] for a, b in zip(calls, calls[1:]))
    assert calls[-1][1] == 9.0
    # two streams: each product after its copy and the product before; the next copy under it
    for i, (start, _) in enumerate(two["compute"]):
        assert start >= two["copy"][i][1]
        if i:
            assert start >= two["compute"][i - 1][1]
    for i in range(1, 3):
        c_start, c_end = two["copy"][i]
        p_start, p_end = two["compute"][i - 1]
        assert p_start <= c_start and c_end <= p_end      # under the product before
    assert two["compute"][-1][1] == 7.0                   # 1 + 3 x 2: the copies hidden
    with pytest.raises(ValueError, match="durations > 0"):
        helpers.two_stream_facts(compute=0)
    fig = helpers.plot_two_streams(facts)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    plt.close(fig)
    assert "time (schematic, not measured)" in texts
    assert texts.count("stream 2:\ncopy") == 1 and texts.count("stream 1:\ncopy") == 1
