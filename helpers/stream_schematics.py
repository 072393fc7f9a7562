"""Asynchrony drawn from a run: the host queues work on a stream and goes on, the stream runs it.

`queue_timeline` runs one round of the GPU chapter's thread-as-stream demo with stamps: the
host's clock as it submits each product, when it reads the clock without waiting, and when
`.result()` (the "synchronise") returns; the worker's clock as each product starts and ends.
`plot_queue_timeline` draws those stamps: a host row and a stream row against one time axis.
`plot_gpu_machine` draws the machine the chapter talks about: the host, two GPUs, and the links
between them, labelled with the bandwidths of their specifications (predictions, not measured).
`two_stream_facts` and `plot_two_streams` draw a schematic (not measured): copies and products
on one stream, in turn, against the next copy on a second stream under this product.
"""
import time

from .schematics import LABEL_FONT as SMALL
from .schematics import SCHEMATIC_WIDTH, device_color, diagram, draw_box

__all__ = ["queue_timeline", "plot_queue_timeline", "machine_links", "plot_gpu_machine",
           "two_stream_facts", "plot_two_streams"]

HOST, STREAM = 1.0, 0.0          # the rows' heights on the drawing's y axis


def queue_timeline(stream, fn, reps, clock=time.perf_counter):
    """Queue `reps` calls of fn() on `stream` (an executor with one worker), read the clock
    without waiting, then wait for every result. Returns dict(submitted: host stamps as each
    call was queued, read: the clock read without waiting, runs: (start, end) of each call on
    the worker, waited: the clock once every result was in), seconds from the first submit."""
    def stamped():
        start = clock()
        fn()
        return start, clock()

    t0, submitted, work = clock(), [], []
    for _ in range(reps):
        submitted.append(clock() - t0)
        work.append(stream.submit(stamped))
    read = clock() - t0                      # what a timer read here would report
    runs = [w.result() for w in work]        # the "synchronise"
    waited = clock() - t0
    return _validate_timeline(dict(submitted=submitted, read=read, waited=waited,
                               runs=[(s - t0, e - t0) for s, e in runs]))


def _validate_timeline(facts):
    """`facts` if its stamps are those of one in-order stream, else ValueError: each call starts
    after it was queued and after the one before it ended, and the wait ends after the last."""
    sub, runs = facts["submitted"], facts["runs"]
    if len(sub) != len(runs) or not runs:
        raise ValueError(f"{len(sub)} calls queued, {len(runs)} ran: one run a queued call")
    for i, ((start, end), queued) in enumerate(zip(runs, sub, strict=True)):
        if not queued <= start <= end or (i and start < runs[i - 1][1]):
            raise ValueError(f"call {i + 1} ran {start:.6f}-{end:.6f} s, queued at {queued:.6f}"
                             " s: not one call at a time, in order, on one worker")
    if not sub[-1] <= facts["read"] <= facts["waited"] or facts["waited"] < runs[-1][1]:
        raise ValueError("the clock was read before the last call was queued, or the wait "
                         "ended before the last call did")
    return facts


def plot_queue_timeline(facts):
    """The host row (queueing, then waiting in .result()) and the stream row (each call from
    its start to its end) against milliseconds since the first submit, with the clock read
    without waiting and the end of the wait marked. Returns the figure."""
    _validate_timeline(facts)
    ms = 1e3
    read, waited = facts["read"] * ms, facts["waited"] * ms
    fig, axes = diagram(1, 1, width=SCHEMATIC_WIDTH, height=2.9)
    ax = axes[0, 0]
    ax.set_axis_on()
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    host, queue_color, run_color = device_color(0), device_color(0), device_color(1)
    ax.broken_barh([(0, read)], (HOST - 0.15, 0.3), facecolor=queue_color)
    ax.broken_barh([(read, waited - read)], (HOST - 0.15, 0.3), facecolor="white",
                   edgecolor=host, hatch="//", linewidth=1.2)
    ax.vlines([s * ms for s in facts["submitted"]], HOST - 0.3, HOST + 0.3, color="black",
              linewidth=1.2)
    ax.broken_barh([(s * ms, (e - s) * ms) for s, e in facts["runs"]], (STREAM - 0.3, 0.6),
                   facecolor=run_color, edgecolor="white", linewidth=1.5)
    for i, (s, e) in enumerate(facts["runs"]):
        if (e - s) * ms > 0.1 * waited:          # a label only where it fits
            ax.text((s + e) / 2 * ms, STREAM, f"{i + 1}", ha="center", va="center",
                    fontsize=SMALL, color="black")
    for x, label, ha in ((read, "clock read\nwithout waiting", "left"),
                         (waited, ".result()\nreturns", "right")):
        ax.axvline(x, color="0.3", linestyle="--", linewidth=1.0)
        ax.text(x + (0.01 if ha == "left" else -0.01) * waited, HOST + 0.45, label, ha=ha,
                va="bottom", fontsize=SMALL)
    n = len(facts["runs"])
    ax.set(xlim=(0, waited * 1.02), ylim=(STREAM - 0.5, HOST + 1.3),
           yticks=[STREAM, HOST], yticklabels=[f"stream:\n{n} products", "host"])
    ax.set_xlabel("ms since the first product was queued", fontsize=SMALL)
    ax.tick_params(labelsize=SMALL, left=False)
    fig.tight_layout()
    return fig


def machine_links(specs, hbm_bytes_per_s):
    """GB/s of the machine's hops, from their specifications (`specs` as helpers.LINK_SPECS,
    `hbm_bytes_per_s` a datasheet's memory bandwidth): host to GPU over PCIe 5.0 x16 and GPU to
    GPU over NVLink 4 (all links), each way; a GPU to its own HBM in all (reads plus writes)."""
    lane = specs["pcie5_gt_s"] * specs["pcie4_encoding"] / 8 / 1e9    # 128b/130b, as 4.0
    return dict(pcie=lane * specs["pcie4_lanes"],
                nvlink=specs["nvlink4_links"] * specs["nvlink4_link_gbs"],
                hbm=hbm_bytes_per_s / 1e9)


def plot_gpu_machine(links):
    """The host (CPU, DRAM) and two GPUs (SMs, HBM, copy engine), joined by PCIe to the host
    and NVLink to each other, each hop labelled with `links` (machine_links: GB/s by their
    specifications). Returns the figure."""
    from matplotlib.patches import FancyArrowPatch
    fig, axes = diagram(1, 1, width=SCHEMATIC_WIDTH, height=3.6)
    ax = axes[0, 0]
    light = "#EEEEEE"
    draw_box(ax, 0, 0.6, 2.6, 5.0, light, edge="0.5")
    ax.text(1.3, 5.25, "host", ha="center", va="center", fontsize=SMALL)
    draw_box(ax, 0.3, 3.0, 2.0, 1.6, "0.45", "CPU", fontsize=SMALL)
    draw_box(ax, 0.3, 1.0, 2.0, 1.6, "0.7", "DRAM", fontsize=SMALL)
    for g, y in ((0, 3.6), (1, 0.0)):
        draw_box(ax, 4.6, y, 5.4, 2.6, light, edge="0.5")
        ax.text(7.3, y + 2.25, f"GPU {g} (device)", ha="center", va="center", fontsize=SMALL)
        draw_box(ax, 4.75, y + 0.2, 1.3, 1.6, device_color(g), "SMs", fontsize=SMALL)
        draw_box(ax, 6.15, y + 0.2, 1.85, 1.6, device_color(2),
                 f"HBM\n{links['hbm'] / 1e3:.1f} TB/s\nin all", fontsize=SMALL)
        draw_box(ax, 8.1, y + 0.2, 1.8, 1.6, "0.85", "copy\nengine", fontsize=SMALL)
        ax.add_patch(FancyArrowPatch((2.6, y + 1.0), (4.6, y + 1.0),
                                     arrowstyle="<|-|>", mutation_scale=12, color="black",
                                     linewidth=1.5))
    ax.text(3.6, 3.1, f"PCIe\n{links['pcie']:.0f}\nGB/s\neach way\n(spec)", ha="center",
            va="center", fontsize=SMALL)
    # NVLink joins the GPUs' edges: SMs load and store over it too, not only the copy engines
    ax.add_patch(FancyArrowPatch((7.3, 2.6), (7.3, 3.6), arrowstyle="<|-|>", mutation_scale=12,
                                 color="black", linewidth=1.5))
    ax.text(7.5, 3.1, f"NVLink {links['nvlink']:.0f} GB/s\neach way (spec)", ha="left", va="center",
            fontsize=SMALL)
    ax.set(xlim=(0, 10), ylim=(0, 6.2))
    fig.tight_layout()
    return fig


def two_stream_facts(batches=3, copy=1.0, compute=2.0):
    """Where each batch's copy and product run (start, end), in schematic units, on one stream
    (each waits for the one before) and on two (a batch's product waits for its copy; the next
    batch's copy runs under it on the second stream). A schematic, not a measurement."""
    if batches < 1 or copy <= 0 or compute <= 0:
        raise ValueError(f"need >= 1 batch and durations > 0, got {batches}, {copy}, {compute}")
    serial = dict(copy=[], compute=[])
    t = 0.0
    for _ in range(batches):
        serial["copy"].append((t, t + copy))
        serial["compute"].append((t + copy, t + copy + compute))
        t += copy + compute
    two = dict(copy=[(0.0, copy)], compute=[])
    for i in range(batches):
        # a product after its copy and the product before; the next copy (second stream)
        # starts with it, into the other buffer, once the copy before is done
        start = max(two["copy"][i][1], two["compute"][-1][1] if two["compute"] else 0.0)
        two["compute"].append((start, start + compute))
        if i + 1 < batches:
            nxt = max(start, two["copy"][i][1])
            two["copy"].append((nxt, nxt + copy))
    return dict(one=serial, two=two)


def plot_two_streams(facts):
    """Two panels, each a compute row over a copy row against schematic time: one stream (copy,
    then product, in turn) and two streams (the next copy under this product). Returns the
    figure, labelled "schematic, not measured"."""
    fig, axes = diagram(2, 1, width=SCHEMATIC_WIDTH, height=4.2)
    end = max(e for rows in facts.values() for spans in rows.values() for _, e in spans)
    titles = dict(one="one stream: copy, then compute, in turn",
                  two="two streams: the next copy runs under this compute")
    for ax, key in zip(axes[:, 0], ("one", "two"), strict=True):
        rows = facts[key]
        for y, row, color in ((1.0, "compute", device_color(0)), (0.0, "copy", device_color(1))):
            for i, (s, e) in enumerate(rows[row]):          # numbered by batch
                draw_box(ax, s, y, e - s, 0.8, color, f"{i + 1}", fontsize=SMALL)
            on = 2 if key == "two" and row == "copy" else 1
            ax.text(-0.2, y + 0.4, f"stream {on}:\n{row}", ha="right", va="center",
                    fontsize=SMALL)
        ax.text(0, 2.05, titles[key], ha="left", va="bottom", fontsize=SMALL)
        last = max(e for spans in rows.values() for _, e in spans)
        ax.axvline(last, color="0.3", linestyle="--", linewidth=1.0, ymax=0.8)
        ax.set(xlim=(-2.4, end + 0.3), ylim=(-0.2, 2.6))
    axes[1, 0].text(end / 2, -0.45, "time (schematic, not measured)", ha="center", va="top",
                    fontsize=SMALL)
    fig.tight_layout()
    return fig
