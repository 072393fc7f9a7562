"""The profile chapter's breakdown of a step, drawn from its medians: the step to scale, and
every phase apart on a log axis, so that a phase of a tenth of a millisecond shows beside
forward and backward (tests/test_profile_schematics.py)."""

__all__ = ["plot_phases"]

FLOOR_MS = 1e-3   # a phase's median below this is drawn at it (a log axis has no 0)
SETUP_SHADES = ("0.2", "0.5", "0.75", "0.9")


def plot_phases(axes, breakdown, phases):
    """`breakdown`: set-up -> {phase: median seconds}. Left, each set-up's step as stacked
    phases in milliseconds, to scale (what dominates); right, each phase on its own row, one
    bar per set-up, on a log axis (the small phases the text discusses, readable)."""
    import matplotlib.pyplot as plt
    whole, apart = axes
    names = list(breakdown)
    for row, b in enumerate(breakdown.values()):
        left = 0.0
        for j, phase in enumerate(phases):
            ms = b[phase] * 1e3
            whole.barh(row, ms, left=left, color=plt.cm.tab10(j),
                       label=phase if row == 0 else None)
            left += ms
    whole.set(yticks=range(len(names)), yticklabels=names, title="the step, to scale",
              xlabel="ms per step (median of each phase)")
    whole.invert_yaxis()
    whole.legend(ncol=4, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    height = 0.8 / len(names)
    lowest = float("inf")
    for r, (name, b) in enumerate(breakdown.items()):
        ms = [max(b[p] * 1e3, FLOOR_MS) for p in phases]
        ys = [j + (r - (len(names) - 1) / 2) * height for j in range(len(phases))]
        apart.barh(ys, ms, height=height, color=SETUP_SHADES[r % len(SETUP_SHADES)],
                   edgecolor="black", linewidth=0.3, label=name)
        lowest = min([lowest] + ms)
    apart.set_xscale("log")
    apart.set_xlim(left=lowest / 3)   # the smallest bar a third of a decade long
    apart.set(yticks=range(len(phases)), yticklabels=phases, title="each phase apart (log)",
              xlabel="ms per step (median)")
    apart.invert_yaxis()
    apart.grid(alpha=0.3, axis="x", which="both")
    apart.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
