"""The torchrun chapter's three pictures, each drawn from what its code produced.

`sampler_facts` reads DistributedSampler's real shards (one list of indices per rank) back into
the order the sampler dealt them from: the shuffled indices, padded by repeating the first ones
until every rank gets as many, then dealt to the ranks in turn. `plot_sampler` draws that order
and each rank's shard below it, the padded (repeated) indices marked, so what the sampler does
to a data set whose size the world size does not divide is seen, not told.

`restart_facts` reads a run's history (the metrics file of scripts/ddp/torchrun.py: one entry per
finished epoch, with the `attempt` that ran it) into the attempts torchrun made: which epochs each
ran, where the killed one stopped, which snapshot the next one reloaded. `plot_restart` draws
them as a timeline of epochs per attempt, every rank a lane: torchrun restarts them all.

`torchrun_facts` reads the environment each process of a torchrun job was given (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) into the job; `plot_torchrun` draws the
launcher, one process per rank with its variables, and the rendezvous store they all connect to.
"""
import textwrap

from ...schematics import LABEL_FONT as SMALL
from ...schematics import SCHEMATIC_WIDTH, device_color, diagram, draw_arrow, draw_box

__all__ = ["sampler_facts", "plot_sampler", "restart_facts", "plot_restart", "torchrun_facts",
           "plot_torchrun"]

LOST_COLOR = "#D55E00"          # the work a kill threw away
SNAPSHOT_COLOR = "#DDDDDD"
CHARS_PER_INCH = 11             # of LABEL_FONT text, to wrap a note into the room it has


def sampler_facts(shards, n, epoch=None):
    """dict(n, world, epoch, order: the indices in the order the sampler dealt them (rank
    i % world got order[i]), padded: how many of them repeat an earlier one, shards, per_rank)
    from the shards DistributedSampler gave each rank (list(sampler) for rank 0, 1, ...) of a
    data set of `n` examples. Refuses shards that are not a padded permutation of range(n)
    dealt in turn (another sampler, or drop_last=True)."""
    shards = [[int(i) for i in s] for s in shards]
    world, per_rank = len(shards), len(shards[0]) if shards else 0
    if not shards or any(len(s) != per_rank for s in shards):
        raise ValueError(f"shards of sizes {[len(s) for s in shards]}: DistributedSampler "
                         "gives every rank as many indices")
    order = [shards[i % world][i // world] for i in range(world * per_rank)]
    if len(order) < n or sorted(order[:n]) != list(range(n)) \
            or any(order[j] != order[j % n] for j in range(n, len(order))):
        raise ValueError(f"{len(order)} indices for {n} examples are not a permutation of "
                         "range(n) padded with its first indices (drop_last=True drops examples; "
                         "this picture draws the padding)")
    return dict(n=n, world=world, epoch=epoch, order=order, padded=len(order) - n,
                shards=shards, per_rank=per_rank)


def _index_cell(ax, x, y, w, h, index, rank, padded):
    """One index: filled with its rank's colour, or, when padded, white with a dashed frame."""
    if padded:
        draw_box(ax, x, y, w, h, "white", edge=device_color(rank), text="black", ls="--",
                 label=str(index), fontsize=SMALL, hatch="///")
    else:
        draw_box(ax, x, y, w, h, device_color(rank), edge="white", label=str(index),
                 fontsize=SMALL)


def plot_sampler(facts):
    """The sampler's order on one row, its cells coloured by the rank they are dealt to, and
    each rank's shard on a row below, every index under its place in the order; padded indices
    white, hatched and dashed. Returns the figure."""
    n, world, order = facts["n"], facts["world"], facts["order"]
    w, left = SCHEMATIC_WIDTH, 1.0
    cell = min(0.42, (w - left - 0.05) / len(order))
    h, gap = 0.36, 0.1
    top = 0.85
    height = top + h + 0.35 + world * (h + gap) + 0.75
    fig, axes = diagram(1, 1, width=w, height=height)
    ax = axes[0, 0]
    ax.set(xlim=(0, w), ylim=(height, 0))
    fig.subplots_adjust(0, 0, 1, 1)
    when = "" if facts["epoch"] is None else f"epoch {facts['epoch']}: "
    padded = f", padded to {len(order)}" if facts["padded"] else ""
    ax.text(0.05, 0.25, f"{when}{n} indices shuffled{padded},\n"
            f"dealt to {world} ranks in turn", fontsize=SMALL, va="center")
    ax.text(0.05, top + h / 2, "shuffled", fontsize=SMALL, va="center")
    y0 = top + h + 0.35
    for j, index in enumerate(order):
        rank, x = j % world, left + j * cell
        _index_cell(ax, x, top, cell, h, index, rank, j >= n)
        y = y0 + rank * (h + gap)
        ax.plot([x + cell / 2] * 2, [top + h, y], color="0.75", lw=0.8, zorder=0)
        _index_cell(ax, x, y, cell, h, index, rank, j >= n)
    for r in range(world):
        ax.text(0.05, y0 + r * (h + gap) + h / 2, f"rank {r}", fontsize=SMALL, va="center")
    pad = facts["padded"]
    note = f"{len(order)} indices for {n} examples: " + (
        f"the last {pad} (hatched)\nrepeat the first {pad}, so every rank gets {facts['per_rank']}"
        if pad else f"no padding,\nevery rank gets {facts['per_rank']}")
    ax.text(0.05, y0 + world * (h + gap) + 0.1, note, fontsize=SMALL, va="top")
    return fig


def restart_facts(history, world, failed_rank=None, fail_step=None, steps_per_epoch=None):
    """dict(epochs, world, attempts: [dict(attempt, epochs: the epochs it finished, resumed_from:
    the epoch whose snapshot it loaded (None: it started afresh), lost: the epoch it was running
    when it died (None: it finished), lost_fraction: how far into that epoch (None: unknown),
    failed_rank)]) from a run's history (dicts with "epoch" and "attempt", one per finished epoch,
    as scripts/ddp/torchrun.py records them). `fail_step` (global steps before the kill) and
    `steps_per_epoch` place the kill within the epoch it cut short."""
    epochs = [h["epoch"] for h in history]
    if epochs != list(range(1, len(epochs) + 1)):
        raise ValueError(f"epochs {epochs}: a history holds each finished epoch once, in order")
    runs = {}
    for h in history:
        runs.setdefault(int(h["attempt"]), []).append(h["epoch"])
    numbers = list(runs)
    if numbers != sorted(numbers):
        raise ValueError(f"attempts {numbers} out of order: a later attempt ran an earlier epoch")
    attempts = []
    for a, nxt in zip(numbers, numbers[1:] + [None], strict=True):
        lost = runs[nxt][0] if nxt is not None else None
        fraction = None
        if lost is not None and fail_step is not None and steps_per_epoch:
            done = fail_step - (lost - 1) * steps_per_epoch
            if not 0 <= done < steps_per_epoch:
                raise ValueError(f"step {fail_step} is not in epoch {lost}, the epoch attempt "
                                 f"{nxt} ran again")
            fraction = done / steps_per_epoch
        attempts.append(dict(attempt=a, epochs=runs[a], lost=lost, lost_fraction=fraction,
                             resumed_from=runs[a][0] - 1 if runs[a][0] > 1 else None,
                             failed_rank=failed_rank if lost is not None else None))
    return dict(epochs=len(epochs), world=world, attempts=attempts)


def plot_restart(facts):
    """Epochs across, attempts down, every rank a lane: each attempt's finished epochs, a
    snapshot after each, the epoch a kill cut short (and the rank killed; drawn halfway in when
    the step is not known), and the next attempt restarting every rank from the last snapshot.
    Returns the figure."""
    world, attempts, epochs = facts["world"], facts["attempts"], facts["epochs"]
    w, left = SCHEMATIC_WIDTH, 1.05
    col = (w - left - 0.1) / epochs
    lane, between = 0.34, 0.95
    block = 0.4 + world * lane
    height = 0.45 + len(attempts) * block + (len(attempts) - 1) * between + 0.7
    fig, axes = diagram(1, 1, width=w, height=height)
    ax = axes[0, 0]
    ax.set(xlim=(0, w), ylim=(height, 0))
    fig.subplots_adjust(0, 0, 1, 1)
    for e in range(1, epochs + 1):
        ax.text(left + (e - 0.5) * col, 0.25, f"epoch {e}" if col > 0.75 else str(e),
                ha="center", va="center", fontsize=SMALL)
    y = 0.45
    for k, a in enumerate(attempts):
        ax.text(0.05, y + 0.2, f"attempt {a['attempt']}", fontsize=SMALL, va="center",
                weight="bold")
        lanes = y + 0.4
        for r in range(world):
            ax.text(0.05, lanes + r * lane + lane / 2, f"rank {r}", fontsize=SMALL, va="center")
        if a["resumed_from"] is not None:
            x = left + (a["resumed_from"] - 1) * col
            draw_box(ax, x + 0.05, lanes, col - 0.1, world * lane, SNAPSHOT_COLOR, edge="none",
                     label=f"loads\nepoch {a['resumed_from']}" if col > 0.8 else None,
                     fontsize=SMALL)
        for e in a["epochs"]:
            x = left + (e - 1) * col
            for r in range(world):
                draw_box(ax, x, lanes + r * lane, col, lane, device_color(r), edge="white")
            ax.plot([x + col] * 2, [lanes - 0.06, lanes + world * lane + 0.06], color="black",
                    lw=2.5)                                          # the snapshot it wrote
        if a["lost"] is not None:
            x = left + (a["lost"] - 1) * col
            part = col * (a["lost_fraction"] if a["lost_fraction"] is not None else 0.5)
            for r in range(world):
                draw_box(ax, x, lanes + r * lane, part, lane, "white", edge=LOST_COLOR, ls="--")
            if a["failed_rank"] is not None:
                ax.text(x + part, lanes + a["failed_rank"] * lane + lane / 2, "X",
                        color=LOST_COLOR, fontsize=SMALL + 3, weight="bold", ha="center",
                        va="center")
            said = f"rank {a['failed_rank']} killed" if a["failed_rank"] is not None \
                else "killed"
            bottom, kill = lanes + world * lane, x + part
            room = max(kill - 0.2, w - kill - 0.2)             # the wider side of the arrow
            every = "both" if world == 2 else f"all {world}"
            text = textwrap.fill(f"{said}: torchrun restarts {every} ranks, each loads "
                                 f"the snapshot of epoch {attempts[k + 1]['resumed_from']}",
                                 max(12, int(room * CHARS_PER_INCH)))
            right = kill < w / 2
            ax.text(kill + 0.12 if right else kill - 0.12, bottom + between / 2 + 0.05, text,
                    fontsize=SMALL, va="center", ha="left" if right else "right")
            draw_arrow(ax, (kill, bottom), (kill, bottom + between + 0.4), color=LOST_COLOR,
                       width=1.5, head=10)
        y += block + between
    ax.text(0.05, height - 0.32, "black bar: a snapshot written; grey: a snapshot\n"
            "loaded; dashed: the work the kill lost", fontsize=SMALL, va="center")
    return fig


LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")
AGENT_COLOR = "#444444"
STORE_COLOR = "#DDDDDD"
MAX_DRAWN = 4                  # ranks a phone-width picture has room for


def torchrun_facts(envs):
    """dict(world, addr, port, agent_store: whether torchrun's agent serves the store (else
    rank 0 does), ranks: [dict(rank, local_rank)] in rank order) from the environment each
    process of one machine's torchrun job was given (one dict per process, LAUNCH_VARS as
    strings). Refuses environments that do not make one job: ranks missing or repeated, or
    processes that disagree on the world size or the store's address."""
    if not envs:
        raise ValueError("no environments: pass the variables each rank was given")
    missing = sorted({k for e in envs for k in LAUNCH_VARS[:6] if k not in e})
    if missing:
        raise ValueError(f"{missing} not set: start the processes with torchrun")
    shared = {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"])
              for e in envs}
    if len(shared) > 1:
        raise ValueError(f"the processes disagree on WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR "
                         f"or MASTER_PORT: {sorted(shared)}; they are not one job")
    world, local_world, addr, port = shared.pop()
    ranks = sorted((int(e["RANK"]), int(e["LOCAL_RANK"])) for e in envs)
    if [r for r, _ in ranks] != list(range(int(world))):
        raise ValueError(f"ranks {[r for r, _ in ranks]} for a world of {world}: every rank "
                         "once")
    if int(local_world) != int(world):
        raise ValueError(f"{local_world} processes a machine for a world of {world}: this "
                         "picture draws one machine")
    agent = envs[0].get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return dict(world=int(world), addr=addr, port=int(port), agent_store=agent,
                ranks=[dict(rank=r, local_rank=lr) for r, lr in ranks])


def plot_torchrun(facts):
    """torchrun on one machine: the launcher on top, one process per rank below it (each with
    the RANK and LOCAL_RANK it was given), and the rendezvous store at MASTER_ADDR:MASTER_PORT
    at the bottom, which every rank connects to in init_process_group. Up to MAX_DRAWN ranks.
    Returns the figure."""
    world, ranks = facts["world"], facts["ranks"]
    if world > MAX_DRAWN:
        raise ValueError(f"{world} ranks: this picture draws up to {MAX_DRAWN}, readable on a "
                         "phone; launch fewer processes to draw the job")
    w, margin = SCHEMATIC_WIDTH, 0.1
    col = (w - 2 * margin) / world
    box_w = min(1.6, col - 0.12)
    narrow = col < 1.3                 # LOCAL_RANK=1 wider than its column: on two lines
    top_h, rank_y, rank_h, env_h = 0.62, 1.35, 0.5, 0.72 if narrow else 0.55
    store_y = rank_y + rank_h + env_h + 0.45
    store_h = 0.75
    server = "torchrun" if facts["agent_store"] else "rank 0"
    common = (f"every rank is also given WORLD_SIZE={world}, MASTER_ADDR={facts['addr']} and "
              f"MASTER_PORT={facts['port']}: where the store is")
    note = textwrap.fill(common, int((w - 2 * margin) * CHARS_PER_INCH))
    height = store_y + store_h + 0.2 + 0.2 * (note.count("\n") + 1) + 0.2
    fig, axes = diagram(1, 1, width=w, height=height)
    ax = axes[0, 0]
    ax.set(xlim=(0, w), ylim=(height, 0))
    fig.subplots_adjust(0, 0, 1, 1)
    draw_box(ax, margin, 0.1, w - 2 * margin, top_h, AGENT_COLOR,
             label=f"torchrun: starts {world} processes", text="white")
    addr = f"{facts['addr']}:{facts['port']}"
    addr = addr if len(addr) <= 34 else addr[:16] + "…" + addr[-17:]   # the note has it whole
    draw_box(ax, margin, store_y, w - 2 * margin, store_h, STORE_COLOR, edge="0.4",
             label=f"TCPStore at {addr}\nserved by {server}; every rank connects",
             fontsize=SMALL)
    for k, r in enumerate(ranks):
        centre = margin + (k + 0.5) * col
        draw_arrow(ax, (centre, 0.1 + top_h), (centre, rank_y), width=1.5, head=10)
        draw_box(ax, centre - box_w / 2, rank_y, box_w, rank_h, device_color(r["rank"]),
                 label=f"rank {r['rank']}")
        local = "LOCAL_\nRANK" if narrow else "LOCAL_RANK"
        ax.text(centre, rank_y + rank_h + 0.08, f"RANK={r['rank']}\n{local}={r['local_rank']}",
                ha="center", va="top", fontsize=SMALL)
        draw_arrow(ax, (centre, rank_y + rank_h + env_h), (centre, store_y),
                   color=device_color(r["rank"]), width=1.5, head=10)
    ax.text(margin, store_y + store_h + 0.15, note, fontsize=SMALL, va="top")
    return fig
