"""The scaling chapter's figures (helpers/data_parallel/schematics/scaling_schematics.py) keep to
their data: the fit is drawn over the measured sizes only, the legends cover no line, and the symlog
axis of the exposed time shows no negative range."""
import matplotlib
import pytest

import helpers

matplotlib.use("Agg")


@pytest.fixture
def plt():
    import matplotlib.pyplot as plt
    yield plt
    plt.close("all")


def test_the_fit_is_drawn_over_the_measured_sizes_only(plt):
    n_bytes = [256, 4096, 65536, 4 * 2**20]
    secs = [1e-4, 1.1e-4, 3e-4, 4e-3]
    fig, ax = plt.subplots()
    helpers.plot_alpha_beta_fit(ax, n_bytes, secs, 1e-4, 1e9, "gloo", "tab:blue")
    lines = [ln for ln in ax.get_lines() if ln.get_linestyle() != "None"]
    assert len(lines) == 3, "the fit and its two terms"
    for line in lines:
        xs = line.get_xdata()
        assert min(xs) == pytest.approx(min(n_bytes)) and max(xs) == pytest.approx(max(n_bytes)), \
            f"{line.get_label()} runs from {min(xs):g} to {max(xs):g} bytes, past the data"


def _overlaps(a, b):
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_the_scaling_legends_sit_off_the_panels(plt):
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.4))
    ks = [1, 2, 4]
    helpers.plot_scaling(axes, ks, strong={"fast": [1, 1.9, 3.5], "reference": [1, 1.2, 1.1]},
                         weak={"fast": [1, 0.9, 0.8], "reference": [1, 0.5, 0.3]})
    fig.tight_layout()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in axes:
        legend = ax.get_legend()
        assert legend is not None
        assert "ideal" in [t.get_text() for t in legend.get_texts()]
        assert not _overlaps(legend.get_window_extent(renderer), ax.get_window_extent(renderer)), \
            f"the legend of {ax.get_title()!r} covers the panel (and its ideal line)"


def test_the_exposed_axis_starts_at_zero(plt):
    fig, ax = plt.subplots()
    mb = [0.1, 1.0, 10.0, 100.0]
    helpers.plot_exposed(ax, mb, {8: [2.0, 0.0, 0.1, 0.3], 64: [20.0, 1.0, 2.0, 9.0]},
                         {8: 0.33, 64: 9.5})
    lo, hi = ax.get_ylim()
    assert lo == 0 and hi >= 20.0, f"the y axis runs from {lo} to {hi}"
    assert ax.get_yscale() == "symlog"
    assert len(ax.get_lines()) == 4, "an exposed line and a whole all-reduce line per GPU count"
