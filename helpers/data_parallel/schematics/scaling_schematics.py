"""The scaling chapter's figures, drawn from its numbers: the measured scaling beside its ideal
lines, the alpha-beta fit over the sizes it was fitted on, and the exposed all-reduce of the
bucket model (tests/test_scaling_schematics.py holds each figure to its data)."""
import math

__all__ = ["plot_scaling", "plot_alpha_beta_fit", "plot_exposed"]

COLORS = {"fast": "tab:blue", "reference": "tab:orange"}


def log_points(lo, hi, num=50):
    """`num` points evenly spaced on a log scale from `lo` to `hi`, both included."""
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (num - 1)) for i in range(num)]


def _legend_below(ax, ncol=3):
    """A legend under the axes, where it covers no line (the ideal lines run corner to corner
    and along the top, where 'best' would put it)."""
    ax.legend(fontsize=7, ncol=ncol, loc="upper center", bbox_to_anchor=(0.5, -0.25))


def plot_scaling(axes, ks, strong, weak):
    """Strong scaling (speed-up over one worker, ideal k) and weak scaling (efficiency, ideal
    1) against the worker counts `ks`; `strong` and `weak` map a step's name to one value per
    k. The legends sit under the panels, off the ideal lines."""
    for mode, values in strong.items():
        axes[0].plot(ks, values, "o-", color=COLORS.get(mode), label=mode)
    for mode, values in weak.items():
        axes[1].plot(ks, values, "o-", color=COLORS.get(mode), label=mode)
    axes[0].plot(ks, ks, ":", color="gray", label="ideal")
    axes[1].plot(ks, [1] * len(ks), ":", color="gray", label="ideal")
    axes[0].set(xlabel="workers", ylabel="speed-up over 1 worker",
                title="Strong scaling: batch 256", xticks=ks)
    axes[1].set(xlabel="workers", ylabel="efficiency (1 = ideal)",
                title="Weak scaling: 64 per worker", xticks=ks)
    for ax in axes:   # ks stops at the cores: no worker shares one
        ax.set_xlim(0.5, ks[-1] + 0.5)
        ax.grid(alpha=0.3)
        _legend_below(ax)


def plot_alpha_beta_fit(ax, n_bytes, secs, alpha, beta, label, color):
    """Measured seconds (as µs) against bytes, and the fit α + n/β with its latency and
    bandwidth terms, drawn over the measured sizes only: beyond them the fit is a guess."""
    xs = log_points(min(n_bytes), max(n_bytes))
    ax.loglog(n_bytes, [t * 1e6 for t in secs], "o", color=color, label=f"{label}, measured")
    ax.loglog(xs, [(alpha + x / beta) * 1e6 for x in xs], "-", color=color,
              label="α + n/β fit")
    ax.loglog(xs, [alpha * 1e6] * len(xs), ":", color=color, label="latency term α")
    ax.loglog(xs, [x / beta * 1e6 for x in xs], "--", color=color,
              label="bandwidth term n/β")


def plot_exposed(ax, bucket_mb, exposed_ms, whole_ms):
    """Milliseconds of all-reduce left after backward against the bucket size (MB), one line
    per GPU count (`exposed_ms`: k -> values), each with a dotted line at its whole all-reduce
    (`whole_ms`: k -> ms). The y axis is symlog from 0: no time is negative."""
    for k, values in exposed_ms.items():
        (line,) = ax.plot(bucket_mb, values, "o-", label=f"{k} GPUs: exposed")
        ax.axhline(whole_ms[k], ls=":", color=line.get_color(),
                   label=f"{k} GPUs: whole all-reduce, no overlap")
    ax.set(xscale="log", yscale="symlog", xlabel="bucket size (MB)",
           ylabel="ms after backward",
           title="ResNet-18: all-reduce left after backward (model)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
