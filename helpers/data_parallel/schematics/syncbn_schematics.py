"""What SyncBatchNorm sends between the ranks, against per-device BatchNorm, from a real run.

`syncbn_traffic` (data_parallel/syncbn_experiments.py, the launch target) records on each rank
every all-gather and all-reduce of one forward and backward, per-device BatchNorm's and the
course's synchronised one's. `syncbn_facts` reads the ranks' records; `plot_syncbn` draws them,
two ranks
side by side: SyncBatchNorm's forward all-gather of (count, mean, variance) and the global
statistics every rank gets, its backward all-reduce of two per-channel sums, and below,
per-device BatchNorm's two independent statistics and no communication.
"""
import torch

from ...schematics import LABEL_FONT as SMALL
from ...schematics import SCHEMATIC_WIDTH, device_color, diagram, draw_arrow, draw_box
from ..torch_api import combine_stats

__all__ = ["syncbn_facts", "plot_syncbn"]


def syncbn_facts(ranks, eps=1e-5):
    """From syncbn_traffic's per-rank SyncBnTraffic: dict(ranks: [dict(count, mean, var,
    invstd, sent: numbers all-gathered, sums: numbers all-reduced, own_mean, own_var,
    own_invstd: the shard's statistics per-device BatchNorm normalises with)], world:
    dict(count, mean, var, invstd), channels, bn_calls: collectives per-device BatchNorm ran),
    every statistic per channel."""
    rows, gathered = [], None
    for r in ranks:
        ops = [c.op for c in r.sync_calls]
        if ops != ["all_gather", "all_reduce"]:
            raise ValueError(f"SyncBatchNorm ran {ops}: expected one all_gather, one all_reduce")
        gather, reduce = r.sync_calls
        c = (len(gather.sent) - 1) // 2
        rows.append(dict(count=int(gather.sent[0]), mean=gather.sent[1:1 + c],
                         var=gather.sent[1 + c:], invstd=torch.rsqrt(gather.sent[1 + c:] + eps),
                         sent=len(gather.sent), sums=len(reduce.sent),
                         own_mean=r.shard_mean, own_var=r.shard_var,
                         own_invstd=torch.rsqrt(r.shard_var + eps)))
        gathered = gather.got
    mean, var, n = combine_stats(gathered[:, 0], gathered[:, 1:1 + c], gathered[:, 1 + c:])
    return dict(ranks=rows, channels=c, bn_calls=sum(len(r.bn_calls) for r in ranks),
                world=dict(count=int(n), mean=mean, var=var, invstd=torch.rsqrt(var + eps)))


def _stats(count, mean, var):
    """Channel 0's statistics as the stand-in all-gathers them (the variance, not invstd)."""
    return f"{count} values\nmean {mean[0]:.2f}\nvar {var[0]:.2f}"


def plot_syncbn(facts):
    """Two ranks side by side: SyncBatchNorm (each rank's shard statistics all-gathered into
    the global ones, two sums all-reduced in the backward) above per-device BatchNorm (each
    rank its own statistics, nothing sent). Channel 0's numbers, with the variance that the CPU
    stand-in all-gathers (nn.SyncBatchNorm sends invstd instead). Returns the figure."""
    ranks, world, c = facts["ranks"], facts["world"], facts["channels"]
    w, box, h = SCHEMATIC_WIDTH, 2.05, 0.95
    xs = [0.25, w - 0.25 - box]
    height = 6.45
    fig, axes = diagram(1, 1, width=w, height=height)
    ax = axes[0, 0]
    ax.set(xlim=(0, w), ylim=(height, 0))
    fig.subplots_adjust(0, 0, 1, 1)
    ax.text(0.1, 0.25, "SyncBatchNorm (channel 0 of " f"{c})", fontsize=SMALL + 2,
            va="center", weight="bold")
    for r, (x, s) in enumerate(zip(xs, ranks, strict=True)):
        draw_box(ax, x, 0.5, box, h, "white", edge=device_color(r), text="black",
                 label=f"rank {r}: " + _stats(s["count"], s["mean"], s["var"]),
                 fontsize=SMALL)
        draw_arrow(ax, (x + box / 2, 0.5 + h), (x + box / 2, 2.15), width=1.2, head=10)
    draw_box(ax, 0.1, 1.6, w - 0.2, 0.5, "#DDDDDD", edge="none", fontsize=SMALL,
             label=f"forward: all-gather (count, mean, var): {ranks[0]['sent']} numbers a rank")
    for x in xs:
        draw_box(ax, x, 2.15, box, h, "white", edge="black", text="black", fontsize=SMALL,
                 label="global: " + _stats(world["count"], world["mean"], world["var"]))
    draw_box(ax, 0.1, 3.25, w - 0.2, 0.75, "#DDDDDD", edge="none", fontsize=SMALL,
             label=f"backward: all-reduce sum dy, sum dy*xhat:\n"
                   f"{ranks[0]['sums']} numbers a rank ({c} channels x 2)")
    ax.text(0.1, 4.45, "per-device BatchNorm", fontsize=SMALL + 2, va="center",
            weight="bold")
    for r, (x, s) in enumerate(zip(xs, ranks, strict=True)):
        draw_box(ax, x, 4.7, box, h, "white", edge=device_color(r), text="black",
                 label=f"rank {r}: " + _stats(s["count"], s["own_mean"], s["own_var"]),
                 fontsize=SMALL)
    ax.text(w / 2, 5.95, f"{facts['bn_calls']} collectives in the layer: each rank\n"
            "normalises with its own shard's statistics", ha="center", va="top",
            fontsize=SMALL)
    return fig
