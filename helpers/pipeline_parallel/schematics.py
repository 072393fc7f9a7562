"""Pictures of pipelines, drawn from the code that runs them.

`plot_network_split` cuts a model with `split_sequential`, runs one example through the stages
with a ByteLog and draws which device holds which layers, what share of the multiply-adds each
does, and how many numbers cross each cut. `schedule_timelines` lays out the course's schedule
functions (gpipe_order, one_f_one_b_rank_order, interleaved_order, zero_bubble_rank_order)
on equal stages, each box starting as soon as its rank is free and its input is ready;
`plot_pipeline_schedules` draws them one above the other.
"""
from itertools import pairwise

import torch

from ..runtime.traffic import ByteLog
from ..schematics import LABEL_FONT as SMALL
from ..schematics import SCHEMATIC_FONT as FONT
from ..schematics import SCHEMATIC_WIDTH, device_color, diagram, draw_box
from .schedules import (
    gpipe_order,
    interleaved_order,
    one_f_one_b_rank_order,
    run_boxes,
    timeline_bubble,
)
from .simulated import multiply_adds, network_split_forward, split_sequential
from .timelines import replay_orders, zero_bubble_rank_order

__all__ = ["split_picture", "plot_network_split", "schedule_timelines", "plot_pipeline_schedules",
           "PHASE_COLORS"]

PHASE_COLORS = {"F": "#0072B2", "B": "#E69F00", "W": "#009E73"}
_SHORT = {"Conv2d": "conv", "ReLU": "relu", "AvgPool2d": "pool", "MaxPool2d": "pool",
          "Flatten": "flat", "Linear": "fc"}            # fc: fully connected (dense)


def split_picture(net, cuts, input_shape):
    """What a network split of `net` at `cuts` holds and sends, for one example: the layer names
    of each stage (split_sequential's stages), each stage's share of the multiply-adds, and the
    numbers crossing each cut forward (a ByteLog of network_split_forward)."""
    devices = [torch.device("cpu")] * (len(cuts) + 1)
    stages = split_sequential(net, cuts, devices)
    log = ByteLog()
    with torch.no_grad():
        network_split_forward(stages, torch.zeros((1, *input_shape)), devices, log)
    macs = multiply_adds(net, input_shape)
    bounds = [0, *cuts, len(net)]
    return dict(layers=[[_SHORT.get(type(m).__name__, type(m).__name__) for m in s]
                        for s in stages],
                mac_share=[sum(macs[a:b]) / sum(macs) for a, b in pairwise(bounds)],
                crossing=[r.payload // 4 for r in log.records])


def plot_network_split(net, options, input_shape):
    """One row per option ({title: cuts}): the layers in order, coloured by the device that
    holds them, each device's share of the multiply-adds below its layers, and above each cut
    the numbers per example it sends forward (its gradient, as many, comes back). Returns the
    figure."""
    pictures = {title: split_picture(net, cuts, input_shape) for title, cuts in options.items()}
    n = len(net)
    fig, axes = diagram(len(options), 1, width=SCHEMATIC_WIDTH, height=1.6 * len(options) + 0.6)
    gap = 0.5
    for ax, (title, pic) in zip(axes.flat, pictures.items(), strict=True):
        ax.set_title(title, fontsize=FONT - 1, loc="left")
        ax.set(xlim=(-0.05, n + gap * (len(pic["layers"]) - 1) + 0.05), ylim=(1.5, -1.0))
        x = 0.0
        for s, layers in enumerate(pic["layers"]):
            start = x
            for name in layers:
                draw_box(ax, x, 0, 1.0, 0.8, device_color(s), name, fontsize=SMALL)
                x += 1.0
            ax.text((start + x) / 2, 0.95, f"{pic['mac_share'][s]:.0%}", ha="center",
                    va="top", fontsize=SMALL)
            if s < len(pic["crossing"]):
                ax.annotate(f"{pic['crossing'][s]:,}", xy=(x + gap / 2, 0.4),
                            xytext=(x + gap / 2, -0.45), ha="center", fontsize=SMALL,
                            arrowprops=dict(arrowstyle="-", color="0.3", lw=1.5))
                x += gap
    fig.text(0.01, 0.01, "below a device's layers: its share of the work\n"
             "above a cut: the numbers per example it sends", fontsize=SMALL, color="0.3")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def _replay_chunks(orders, v, f, b):
    """Interleaved orders ((phase, micro, chunk) per device) run on equal chunks: a chunk's
    forward takes f/v, its backward b/v; each op starts when its device is free and the op it
    needs has ended (run_boxes). Returns one list of boxes per device."""
    rows = [[dict(stage=d, phase=phase, micro=j, chunk=c) for phase, j, c in ops]
            for d, ops in enumerate(orders)]
    return run_boxes(rows, lambda box, t: t + (f if box["phase"] == "F" else b) / v, v)


def schedule_timelines(p=4, m=4, v=2):
    """The course's four schedules on p equal stages and m micro-batches, a forward taking 1 and
    a whole backward 2 (zero bubble: its input-gradient half B 1, its weight-gradient half W 1;
    interleaved: v chunks per device, each 1/v of that): {name: (timelines, bubble)}."""
    whole = {"F": 1.0, "B": 2.0}
    split = {"F": 1.0, "B": 1.0, "W": 1.0}
    runs = {
        "GPipe": (gpipe_order(p, m), whole),
        "1F1B": ([one_f_one_b_rank_order(p, m, r) for r in range(p)], whole),
        "zero bubble": ([zero_bubble_rank_order(p, m, r) for r in range(p)], split),
    }
    out = {}
    for name, (orders, dur) in runs.items():
        tl = replay_orders(orders, lambda r, phase, j, dur=dur: dur[phase])
        out[name] = (tl, timeline_bubble(tl))
    tl = _replay_chunks(interleaved_order(p, m, v), v, 1.0, 2.0)
    out[f"interleaved, {v} chunks"] = (tl, timeline_bubble(tl))
    order = ["GPipe", "1F1B", f"interleaved, {v} chunks", "zero bubble"]
    return {name: out[name] for name in order}


def plot_pipeline_schedules(p=4, m=4, v=2, schedules=None):
    """The four schedules of schedule_timelines, one panel each: one row per device, a box per
    forward (F), backward (B) and weight gradient (W, zero bubble), labelled with its
    micro-batch where the box is wide enough for the number (on a phone's width the interleaved
    schedule's half-length forwards are not: they run micro-batches 0, 1, ... in order); the
    lighter boxes of the interleaved schedule are its second chunk. Returns the figure."""
    schedules = schedules if schedules is not None else schedule_timelines(p, m, v)
    span = max(b["end"] for tl, _ in schedules.values() for t in tl for b in t)
    width = SCHEMATIC_WIDTH
    fig, axes = diagram(len(schedules), 1, width=width, height=0.5 * p * len(schedules) + 1.4)
    left = 0.1 * span                           # room for the device labels
    # a box holds its number if it is wider than the number (about 0.7 em) and a margin
    unit_pt = 0.9 * width * 72 / (span + left)
    for ax, (name, (tl, bubble)) in zip(axes.flat, schedules.items(), strict=True):
        ax.set_title(f"{name}: idle {bubble:.0%}", fontsize=FONT - 1, loc="left")
        ax.set(xlim=(-left, span + 0.1), ylim=(p, -0.1))
        for r, boxes in enumerate(tl):
            ax.text(-0.2, r + 0.42, f"dev {r}", ha="right", va="center", fontsize=SMALL)
            draw_box(ax, 0, r + 0.04, span, 0.76, "#F2F2F2", edge="#F2F2F2")
            for b in boxes:
                light = b.get("chunk", 0) % 2
                fits = (b["end"] - b["start"]) * unit_pt >= 0.7 * SMALL + 3
                draw_box(ax, b["start"], r + 0.04, b["end"] - b["start"], 0.76,
                    PHASE_COLORS[b["phase"]], str(b["micro"]) if fits else None,
                    fontsize=SMALL, alpha=0.55 if light else 1.0,
                    text="black" if light else None)
    handles = [("forward", "F"), ("backward", "B"), ("weight grad.", "W")]
    from matplotlib.patches import Patch
    fig.legend(handles=[Patch(color=PHASE_COLORS[k], label=t) for t, k in handles],
               loc="lower center", ncol=3, fontsize=SMALL, frameon=False, handlelength=1.2,
               columnspacing=1.0)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig
