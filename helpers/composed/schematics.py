"""Part VII: the 3-D mesh drawn from the code that lays it out (rank_grid, coords_of): one
panel per pipeline stage, ranks as dots, each dimension's groups as lines. For a light panel,
readable at a phone's width."""

from itertools import pairwise

from ..runtime.mesh import coords_of, rank_grid
from ..schematics import LABEL_FONT as SMALL

__all__ = ["draw_mesh"]


def draw_mesh(shape, ax=None):
    """The (pp, dp, tp) mesh: one panel per pipeline stage, ranks as dots, each dimension's
    groups as lines. With pp = 1 it is Part VI's 2-D (dp, tp) mesh: no stage label, no pipeline
    line in the legend."""
    import matplotlib.pyplot as plt  # drawing only: `import helpers` stays light
    ax = ax or plt.gca()
    pp, dp, tp = shape
    xy = {}
    for rank in range(pp * dp * tp):
        c = coords_of(rank, shape)
        xy[rank] = (c["pp"] * (tp + 1) + c["tp"], -c["dp"])
    style = dict(tp=("tab:red", "-", "tensor (tp)"), dp=("tab:blue", "-", "data (dp)"),
                 pp=("tab:green", "--", "pipeline (pp)"))
    for name, groups in rank_grid(shape).items():
        if name == "pp" and pp == 1:
            continue                   # one stage: no pipeline groups to draw
        color, ls, label = style[name]
        ax.plot([], [], color=color, ls=ls, lw=2, label=label)   # legend
        for grp in groups:
            for a, b in pairwise(grp):
                up = xy[a][1] == 0         # pipeline arcs bend outwards
                bend = (-0.3 if up else 0.3) if name == "pp" else 0.0
                ax.annotate("", xy=xy[b], xytext=xy[a], arrowprops=dict(
                    arrowstyle="-", color=color, ls=ls, lw=2, alpha=0.7,
                    connectionstyle=f"arc3,rad={bend}", shrinkA=0, shrinkB=0))
    for rank, (x, y) in xy.items():
        ax.scatter([x], [y], s=500, color="white", edgecolor="black", zorder=3)
        ax.text(x, y, str(rank), ha="center", va="center", zorder=4, fontsize=SMALL + 1)
    for s in range(pp if pp > 1 else 0):
        ax.text(s * (tp + 1) + (tp - 1) / 2, 1.0, f"stage {s}", ha="center", fontsize=SMALL + 1)
    ylim = (-dp - 0.4, 1.25) if pp > 1 else (-dp + 0.4, 0.45)   # one stage: no stage labels
    ax.set(xlim=(-0.7, pp * (tp + 1) - 1.3), ylim=ylim)
    ax.axis("off")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.02), ncols=3 if pp > 1 else 2,
              fontsize=SMALL,
              frameon=False, handlelength=1.5, columnspacing=1.0)
