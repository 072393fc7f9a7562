"""DDP's buckets over the backward, drawn from the code that forms and launches them.

`bucket_timeline` runs one backward of a model and records the order in which autograd hands
out the gradients (the hook DDPFromScratch uses), groups the parameters with `make_buckets` and
lays the step out on a model clock: the backward's time shared out by the parameters' sizes,
each bucket's all-reduce launched once all its gradients are ready and the buckets before it
have gone (DDPFromScratch's rule), one at a time on the link, alpha + bytes/beta each. The last
bucket holds the first layers' gradients: it is ready only when the backward ends, so its
all-reduce is always exposed. `plot_buckets` draws it.

`plot_data_parallel_steps` draws Part I's data-parallel steps (step 0 included) from the numbers
the chapter computed: each device's shard, its local gradient, the sum on device 0, the
broadcast, the update.
"""
from ...schematics import LABEL_FONT as SMALL
from ...schematics import SCHEMATIC_FONT as FONT
from ...schematics import SCHEMATIC_WIDTH, device_color, diagram, draw_box
from ..scratch import make_buckets

__all__ = ["bucket_timeline", "plot_buckets", "plot_data_parallel_steps"]


def _ready_order(model, inputs):
    """Indices (in parameters() order) of the trainable parameters, in the order one backward
    of model(*inputs).sum() accumulates their gradients."""
    params = [p for p in model.parameters() if p.requires_grad]
    index = {id(p): i for i, p in enumerate(params)}
    order, hooks = [], [p.register_post_accumulate_grad_hook(
        lambda p: order.append(index[id(p)])) for p in params]
    try:
        model(*inputs).float().sum().backward()
    finally:
        for h in hooks:
            h.remove()
        for p in params:
            p.grad = None
    return order


def bucket_timeline(model, inputs, bucket_mb=None, allreduce=0.6, latency=0.04):
    """One step of DDP's overlap on a model clock where the backward takes 1: returns
    dict(ready: {parameter index: when its gradient is ready}, buckets: [dict(params, bytes,
    complete, start, end)] in launch order, backward: 1.0, exposed: the all-reduce time left
    after the backward ends). An all-reduce of the whole gradient takes `allreduce` plus
    `latency` per bucket."""
    params = [p for p in model.parameters() if p.requires_grad]
    order = _ready_order(model, inputs)
    total = sum(p.numel() for p in params)
    ready, t = {}, 0.0
    for i in order:                       # the backward's time, shared out by size
        t += params[i].numel() / total
        ready[i] = t
    index = {id(p): i for i, p in enumerate(params)}
    buckets, free = [], 0.0
    for bucket in make_buckets(params, bucket_mb):
        idx = [index[id(p)] for p in bucket]
        size = sum(params[i].numel() for i in idx)
        complete = max(ready[i] for i in idx)
        start = max(complete, free)       # in bucket order, one at a time on the link
        free = start + latency + allreduce * size / total
        buckets.append(dict(params=idx, bytes=size * params[idx[0]].element_size(),
                            complete=complete, start=start, end=free))
    return dict(ready=ready, buckets=buckets, backward=t, exposed=max(0.0, free - t))


def plot_buckets(timeline, title=None):
    """The backward as one bar, a tick where each gradient is ready (coloured by its bucket),
    and below it each bucket's all-reduce; the part after the backward's end is exposed.
    Returns the figure."""
    bs = timeline["buckets"]
    fig, axes = diagram(1, 1, width=SCHEMATIC_WIDTH, height=1.9 + 0.45 * len(bs))
    ax = axes[0, 0]
    end = max(b["end"] for b in bs)
    ax.set(xlim=(-0.3 * end, end * 1.02), ylim=(len(bs) + 1.6, -0.9))
    if title:
        ax.set_title(title, fontsize=FONT - 1, loc="left")
    bucket_of = {i: n for n, b in enumerate(bs) for i in b["params"]}
    draw_box(ax, 0, 0, timeline["backward"], 0.8, "#DDDDDD", edge="none")
    ax.text(timeline["backward"] / 2, -0.1, "backward", ha="center", va="bottom",
            fontsize=SMALL)             # above the bar: the ticks cross it
    ax.text(-0.02 * end, 0.4, "gradients", ha="right", va="center", fontsize=SMALL)
    # latest first, so that where two gradients are ready at almost the same instant (a bias
    # right after its weight) the earlier tick lies on top: a bucket's own last tick, where its
    # all-reduce bar starts, is not hidden under the next bucket's first one
    for i, t in sorted(timeline["ready"].items(), key=lambda it: -it[1]):
        ax.plot([t, t], [0.0, 0.8], color=device_color(bucket_of[i]), lw=3)
    for n, b in enumerate(bs):
        y = 1.2 + n * 0.9
        ax.text(-0.02 * end, y + 0.35, f"bucket {n}", ha="right", va="center",
                fontsize=SMALL)
        draw_box(ax, b["start"], y, b["end"] - b["start"], 0.7, device_color(n), edge="none")
    ax.plot([timeline["backward"]] * 2, [-0.9, len(bs) + 1.3], color="black", ls="--", lw=1.2)
    ax.annotate("", xy=(end, len(bs) + 1.2), xytext=(timeline["backward"], len(bs) + 1.2),
                arrowprops=dict(arrowstyle="<->", color="black", lw=1.5))
    ax.text((end + timeline["backward"]) / 2, len(bs) + 1.45, "exposed", ha="center",
            va="top", fontsize=SMALL)
    ax.text(timeline["backward"] / 2, len(bs) + 1.45, "hidden behind\nthe backward",
            ha="center", va="top", fontsize=SMALL, color="0.3")
    fig.tight_layout()
    return fig


def plot_data_parallel_steps(X_shards, y_shards, local, summed, replicas, start=None):
    """One column per step (split, local gradient, aggregate, broadcast, update), one row per
    device, each box the numbers of a linear model's (w, b) at that step: `local` and `summed`
    are [grad w, grad b], `replicas` each device's updated [w, b]. With `start` (the initial
    [w, b]) a first column shows step 0, the broadcast that makes every replica start equal.
    The arrows from device 0's sum end at the edge of the boxes they reach. Returns the
    figure."""
    def grad(g):
        return "∇w " + ", ".join(f"{v:.1f}" for v in g[0].tolist()) + f"\n∇b {g[1].item():.1f}"

    def shard(Xs, ys):
        return f"{Xs.shape[0]} examples\ny = {', '.join(f'{v:g}' for v in ys.tolist())}"

    def params(W):
        return f"w {', '.join(f'{v:.3f}' for v in W[0].tolist())}\nb {W[1].item():.3f}"

    steps = ["1 split", "2 local gradient", "3 aggregate", "4 broadcast", "5 update"]
    k = len(replicas)
    cells = [[shard(Xs, ys) for Xs, ys in zip(X_shards, y_shards, strict=True)],
             [grad(g) for g in local],
             [grad(summed) + "\n(sum)"] + ["sends its\ngradient"] * (k - 1),
             [grad(summed)] * k, [params(W) for W in replicas]]
    if start is not None:
        steps, cells = ["0 broadcast\n(once, first)"] + steps, [[params(start)] * k] + cells
    agg = steps.index("3 aggregate")
    fig, axes = diagram(width=10 + 1.6 * (start is not None), height=1.2 + 1.3 * k)
    ax = axes[0, 0]
    boxes = {}
    for c, (step, column) in enumerate(zip(steps, cells, strict=True)):
        ax.text(c, -0.8, step, ha="center", fontweight="bold")
        for r, text in enumerate(column):
            colour = "tab:green" if c == agg and r == 0 else "0.92"
            boxes[c, r] = ax.text(c, r, text, ha="center", va="center", fontsize=9,
                                  bbox=dict(boxstyle="round", fc=colour, alpha=0.6))
            if c < len(steps) - 1:
                ax.annotate("", (c + 0.62, r), (c + 0.38, r), arrowprops=dict(arrowstyle="->"))
    for r in range(k):
        ax.text(-0.55, r, f"device {r}", ha="right", va="center", fontsize=10)
    ax.set(xlim=(-1.1, len(steps) - 0.4), ylim=(k - 0.4, -1.1))
    fig.canvas.draw()   # the boxes' sizes, for the arrows' ends
    to_data = ax.transData.inverted()

    def edge(c, r):
        """(left, top, bottom) of box (c, r), in data coordinates."""
        (x0, y0), (_, y1) = to_data.transform(
            boxes[c, r].get_bbox_patch().get_window_extent().get_points())
        return x0, min(y0, y1), max(y0, y1)

    _, _, sum_bottom = edge(agg, 0)
    for r in range(1, k):   # the gradients travel to device 0 and back
        ax.annotate("", (agg, sum_bottom), (agg - 0.4, r - 0.1),
                    arrowprops=dict(arrowstyle="->", color="tab:red", shrinkA=0, shrinkB=0))
        left, top, bottom = edge(agg + 1, r)   # into its left edge, above the black arrow
        ax.annotate("", (left, top + 0.3 * (bottom - top)), (agg + 0.35, sum_bottom),
                    arrowprops=dict(arrowstyle="->", color="tab:blue", shrinkA=0, shrinkB=0))
    return fig
