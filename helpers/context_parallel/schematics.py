"""Part VII: context parallelism drawn from the code that runs it: who holds which K/V block
at each step of the ring, and what of each block a rank computes (causal_block), over a
contiguous or a zig-zag split (split_positions). Figures for a light panel (the book puts
them on one in dark mode too), readable at a phone's width: plot_ring stacks its panels, and
both figures keep their labels at 10 CSS px or more in a phone's column (phone_text_px)."""
import numpy as np

from ..schematics import SCHEMATIC_FONT as FONT
from ..schematics import diagram
from .scratch import causal_block, split_positions

__all__ = ["ring_schedule", "draw_ring", "draw_split", "plot_ring", "plot_split"]

RANK_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
               "tab:pink", "tab:olive")


def ring_schedule(T, world, layout="zigzag", causal=True):
    """[rank][step] -> (whose K/V block it holds, share of that block it computes: rows x
    cols formed over the block's T/w x T/w)."""
    pos = [split_positions(T, world, r, layout) for r in range(world)]
    L = T // world
    out = []
    for r in range(world):
        row = []
        for i in range(world):
            src = (r - i) % world
            first, cols, _ = causal_block(pos[r], pos[src], causal)
            row.append((src, (L - first) * cols / (L * L)))
        out.append(row)
    return out


def draw_ring(T, world, layout="zigzag", ax=None, fontsize=8):
    """Ranks (rows) by steps (columns): each cell names the K/V block the rank holds at that
    step and is filled by the share of it the rank computes; arrows: the block goes on to the
    next rank."""
    import matplotlib.pyplot as plt  # drawing only: `import helpers` stays light
    ax = ax or plt.gca()
    sched = ring_schedule(T, world, layout)
    for r, row in enumerate(sched):
        for i, (src, share) in enumerate(row):
            ax.add_patch(plt.Rectangle((i, r), 0.9, 0.8, facecolor="white", edgecolor="black"))
            if share:
                ax.add_patch(plt.Rectangle((i, r), 0.9 * share, 0.8,
                                           facecolor=RANK_COLORS[src % 8], alpha=0.55))
            label = f"K/V {src}" + ("" if share else "\nskipped")
            ax.text(i + 0.45, r + 0.4, label, ha="center", va="center", fontsize=fontsize)
            if i < world - 1 and r < world - 1:
                ax.annotate("", xy=(i + 1.05, r + 1.15), xytext=(i + 0.85, r + 0.75),
                            arrowprops=dict(arrowstyle="->", color="0.4", lw=0.8))
    ax.set(xlim=(-0.1, world), ylim=(world, -0.2), xticks=[i + 0.45 for i in range(world)],
           xticklabels=[f"step {i}" for i in range(world)],
           yticks=[r + 0.4 for r in range(world)],
           yticklabels=[f"rank {r}" for r in range(world)])
    ax.tick_params(length=0, labelsize=fontsize + 1)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"{layout}: the block held, filled by the share computed",
                 fontsize=fontsize + 1)


def plot_ring(T, world, layouts=("contiguous", "zigzag")):
    """draw_ring for each layout, one panel under the other (a phone's column is narrow).
    Returns the figure."""
    fig, axes = diagram(len(layouts), 1, width=5.0, height=0.75 * world * len(layouts) + 0.6)
    for ax, layout in zip(axes.flat, layouts, strict=True):
        ax.set_axis_on()
        draw_ring(T, world, layout, ax, fontsize=FONT - 2)
        ax.set_title("")                  # draw_ring's one-line title: too wide here
        ax.set_title(f"{layout} split: K/V block held at each step,\nfilled by the share "
                     "computed", fontsize=FONT - 1, loc="left")
    fig.tight_layout()
    return fig


def draw_split(T, world, layout, ax=None, fontsize=None):
    """The T x T causal score matrix (query rows, key columns): each pair a rank's ring forms,
    in its colour (dark where the mask keeps it, light where it is formed and masked); white:
    never formed."""
    import matplotlib.pyplot as plt  # drawing only: `import helpers` stays light
    ax = ax or plt.gca()
    pos = [split_positions(T, world, r, layout) for r in range(world)]
    img = np.ones((T, T, 3))
    for r in range(world):
        rgb = np.array(plt.matplotlib.colors.to_rgb(RANK_COLORS[r % 8]))
        for s in range(world):
            first, cols, _ = causal_block(pos[r], pos[s])
            for qi in pos[r][first:].tolist():
                for kj in pos[s][:cols].tolist():
                    img[qi, kj] = rgb if kj <= qi else 0.75 + 0.25 * rgb
    ax.imshow(img, interpolation="nearest")
    ax.set_xlabel("key position", fontsize=fontsize)
    ax.set_ylabel("query position", fontsize=fontsize)
    ax.set_title(layout, fontsize=fontsize)
    ax.set_xticks([0, T - 1])
    ax.set_yticks([0, T - 1])
    ax.tick_params(labelsize=fontsize)


def plot_split(T, world, layouts=("contiguous", "zigzag")):
    """draw_split for each layout, side by side (two squares fit a phone's column).
    Returns the figure."""
    fig, axes = diagram(1, len(layouts), width=5.0, height=2.9)
    for ax, layout in zip(axes.flat, layouts, strict=True):
        ax.set_axis_on()
        draw_split(T, world, layout, ax, fontsize=FONT - 1)
    fig.tight_layout()
    return fig
