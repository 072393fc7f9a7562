"""Who holds what under ZeRO and FSDP, drawn from the functions that decide it.

`shard_owners` gives, for every number of a model's parameters (in `parameters()` order), the
rank that holds its weight, its gradient and its optimizer state, or -1 where every rank holds it,
for plain data parallelism, ZeRO-1 (`ShardedOptimizer`: whole tensors, `partition_by_size`),
ZeRO-2 (`Zero2`: equal slices of each bucket's flat buffer, `make_buckets` and `padded_flat`),
ZeRO-3 as `FSDPFromScratch` shards it (equal slices of each unit's flat buffer,
`unit_parameters`) and FSDP2 (`fully_shard`: each parameter's rows cut as `torch.chunk` cuts
them). `plot_shards` draws them, one bar per kind of state; `plot_memory_per_stage` the bytes
each stage held and sent, as measured (memory_per_stage) beside the cost model.
"""
import torch

from ..data_parallel.scratch import make_buckets
from ..schematics import EVERY_RANK_COLOR, SCHEMATIC_WIDTH, device_color, diagram, draw_box
from ..schematics import LABEL_FONT as SMALL
from ..schematics import SCHEMATIC_FONT as FONT
from .flat import padded_flat, unit_parameters
from .zero import partition_by_size

__all__ = ["SHARD_KINDS", "shard_owners", "plot_shards", "plot_memory_per_stage"]

SHARD_KINDS = ("weights", "gradients", "optimizer state")


def _flat_owners(tensors, world):
    """Owner of each element of each tensor when their padded flat buffer is cut into `world`
    equal slices (Zero2's buckets, FSDPFromScratch's units): {id(tensor): owners}."""
    n = padded_flat(tensors, world).numel() // world
    out, offset = {}, 0
    for t in tensors:
        out[id(t)] = torch.arange(offset, offset + t.numel()) // n
        offset += t.numel()
    return out


def _rows_owners(t, world):
    """Owner of each element when the rows (dim 0) are cut as torch.chunk cuts them (FSDP2)."""
    rows = t.shape[0] if t.dim() else 1
    per = -(-rows // world)
    return (torch.arange(rows) // per).repeat_interleave(max(1, t.numel() // max(rows, 1)))


def shard_owners(module, world, bucket_mb=None):
    """{scheme: {kind: owners}}: owners is a tensor with one entry per number of the model's
    trainable parameters, in parameters() order: the rank that holds it, or -1 for every rank.
    Kinds: SHARD_KINDS. `bucket_mb` is Zero2's (None: one parameter per bucket)."""
    params = [p for p in module.parameters() if p.requires_grad]
    every = torch.full((sum(p.numel() for p in params),), -1)

    def cat(owner_of):
        return torch.cat([owner_of[id(p)] for p in params])

    zero1 = partition_by_size([p.numel() for p in params], world)
    by_tensor = cat({id(p): torch.full((p.numel(),), r)
                     for p, r in zip(params, zero1, strict=True)})
    zero2 = {}
    for bucket in make_buckets(params, bucket_mb):
        zero2.update(_flat_owners(bucket, world))
    zero3 = {}
    for unit, names in unit_parameters(module, None):
        zero3.update(_flat_owners([unit.get_parameter(n) for n in names], world))
    rows = cat({id(p): _rows_owners(p, world) for p in params})
    sliced2, sliced3 = cat(zero2), cat(zero3)
    return {"data parallel": dict(zip(SHARD_KINDS, (every, every, every), strict=True)),
            "ZeRO-1": dict(zip(SHARD_KINDS, (every, every, by_tensor), strict=True)),
            "ZeRO-2": dict(zip(SHARD_KINDS, (every, sliced2, sliced2), strict=True)),
            "ZeRO-3 (FSDP from scratch)": dict(zip(SHARD_KINDS, (sliced3,) * 3, strict=True)),
            "FSDP2 (fully_shard)": dict(zip(SHARD_KINDS, (rows,) * 3, strict=True))}


def _runs(owners):
    """(start, length, owner) of each run of equal owners."""
    change = torch.nonzero(owners[1:] != owners[:-1]).flatten() + 1
    starts = [0, *change.tolist()]
    ends = [*change.tolist(), owners.numel()]
    return [(a, b - a, int(owners[a])) for a, b in zip(starts, ends, strict=True)]


def plot_shards(module, world, bucket_mb=None, owners=None):
    """One panel per scheme of shard_owners, three bars each (weights, gradients, optimizer
    state) along the model's parameters: grey where every rank holds them, a rank's colour where
    only that rank does. Returns the figure."""
    owners = owners if owners is not None else shard_owners(module, world, bucket_mb)
    total = next(iter(owners.values()))["weights"].numel()
    fig, axes = diagram(len(owners), 1, width=SCHEMATIC_WIDTH, height=1.45 * len(owners) + 0.6)
    for ax, (scheme, kinds) in zip(axes.flat, owners.items(), strict=True):
        ax.set_title(scheme, fontsize=FONT - 1, loc="left")
        ax.set(xlim=(-0.45 * total, total * 1.01), ylim=(3.0, -0.1))
        for row, kind in enumerate(SHARD_KINDS):
            ax.text(-0.02 * total, row + 0.4, kind, ha="right", va="center",
                    fontsize=SMALL)
            for start, length, r in _runs(kinds[kind]):
                draw_box(ax, start, row + 0.05, length, 0.7,
                    EVERY_RANK_COLOR if r < 0 else device_color(r), edge="none")
    from matplotlib.patches import Patch
    fig.legend(handles=[Patch(color=EVERY_RANK_COLOR, label="every rank")]
               + [Patch(color=device_color(r), label=f"rank {r}") for r in range(world)],
               loc="lower center", ncol=world + 1, fontsize=SMALL, frameon=False,
               handlelength=1.2, columnspacing=1.0)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


HELD_PARTS = (("params_bytes", "", "params"), ("grads_bytes", "//", "grads"),
              ("optim_bytes", "..", "optimizer"))


def plot_memory_per_stage(measured, n_params):
    """Rank 0's bytes held (stacked: parameters, gradients, optimizer state) and sent in one step
    per stage, a bar per world size of `measured` ({world: run_ranks' results of
    memory_per_stage}), the cost model (sharding_costs) a black tick on each. Two panels one above
    the other and few, large labels: it stays legible shrunk to a phone's column."""
    import numpy as np
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from ..costs import SHARDING_STAGES, sharding_costs
    fig, axes = diagram(2, 1, width=SCHEMATIC_WIDTH, height=7.2)
    ax_m, ax_t = axes[:, 0]
    worlds, w = sorted(measured), 0.8 / len(measured)
    x0 = np.arange(len(SHARDING_STAGES))
    for j, world in enumerate(worlds):
        x = x0 + (j - (len(worlds) - 1) / 2) * w
        got = [measured[world][0]["memory"][s] for s in SHARDING_STAGES]
        want = [sharding_costs(n_params, world, s) for s in SHARDING_STAGES]
        bottom = np.zeros(len(SHARDING_STAGES))
        for key, hatch, _ in HELD_PARTS:
            vals = np.array([getattr(g, key) for g in got]) / 1e6
            ax_m.bar(x, vals, w, bottom=bottom, color=device_color(j), hatch=hatch,
                     edgecolor="white")
            bottom += vals
        ax_t.bar(x, [g.sent_bytes / 1e6 for g in got], w, color=device_color(j))
        for ax, key in ((ax_m, "total_bytes"), (ax_t, "sent_bytes")):
            ax.plot(x, [c[key] / 1e6 for c in want], "k_", ms=16, mew=2.5)
    for ax, title in ((ax_m, "held per rank (MB)"), (ax_t, "sent per rank in one step (MB)")):
        ax.set_axis_on()
        ax.spines[["top", "right"]].set_visible(False)
        ax.set_xticks(x0, SHARDING_STAGES)
        ax.tick_params(labelsize=SMALL)
        ax.set_title(title, fontsize=FONT, loc="left")
    ranks = [Patch(color=device_color(j), label=f"{k} rank{'s' * (k > 1)}")
             for j, k in enumerate(worlds)]
    model = Line2D([], [], color="black", marker="_", ms=16, mew=2.5, ls="none", label="model")
    parts = [Patch(facecolor="#777777", hatch=h, edgecolor="white", label=name)
             for _, h, name in HELD_PARTS]
    ax_m.legend(handles=parts, fontsize=SMALL, frameon=False, ncol=3, loc="upper center",
                bbox_to_anchor=(0.5, -0.12))
    ax_t.legend(handles=[*ranks, model], fontsize=SMALL, frameon=False, ncol=2,
                loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    return fig
