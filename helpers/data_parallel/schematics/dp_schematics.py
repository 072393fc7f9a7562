"""What nn.DataParallel does on every forward and backward, read off its own rules and drawn.

`dp_step_facts` cuts a real batch as DataParallel's `scatter` does (`torch.chunk` along
dimension 0) and gives replicas only to the devices that got a piece, as DataParallel.forward
does (`device_ids[:len(inputs)]`): a batch of 5 over 4 GPUs makes pieces 2, 2, 1 and leaves the
last GPU idle. `plot_dp_step` draws one step: scatter, replicate, parallel_apply in threads,
gather on the first GPU, and the backward summing every replica's gradient onto the module
there.

`scratch_step_facts` records Part II's from-scratch step on the chapter's own shards: the sizes
and labels `split_batch` gave each device, and what the chapter's `allreduce` does to one tensor
a device (each `add_` and `copy_` between them, and what each holds afterwards).
`plot_scratch_step` draws it: the shards, each device's gradient, the sum formed on device 0
and copied back.
"""
import torch
from torch.overrides import TorchFunctionMode

from ...schematics import LABEL_FONT as SMALL
from ...schematics import SCHEMATIC_WIDTH, device_color, diagram, draw_arrow, draw_box

__all__ = ["dp_step_facts", "plot_dp_step", "scratch_step_facts", "plot_scratch_step"]

IDLE_COLOR = "#BBBBBB"


def dp_step_facts(batch, device_ids):
    """dict(batch: rows, devices: names, pieces: rows per device (0: idle), replicas: the
    devices that get a replica) for one DataParallel forward of `batch` over `device_ids`."""
    devices = [str(d) for d in device_ids]
    pieces = [len(p) for p in batch.chunk(len(devices))]       # scatter: torch.chunk
    replicas = devices[:len(pieces)]                          # DataParallel.forward's rule
    return dict(batch=len(batch), devices=devices, replicas=replicas,
                pieces=pieces + [0] * (len(devices) - len(pieces)))


def plot_dp_step(facts):
    """Rows of the batch coloured by the device they go to, each device's piece and replica
    (or idle), the gather onto the first device, and below it the backward's gradient sum
    onto the first device's module. Returns the figure."""
    devices, pieces, n = facts["devices"], facts["pieces"], facts["batch"]
    k, row = len(devices), 0.62
    height = 1.05 + row * k + 1.05
    fig, axes = diagram(1, 1, width=SCHEMATIC_WIDTH, height=height)
    ax = axes[0, 0]
    ax.set(xlim=(0, SCHEMATIC_WIDTH), ylim=(height, 0))
    fig.subplots_adjust(0, 0, 1, 1)
    top = 0.95
    for x, title in ((0.45, f"batch\n{n} rows"), (1.55, "scatter\n(chunk)"),
                     (2.85, "replicate,\nparallel_apply"), (4.35, "gather")):
        ax.text(x, top - 0.12, title, ha="center", va="bottom", fontsize=SMALL)
    owner = [d for d, p in enumerate(pieces) for _ in range(p)]
    cell = min(0.3, row * k / max(n, 1))
    for i, d in enumerate(owner):                             # the batch's rows
        draw_box(ax, 0.3, top + i * cell, 0.3, cell, device_color(d), edge="white")
    ys = [top + row * d for d in range(k)]
    for d, (name, p) in enumerate(zip(devices, pieces, strict=True)):
        y = ys[d] + 0.06
        if p:
            draw_box(ax, 1.1, y, 0.9, row - 0.12, device_color(d),
                     label=f"{p} row" + "s" * (p != 1), fontsize=SMALL)
            draw_box(ax, 2.25, y, 1.2, row - 0.12, "white", edge=device_color(d),
                     label=f"replica\n{name}", fontsize=SMALL, text="black")
            draw_arrow(ax, (2.0, y + row / 2 - 0.06), (2.25, y + row / 2 - 0.06),
                       width=1.2, head=10)
            draw_arrow(ax, (3.45, y + row / 2 - 0.06), (3.9, top + row * k / 2),
                       color=device_color(d), width=1.2, head=10)
        else:
            draw_box(ax, 1.1, y, 2.35, row - 0.12, "white", edge=IDLE_COLOR, ls="--",
                     label=f"{name}: no rows, idle", fontsize=SMALL, text="0.35")
    draw_box(ax, 3.9, top, 0.95, row * k, "#DDDDDD", edge="none",
             label=f"outputs\n{n} rows\non\n{devices[0]}", fontsize=SMALL)
    y_back = top + row * k + 0.2
    draw_box(ax, 0.3, y_back, 4.55, 0.75, "white", edge=device_color(0),
             label=f"backward: the {len(facts['replicas'])} replicas' gradients\n"
                   f"summed into the module's .grad on {devices[0]}", fontsize=SMALL,
             text="black")
    return fig


class _Moves(TorchFunctionMode):
    """Records each add_ and copy_ between the tensors of `data` (or copies of them made with
    .to) as (op, destination, source), positions in `data`."""

    def __init__(self, data):
        super().__init__()
        self.where = {id(t): i for i, t in enumerate(data)}
        self.kept, self.ops = list(data), []   # kept alive: an id stays theirs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.to and id(args[0]) in self.where:
            self.where.setdefault(id(out), self.where[id(args[0])])
            self.kept.append(out)
        elif func in (torch.Tensor.add_, torch.Tensor.copy_) and len(args) > 1:
            dst, src = self.where.get(id(args[0])), self.where.get(id(args[1]))
            if dst is not None and src is not None:
                self.ops.append((func.__name__, dst, src))
        return out


def scratch_step_facts(X_shards, y_shards, allreduce):
    """dict(devices, sizes: rows a shard, labels: each shard's y, batch, target: the device the
    sum is formed on, ops: allreduce's (op, destination, source) moves, holds: the gradients
    each device holds afterwards) from split_batch's shards and the chapter's `allreduce`, run on
    one tensor a device (device i holds 2**i, so each sum says which gradients it adds).
    Refuses an allreduce that leaves a device without the sum, or that does not add into one
    device and copy back from it (the two steps this picture draws)."""
    k = len(X_shards)
    data = [torch.full((1,), 2.0 ** i, device=x.device) for i, x in enumerate(X_shards)]
    given = list(data)                        # the tensors themselves, whatever the list holds
    with _Moves(data) as moves:
        allreduce(data)
    held = [int(t.item()) for t in given]
    if held != [2 ** k - 1] * k:
        raise ValueError(f"after allreduce the devices hold {held}: not every one the sum "
                         f"{2 ** k - 1} (does it write into the tensors it was given?)")
    holds, adds = [{i} for i in range(k)], [o for o in moves.ops if o[0] == "add_"]
    for op, dst, src in moves.ops:
        holds[dst] = holds[dst] | holds[src] if op == "add_" else set(holds[src])
    target = adds[0][1] if adds else 0
    copies = [o for o in moves.ops if o[0] == "copy_"]
    if moves.ops != adds + copies or any(d != target for _, d, _ in adds) \
            or any(s != target for _, _, s in copies) or holds != [set(range(k))] * k:
        raise ValueError(f"allreduce moved {moves.ops}: this picture draws adds into one "
                         "device, then copies back from it")
    return dict(devices=[f"device {i}" for i in range(k)], sizes=[len(x) for x in X_shards],
                labels=[y.tolist() for y in y_shards], batch=sum(len(x) for x in X_shards),
                target=target, ops=moves.ops, holds=[sorted(h) for h in holds])


def _labels(ys):
    """A shard's labels, short: "y 0-2" for a run of three or more, else "y 4, 7"."""
    if len(ys) > 2 and ys == list(range(ys[0], ys[0] + len(ys))):
        return f"y {ys[0]}\u2013{ys[-1]}"
    return "y " + ", ".join(map(str, ys)) if len(ys) <= 3 else f"y {ys[0]}, \u2026, {ys[-1]}"


def _terms(held):
    """g0+g1\n+g2+g3: the gradients a device holds, two to a line."""
    terms = [f"g{i}" for i in held]
    return "\n+".join("+".join(terms[i:i + 2]) for i in range(0, len(terms), 2))


def plot_scratch_step(facts):
    """Devices across, the step down: each device's shard (rows and labels), its gradient, the
    adds into the target device and the copies back from it (an arrow to each other device, a
    dashed line to the target, which holds the sum already), then the update. Returns the
    figure."""
    k, target = len(facts["devices"]), facts["target"]
    w, left = SCHEMATIC_WIDTH, 1.05
    col = (w - left) / k
    box, row, gap = col - 0.12, 0.62, 0.5
    ys = [0.45 + i * (row + gap) for i in range(4)]
    height = ys[-1] + row + 0.65
    fig, axes = diagram(1, 1, width=w, height=height)
    ax = axes[0, 0]
    ax.set(xlim=(0, w), ylim=(height, 0))
    fig.subplots_adjust(0, 0, 1, 1)
    xs = [left + i * col + 0.06 for i in range(k)]
    for x, name in zip(xs, facts["devices"], strict=True):
        ax.text(x + box / 2, 0.2, name if col > 0.8 else name.split()[-1], ha="center",
                va="center", fontsize=SMALL)
    steps = ("split_batch", "backward\n(summed\nloss)",
             f"add_ into\n{facts['devices'][target]}", "copy_ back")
    for y, step in zip(ys, steps, strict=True):
        ax.text(0.05, y + row / 2, step, fontsize=SMALL, va="center")
    for i, (x, n, ys_i) in enumerate(zip(xs, facts["sizes"], facts["labels"], strict=True)):
        draw_box(ax, x, ys[0], box, row, device_color(i), fontsize=SMALL,
                 label=f"{n} row" + "s" * (n != 1) + ("\n" + _labels(ys_i) if n else ""))
        draw_arrow(ax, (x + box / 2, ys[0] + row), (x + box / 2, ys[1]), width=1.2, head=10)
        draw_box(ax, x, ys[1], box, row, "white", edge=device_color(i), text="black",
                 label=f"g{i}", fontsize=SMALL)
    tx = xs[target]
    draw_box(ax, tx, ys[2], box, row, "#DDDDDD", edge="none", fontsize=SMALL,
             label=_terms(range(k)))
    draw_arrow(ax, (tx + box / 2, ys[1] + row), (tx + box / 2, ys[2]), width=1.2, head=10)
    for _, _, src in (o for o in facts["ops"] if o[0] == "add_"):
        draw_arrow(ax, (xs[src] + box / 2, ys[1] + row), (tx + box * 0.75, ys[2]),
                   color=device_color(src), width=1.5, head=10)
    for i, (x, held) in enumerate(zip(xs, facts["holds"], strict=True)):
        draw_box(ax, x, ys[3], box, row, "white", edge=device_color(i), text="black",
                 label=_terms(held), fontsize=SMALL)
    # the target's gradient is the sum (add_ wrote into it): a dashed line, no copy arrow
    ax.plot([tx + box / 2] * 2, [ys[2] + row, ys[3]], color="black", linewidth=1.2,
            linestyle=(0, (3, 2)))
    for _, dst, _ in (o for o in facts["ops"] if o[0] == "copy_"):
        draw_arrow(ax, (tx + box * 0.75, ys[2] + row), (xs[dst] + box / 2, ys[3]),
                   color="black", width=1.5, head=10)
    ax.text(0.05, ys[3] + row + 0.15, f"then sgd divides by {facts['batch']}, the whole batch:\n"
            "every replica takes the same step", fontsize=SMALL, va="top")
    return fig
