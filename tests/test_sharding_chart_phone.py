"""Part V's chart of the bytes each ZeRO stage held and sent (helpers.plot_memory_per_stage) reads
on a phone, shows every stage and world size, and is the one fsdp_scratch.ipynb draws (its own
two panels side by side, 11 inches wide, showed its legend at 3.5 CSS px on a phone)."""
import json
from pathlib import Path

import matplotlib
import pytest

import helpers
from helpers.schematics import phone_text_px
from helpers.sharding.results import StageMemory

matplotlib.use("Agg")
PHONE_FLOOR = 10.0      # CSS px, as tests/test_schematics_phone.py
N_PARAMS = 450_000
WORLDS = (1, 2, 4)


def _measured():
    """{world: [rank 0's memory_per_stage result]}, the cost model's bytes (ZeRO-1 sends 1.5
    times, as our ShardedOptimizer over DDP does)."""
    out = {}
    for world in WORLDS:
        stages = {}
        for s in helpers.SHARDING_STAGES:
            c = helpers.sharding_costs(N_PARAMS, world, s)
            stages[s] = StageMemory(N_PARAMS, c["params_bytes"], c["grads_bytes"],
                                    c["optim_bytes"], c["sent_bytes"] * (1.5 if s == "zero1"
                                                                         else 1),
                                    {}, 0, c["total_bytes"], None)
        out[world] = [{"memory": stages}]
    return out


@pytest.fixture
def chart():
    import matplotlib.pyplot as plt
    fig = helpers.plot_memory_per_stage(_measured(), N_PARAMS)
    yield fig
    plt.close(fig)


def test_the_chart_reads_on_a_phone(chart):
    px, text = phone_text_px(chart)
    assert px >= PHONE_FLOOR, f"{text!r} is {px:.1f} CSS px on a phone"


def test_the_chart_stacks_its_panels_and_names_what_it_shows(chart):
    held, sent = chart.axes
    assert held.get_position().y0 > sent.get_position().y1    # one above the other
    for ax in (held, sent):
        assert [t.get_text() for t in ax.get_xticklabels()] == list(helpers.SHARDING_STAGES)
    legends = [t.get_text() for ax in chart.axes if ax.get_legend()
               for t in ax.get_legend().get_texts()]
    assert legends == ["params", "grads", "optimizer", "1 rank", "2 ranks", "4 ranks", "model"]
    # one bar per stage and world, three parts each on the left; the model's tick on each
    assert len(held.patches) == 3 * len(WORLDS) * len(helpers.SHARDING_STAGES)
    assert len(sent.patches) == len(WORLDS) * len(helpers.SHARDING_STAGES)
    tops = sorted(round(y, 6) for line in held.lines for y in line.get_ydata())
    assert tops == sorted(round(helpers.sharding_costs(N_PARAMS, w, s)["total_bytes"] / 1e6, 6)
                          for w in WORLDS for s in helpers.SHARDING_STAGES)


def test_fsdp_scratch_draws_this_chart():
    nb = Path(__file__).resolve().parent.parent / "book" / "part5" / "fsdp_scratch.ipynb"
    code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"]
                     if c["cell_type"] == "code")
    assert "helpers.plot_memory_per_stage(measured, n_params)" in code
    assert "plt.subplots(1, 2" not in code, "fsdp_scratch draws its own side-by-side panels"
