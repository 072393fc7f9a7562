"""The profile chapter's breakdown (helpers/data_parallel/schematics/profile_schematics.py) shows
every phase: the step to scale, and each phase apart on a log axis where none is a sliver."""
import matplotlib
import pytest

import helpers

matplotlib.use("Agg")

PHASES = ["data", "copy", "forward", "backward", "allreduce", "sgd", "sync"]
# medians (s) like the chapter's: forward and backward hundreds of times the rest
BREAKDOWN = {"1 device": dict(data=4.9e-3, copy=1e-4, forward=54.8e-3, backward=97.8e-3,
                              allreduce=1e-4, sgd=4e-4, sync=1e-4),
             "2 devices": dict(data=1.6e-3, copy=1e-4, forward=47.9e-3, backward=90.5e-3,
                               allreduce=2e-4, sgd=7e-4, sync=0.0)}


@pytest.fixture
def drawn():
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3))
    helpers.plot_phases(axes, BREAKDOWN, PHASES)
    fig.canvas.draw()
    yield fig, axes
    plt.close(fig)


def test_the_whole_step_is_drawn_to_scale(drawn):
    _, (whole, _) = drawn
    for row, b in enumerate(BREAKDOWN.values()):
        bars = [p for p in whole.patches if abs(p.get_y() + p.get_height() / 2 - row) < 1e-9]
        assert len(bars) == len(PHASES)
        assert sum(p.get_width() for p in bars) == pytest.approx(sum(b.values()) * 1e3)


def test_no_phase_is_a_sliver_on_the_log_panel(drawn):
    fig, (_, apart) = drawn
    renderer = fig.canvas.get_renderer()
    axis_px = apart.get_window_extent(renderer).width
    bars = apart.patches
    assert len(bars) == len(PHASES) * len(BREAKDOWN), "one bar per phase and set-up"
    for bar in bars:
        px = bar.get_window_extent(renderer).width
        assert px >= 0.05 * axis_px, f"a bar of {bar.get_width():g} ms is {px:.1f} px wide"
    assert [t.get_text() for t in apart.get_yticklabels()] == PHASES
