"""What DistributedDataParallel puts around your module, read off real DDP runs and drawn.

`ddp_wrapper_facts` wraps a fresh module in DDP (a process group must exist) and records what
the picture shows: the wrapper's and the module's class, the state-dict keys (each carries the
wrapper's `module.` prefix), the reducer's count of parameter tensors (it hooks each one's
gradient), the buckets its all-reduces carried in a step that uses every parameter (a
communication hook sees each bucket's parameters), and, for a step that leaves some out, the
parameters the reducer itself names in the error it raises at the next forward.
`plot_ddp_wrapper` draws them, one key a row, for a phone's column.
"""
import re

from ...schematics import SCHEMATIC_FONT as FONT
from ...schematics import device_color, diagram

__all__ = ["ddp_wrapper_facts", "plot_ddp_wrapper"]

UNUSED_COLOR = "#D55E00"      # Okabe-Ito vermillion: what breaks
PREFIX_COLOR = "#0072B2"      # the wrapper's key prefix
MISSED = re.compile(r"did not receive grad for rank \d+: ([\d ]+)")


def ddp_wrapper_facts(make, step, partial_step, **ddp_kwargs):
    """dict(wrapper, module, keys, params, hooks, bucket_cap, grad_bytes, buckets, unused, error)
    from two DDP runs of fresh `make()` modules: `step(model)` runs a forward and backward that
    use every parameter, `partial_step(model)` one that leaves some out (it runs twice: DDP
    raises at the second forward). hooks, bucket_cap, grad_bytes: the reducer's logged count of
    parameter tensors, bucket cap and gradient bytes; buckets: the parameter names of each
    bucket in the second step (DDP's buckets from then on), in bucket order; unused: the names
    the reducer's error gives; error: that error's first sentence. ddp_kwargs go to both DDP
    wrappers (bucket_cap_mb=...)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(make(), **ddp_kwargs)
    names = {id(p): n for n, p in model.named_parameters()}
    buckets = {}

    def recording_hook(state, bucket):
        buckets[bucket.index()] = [names[id(p)] for p in bucket.parameters()]
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(None, recording_hook)
    step(model)
    buckets.clear()
    step(model)         # DDP rebuilds its buckets in the order the first backward gave
    params = [n for n, p in model.named_parameters() if p.requires_grad]
    logged = model._get_ddp_logging_data()          # the reducer's own account
    facts = dict(wrapper=type(model).__name__, module=type(model.module).__name__,
                 keys=list(model.state_dict()), params=params,
                 hooks=logged["num_parameter_tensors"], bucket_cap=logged["bucket_cap_bytes"],
                 grad_bytes=logged["total_parameter_size_bytes"],
                 buckets=[buckets[i] for i in sorted(buckets)])
    broken = DDP(make(), **ddp_kwargs)
    partial_step(broken)
    try:
        partial_step(broken)
    except RuntimeError as e:
        found = MISSED.search(str(e))
        if found is None:
            raise RuntimeError("DDP's error names no parameter index: cannot draw which "
                               "parameters broke the reducer") from e
        order = [n for n, p in broken.named_parameters() if p.requires_grad]
        facts.update(unused=[order[int(i)] for i in found.group(1).split()],
                     error=str(e).split(". ")[0])
    else:
        raise RuntimeError("the partial step ran twice without DDP's error: does it leave a "
                           "parameter out?")
    return facts


def plot_ddp_wrapper(facts, when="aux=False"):
    """The wrapper around the module: each state-dict key a row (the wrapper's prefix in blue),
    a hook on each parameter feeding its bucket's all-reduce, and in vermillion the parameters
    a step with `when` leaves without a gradient, their bucket never ready and the reducer's
    error. Returns the figure."""
    import textwrap
    keys, params = facts["keys"], set(facts["params"])
    prefix = keys[0].split(".")[0] + "."
    if not all(k.startswith(prefix) for k in keys):
        raise ValueError(f"not every key starts with {prefix!r}: is the model wrapped?")
    bucket_of = {n: b for b, names in enumerate(facts["buckets"]) for n in names}
    unused, row, top = set(facts["unused"]), 0.36, 1.15
    char = (FONT - 2) * 0.6 / 72                  # a monospace character's width, inches
    x_hook = 0.3 + max(char * len(k) + (0.1 if k in params else 0.75) for k in keys)
    x_bucket, width = x_hook + 0.65, x_hook + 1.85
    note = textwrap.fill(f"{when}: {len(unused)} parameters get no gradient, so their bucket "
                         f"is never ready; the next forward stops: \u201c"
                         f"{_short(facts['error'])}\u201d", 44)
    height = top + row * len(keys) + 0.45 + 0.2 * (note.count("\n") + 1)
    fig, axes = diagram(1, 1, width=width, height=height)
    ax = axes[0, 0]
    ax.set(xlim=(0, width), ylim=(height, 0))
    fig.subplots_adjust(0, 0, 1, 1)
    mono = dict(family="monospace", fontsize=FONT - 2, va="center")
    ax.add_patch(_frame((0.05, 0.05), width - 0.1, height - 0.1, "0.35"))
    ax.text(0.2, 0.32, f"{facts['wrapper']} (the wrapper)", fontsize=FONT - 1, va="center")
    ax.add_patch(_frame((0.15, 0.62), x_hook - 0.15, row * len(keys) + 0.62, "0.6"))
    ax.text(0.3, 0.86, f".{prefix[:-1]}: your {facts['module']}", fontsize=FONT - 1,
            va="center")
    ys = {k: top + row * (i + 0.5) for i, k in enumerate(keys)}
    for k, y in ys.items():
        ax.text(0.3, y, prefix, color=PREFIX_COLOR, weight="bold", **mono)
        ax.text(0.3 + char * len(prefix), y, k[len(prefix):],
                color=UNUSED_COLOR if k in unused else "black", **mono)
        if k not in params:
            ax.text(x_hook - 0.1, y, "buffer", fontsize=FONT - 2, color="0.4", ha="right",
                    va="center")
    for b, names in enumerate(facts["buckets"]):
        y0, y1 = min(ys[n] for n in names) - row / 2, max(ys[n] for n in names) + row / 2
        ax.add_patch(_frame((x_bucket, y0), 1.05, y1 - y0, device_color(b), fill=True))
        label = f"bucket {b}" + (f"\nall-reduce\nonce all\n{len(names)} are in"
                                 if len(names) >= 4 else "")
        ax.text(x_bucket + 0.52, (y0 + y1) / 2, label, ha="center", va="center",
                fontsize=FONT - 2, color="white")
    for k in params:
        color = UNUSED_COLOR if k in unused else device_color(bucket_of[k])
        ax.plot([x_hook], [ys[k]], "o", color=color, ms=7)
        ax.annotate("", xy=(x_bucket, ys[k]), xytext=(x_hook + 0.06, ys[k]), arrowprops=dict(
            arrowstyle="-|>", color=color, lw=1.5, ls="--" if k in unused else "-"))
        if k in unused:
            ax.text((x_hook + x_bucket) / 2, ys[k] - 0.02, "x", color=UNUSED_COLOR,
                    fontsize=FONT, weight="bold", ha="center", va="center",
                    bbox=dict(facecolor="white", edgecolor="none", pad=0.5))
    first = min(ys[k] for k in params)
    ax.text(x_hook + 0.15, first - 0.3, f"{facts['hooks']} hooks, one\nper parameter",
            fontsize=FONT - 2, va="bottom")
    ax.text(0.2, top + row * len(keys) + 0.3, note, fontsize=FONT - 2, color=UNUSED_COLOR,
            va="top")
    return fig


def _frame(xy, w, h, color, fill=False):
    from matplotlib.patches import FancyBboxPatch
    return FancyBboxPatch(xy, w, h, boxstyle="round,pad=0,rounding_size=0.08", lw=1.5,
                          edgecolor=color, facecolor=color if fill else "none")


def _short(sentence, words=9):
    """The sentence's first `words` words, with an ellipsis if cut."""
    cut = sentence.split()
    return " ".join(cut[:words]) + (" ..." if len(cut) > words else "")
