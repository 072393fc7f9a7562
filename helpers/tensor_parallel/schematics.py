"""Part I's within-layer pictures, drawn from runs of the code they explain.

`ring_steps` runs the ring all-reduce on k simulated devices with one number per chunk, each
device's numbers distinct powers of two, so every number that moves names its chunk and the
devices whose parts it holds; `plot_ring_allreduce` draws who sent which chunk to whom, step by
step. `megatron_trace` runs the Megatron MLP once, forward and backward, and records each
device's shards of W1 and W2 and what f and g sent; `plot_megatron_mlp` draws where f and g sit.
"""
from itertools import pairwise

import torch
from torch.overrides import TorchFunctionMode

from ..ring import ring_all_reduce
from ..runtime.traffic import ByteLog
from ..schematics import (
    EVERY_RANK_COLOR,
    SCHEMATIC_WIDTH,
    device_color,
    diagram,
    draw_arrow,
    draw_box,
)
from ..schematics import LABEL_FONT as SMALL
from ..schematics import SCHEMATIC_FONT as FONT
from .simulated import megatron_mlp

__all__ = ["ring_steps", "plot_ring_allreduce", "megatron_trace", "plot_megatron_mlp"]


class _Moves(TorchFunctionMode):
    """Records the value of every tensor that `.to` is called on (send() moves with .to)."""

    def __init__(self):
        super().__init__()
        self.sent = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.to:
            self.sent.append(args[0].detach().clone())
        return func(*args, **(kwargs or {}))


def _decode(value, k):
    """(chunk, devices whose parts a sum holds) from a number that is a sum of 2**(i + k*c)."""
    bits = [b for b in range(k * k) if int(value) >> b & 1]
    chunks = {b // k for b in bits}
    if len(chunks) != 1 or sum(2.0 ** b for b in bits) != value:
        raise RuntimeError(f"{value} is not a sum of one chunk's parts: the ring mixed chunks")
    return chunks.pop(), frozenset(b % k for b in bits)


def ring_steps(k=4, ring=ring_all_reduce):
    """Run `ring(xs, devices, log)` on k simulated devices and return its steps, each
    dict(phase, moves=[(src, dst, chunk, parts)], holds=[[parts of chunk c on device d]]):
    `parts` are the devices whose contributions the chunk holds. A step ends when a device sends
    a second time. Device i's tensor holds 2**(i + k*c) in chunk c (exact in float64, k <= 7);
    the result is checked to be the full sum on every device."""
    if not 2 <= k <= 7:
        raise ValueError(f"draw the ring for 2 to 7 devices, not {k}")
    devices = [torch.device("cpu")] * k
    xs = [torch.tensor([2.0 ** (i + k * c) for c in range(k)], dtype=torch.float64)
          for i in range(k)]
    log = ByteLog()
    with _Moves() as moves:
        out = ring(xs, devices, log)
    records = log.records
    if len(records) != len(moves.sent):
        raise RuntimeError(f"{len(records)} transfers logged but {len(moves.sent)} tensors moved")
    holds = [[frozenset({d}) for _ in range(k)] for d in range(k)]
    steps, senders = [], set()
    for r, value in zip(records, moves.sent, strict=True):
        phase = r.op.split(": ")[-1]
        if not steps or phase != steps[-1]["phase"] or r.src in senders:
            steps.append(dict(phase=phase, moves=[]))
            senders = set()
        senders.add(r.src)
        chunk, parts = _decode(value.item(), k)
        steps[-1]["moves"].append((r.src, r.dst, chunk, parts))
    for step in steps:   # a step's sends leave before any arrives: update after all of them
        for _src, dst, chunk, parts in step["moves"]:
            reduce = step["phase"] != "all-gather"
            holds[dst][chunk] = parts | holds[dst][chunk] if reduce else parts
        step["holds"] = [list(h) for h in holds]
    every = frozenset(range(k))
    for d, t in enumerate(out):   # what we drew is what the ring computed
        for c, v in enumerate(t.reshape(-1).tolist()):
            if _decode(v, k) != (c, every) or holds[d][c] != every:
                raise RuntimeError(f"device {d}, chunk {c}: not the full sum")
    return steps


def _parts_label(parts, k):
    return "all" if len(parts) == k else "".join(str(i) for i in sorted(parts))


def plot_ring_allreduce(k=4, ring=ring_all_reduce, steps=None):
    """Draw a ring all-reduce on k devices step by step (from ring_steps): columns are devices,
    cells their chunks, labelled with the devices whose parts each holds ("all": the full sum);
    arrows show which chunk each device sent to the next. Returns the figure."""
    steps = steps if steps is not None else ring_steps(k, ring)
    start = dict(phase="start", moves=[],
                 holds=[[frozenset({d})] * k for d in range(k)])
    panels = [start] + steps
    half = (len(panels) + 1) // 2
    cell, gap = 1.2, 0.75
    fig, axes = diagram(half, 2, width=SCHEMATIC_WIDTH, height=1.85 * half)
    count = {}
    for ax, step in zip(axes.T.flat, panels, strict=False):   # an odd count leaves a spare axis
        phase = step["phase"]
        count[phase] = count.get(phase, 0) + 1
        title = ("each device's own" if phase == "start" else
                 f"{phase}, step {count[phase]}")
        ax.set_title(title, fontsize=SMALL + 1, loc="left")
        width = k * cell + (k - 1) * gap
        ax.set(xlim=(-0.6, width + 0.6), ylim=(k * 0.62 + 0.1, -0.75), aspect="auto")
        for d in range(k):
            x = d * (cell + gap)
            ax.text(x + cell / 2, -0.45, f"dev {d}", ha="center", fontsize=SMALL)
            for c in range(k):
                parts = step["holds"][d][c]
                full = len(parts) == k
                fill = device_color(c) if full else "white"
                draw_box(ax, x, c * 0.62, cell, 0.55, fill, _parts_label(parts, k),
                    fontsize=SMALL, edge=device_color(c),
                    text=None if full else "black")
        for src, dst, c, _ in step["moves"]:
            y = c * 0.62 + 0.275
            arrow = dict(color=device_color(c), width=1.5, head=9)
            if dst == src + 1:
                draw_arrow(ax, (src * (cell + gap) + cell, y), (dst * (cell + gap), y), **arrow)
            else:   # round the ring: out on the right, in on the left
                draw_arrow(ax, (src * (cell + gap) + cell, y), (width + 0.55, y), **arrow)
                draw_arrow(ax, (-0.55, y), (0, y), **arrow)
    for ax in axes.T.flat[len(panels):]:
        ax.text(0.0, 0.6, f"rows: chunks 0 to {k - 1}\nlabel: whose\nparts it adds up",
                fontsize=SMALL, va="center", transform=ax.transAxes,
                color="0.3")
    fig.tight_layout()
    return fig


class _Products(TorchFunctionMode):
    """Records the shapes and device of every matrix product (a @ b)."""

    def __init__(self):
        super().__init__()
        self.products = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("matmul", "__matmul__", "mm"):
            self.products.append((tuple(args[0].shape), tuple(args[1].shape)))
        return func(*args, **(kwargs or {}))


def megatron_trace(k=2, n=4, d=8, h=16, seed=0):
    """Run megatron_mlp once, forward and backward, on k simulated devices with a ByteLog, and
    return what a picture needs: the hidden units of each device's W1 columns and W2 rows (from
    the products it ran), and the bytes per device of f's and g's all-reduces forward and
    backward (from the log)."""
    g = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(*s, generator=g, requires_grad=True)
               for s in [(n, d), (d, h), (h,), (h, d), (d,)]]
    log = ByteLog()
    with _Products() as seen:
        out = megatron_mlp(*tensors, [torch.device("cpu")] * k, log)
    out.sum().backward()
    first, second = seen.products[0::2], seen.products[1::2]
    if len(first) != k or len(second) != k or any(
            a[1][1] != b[1][0] for a, b in zip(first, second, strict=True)):
        raise RuntimeError(f"expected two products per device, got {seen.products}")
    units, lo = [], 0
    for _, (_, width) in first:       # X @ W1[:, units]: W1's columns are the device's units
        units.append((lo, lo + width))
        lo += width
    if lo != h:
        raise RuntimeError(f"the devices' products cover {lo} hidden units, not the {h} of W1's "
                           "columns: not a column split")
    sent = {}
    for r in log.records:
        op = r.op.split(": ")[0]      # "g forward", "f backward"
        sent[op] = sent.get(op, 0) + r.wire / k
    return dict(k=k, n=n, d=d, h=h, units=units, sent=sent,
                forward_names=sorted(op for op in sent if op.endswith("forward")),
                backward_names=sorted(op for op in sent if op.endswith("backward")))


def plot_megatron_mlp(trace=None, **kwargs):
    """Draw the Megatron MLP's f and g (from megatron_trace): forward above, left to right
    (f copies X to every device, each multiplies by its columns of W1, applies the ReLU and its
    rows of W2, g all-reduces); backward below, right to left (g copies the gradient, f
    all-reduces the gradient of X). One row per device. Returns the figure."""
    t = trace if trace is not None else megatron_trace(**kwargs)
    k, lane = t["k"], 0.9
    top = k * lane
    fig, axes = diagram(2, 1, width=SCHEMATIC_WIDTH, height=2.4 + 1.3 * top)
    # (name, left edge, width) of each column of boxes; W1 and W2 are named above their
    # columns, each device's box gives its hidden units (W1's columns, W2's rows), a:b
    cols = [("in", 0.0, 0.6), ("f", 0.85, 0.7), ("W1", 1.8, 1.45), ("ReLU", 3.5, 1.05),
            ("W2", 4.8, 1.45), ("g", 6.5, 0.7), ("out", 7.45, 0.6)]
    heads = {"W1": "W1\ncolumns", "W2": "W2\nrows"}
    sent = t["sent"]
    for ax, phase in zip(axes.flat, ("forward", "backward"), strict=True):
        ax.set(xlim=(-0.1, 8.15), ylim=(top + 0.1, -1.25))
        ax.set_title(f"forward: one row per device ({k})" if phase == "forward" else
                     "backward, right to left", fontsize=FONT - 1, loc="left")
        for name, x, w in cols:
            if name in ("f", "g"):
                op = f"{name} {phase}"
                comm = op in sent
                draw_box(ax, x, 0, w, top - 0.1, "#333333" if comm else "white", name,
                    fontsize=FONT + 3, edge="#333333", text="white" if comm else "#333333")
                note = f"all-reduce\n{sent[op] / 1e3:.1f} kB" if comm else "copy"
                ax.text(x + w / 2, -0.15, note, ha="center", va="bottom", fontsize=SMALL)
            elif name in ("in", "out"):
                label = {("in", "forward"): "X", ("out", "forward"): "Y",
                         ("in", "backward"): "dX", ("out", "backward"): "dY"}[name, phase]
                draw_box(ax, x, 0, w, top - 0.1, EVERY_RANK_COLOR, label, fontsize=FONT)
            else:
                if name in heads:
                    ax.text(x + w / 2, -0.15, heads[name], ha="center", va="bottom",
                            fontsize=SMALL)
                for dev, (a, b) in enumerate(t["units"]):
                    label = "ReLU" if name == "ReLU" else f"{a}:{b}"
                    draw_box(ax, x, dev * lane, w, lane - 0.1, device_color(dev), label,
                        fontsize=SMALL)
        for (_, a, wa), (_, b, _) in pairwise(cols):
            start, end = (a + wa + 0.03, b - 0.03)
            if phase == "backward":
                start, end = end, start
            draw_arrow(ax, (start, top / 2 - 0.05), (end, top / 2 - 0.05), color="0.3", width=1.5,
                       head=10)
    fig.tight_layout()
    return fig
