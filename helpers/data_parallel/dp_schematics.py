"""What nn.DataParallel does on every forward and backward, read off its own rules and drawn.

`dp_step_facts` cuts a real batch as DataParallel's `scatter` does (`torch.chunk` along
dimension 0) and gives replicas only to the devices that got a piece, as DataParallel.forward
does (`device_ids[:len(inputs)]`): a batch of 5 over 4 GPUs makes pieces 2, 2, 1 and leaves the
last GPU idle. `plot_dp_step` draws one step: scatter, replicate, parallel_apply in threads,
gather on the first GPU, and the backward summing every replica's gradient onto the module
there.
"""
from ..schematics import LABEL_FONT as SMALL, SCHEMATIC_WIDTH, device_color, diagram, draw_arrow, \
    draw_box

__all__ = ["dp_step_facts", "plot_dp_step"]

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
