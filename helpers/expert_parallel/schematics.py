"""Part VII: the expert all-to-all drawn from the code that routes it: how many rows each rank
sends to each other rank in the dispatch (route and the experts' placement), and back in the
combine. For a light panel, readable at a phone's width: plot_all_to_all stacks its panels so
its labels keep 10 CSS px or more in a phone's column (phone_text_px)."""
import torch

from ..schematics import SCHEMATIC_FONT as FONT
from ..schematics import diagram
from .moe import expert_capacity, route

__all__ = ["dispatch_counts", "draw_all_to_all", "plot_all_to_all"]


def dispatch_counts(moe, X, world):
    """(world, world) tensor: rows rank i sends to rank j in the dispatch of `moe` (a
    helpers.MoE, its experts split over `world` ranks as ExpertParallelMoE splits them) on the
    tokens X cut into world equal groups; kept choices only (fixed buffers pad to capacity)."""
    E, local = moe.n_experts, moe.n_experts // world
    counts = torch.zeros(world, world, dtype=torch.long)
    with torch.no_grad():
        for i, xg in enumerate(X.chunk(world)):
            r = route(moe.router(xg), moe.k, expert_capacity(len(xg), E, moe.k,
                                                             moe.capacity_factor))
            dest = r["expert"][r["kept"]] // local
            counts[i] += torch.bincount(dest, minlength=world)
    return counts


def draw_all_to_all(counts, axes, fontsize=9):
    """Two panels: senders (left) and receivers (right) joined by an arrow per pair, as wide as
    the rows it carries (a rank's rows for its own experts stay: not drawn); and the same
    counts as a sender x receiver table. The combine sends the rows back the same way."""
    ax, table = axes
    w = counts.shape[0]
    top = float(counts.max()) or 1.0
    import matplotlib.pyplot as plt  # drawing only: `import helpers` stays light
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i in range(w):
        ax.text(-0.05, i, f"rank {i}", ha="right", va="center", fontsize=fontsize)
        ax.text(1.05, i, f"rank {i}", ha="left", va="center", fontsize=fontsize)
        for j in range(w):
            n = int(counts[i, j])
            if i != j and n:
                ax.annotate("", xy=(1, j), xytext=(0, i), arrowprops=dict(
                    arrowstyle="-|>", lw=0.5 + 4 * n / top, color=colors[i % len(colors)],
                    alpha=0.75, shrinkA=2, shrinkB=2))
    ax.set(xlim=(-0.5, 1.5), ylim=(w - 0.5, -0.5))
    ax.axis("off")
    ax.set_title("senders -> receivers", fontsize=fontsize)
    table.imshow(counts.numpy(), cmap="Blues", vmin=0, vmax=top * 1.6)
    for i in range(w):
        for j in range(w):
            table.text(j, i, str(int(counts[i, j])) + ("\n(stays)" if i == j else ""),
                       ha="center", va="center", fontsize=fontsize - 1)
    table.set(xticks=range(w), yticks=range(w))
    table.set_xlabel("to rank", fontsize=fontsize)
    table.set_ylabel("from rank", fontsize=fontsize)
    table.tick_params(labelsize=fontsize)
    table.set_title("rows sent", fontsize=fontsize)


def plot_all_to_all(counts):
    """draw_all_to_all with the arrows above the table (a phone's column is narrow). Returns the
    figure."""
    w = counts.shape[0]
    fig, axes = diagram(2, 1, width=4.6, height=1.3 * w + 2.4,
                        gridspec_kw=dict(height_ratios=[1, 1.15]))
    axes[1, 0].set_axis_on()
    draw_all_to_all(counts, axes[:, 0], fontsize=FONT)
    fig.tight_layout()
    return fig
