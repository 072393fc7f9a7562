"""The cost explorer of book/part1/costs.ipynb: its static twin (helpers/cost_explorer.py) holds
split_costs' numbers for every setting of the widget's discrete controls, mirrors the widget's
controls, and is what the stored notebook shows on the page. Moving its controls in a browser:
tests/browser/test_cost_explorer_page.py."""
import json
import re

import ipywidgets as widgets
import nbformat
import pytest
from book_files import ROOT
from torch import nn

import helpers
from helpers.cost_explorer import cost_grid

MLP = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                    nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
SIZES = {"LeNet": helpers.layer_sizes(helpers.lenet_module(), (1, 28, 28)),
         "MLP": helpers.layer_sizes(MLP, (1, 28, 28))}   # both deep enough for k = 8


def _explorer(**change):
    controls = dict(model=list(SIZES), k=widgets.IntSlider(value=4, min=1, max=8),
                    batch_size=widgets.SelectionSlider(options=[16, 64, 256], value=64),
                    bandwidth_gbs=widgets.FloatLogSlider(value=16, base=10, min=0, max=3,
                                                         step=0.1),
                    latency_us=widgets.FloatLogSlider(value=10, base=10, min=0, max=3,
                                                      step=0.1),
                    optimizer=list(helpers.OPTIMIZER_STATE_BYTES))
    controls.update(change)
    return widgets.interactive(lambda **kw: None, **controls)


def _grid_of(html):
    data = re.search(r'<script type="application/json">(.*?)</script>', html, re.S).group(1)
    return json.loads(data.replace("<\\/", "</"))


def test_the_grid_is_split_costs_at_every_setting():
    grid = cost_grid(SIZES, range(1, 9), [16, 64, 256], list(helpers.OPTIMIZER_STATE_BYTES))
    ax, S, P = grid["axes"], len(grid["splits"]), len(grid["parts"])
    checked = 0
    for model, flat in grid["values"].items():
        for ki, k in enumerate(ax["k"]):
            for bi, n in enumerate(ax["batch_size"]):
                for oi, opt in enumerate(ax["optimizer"]):
                    want = helpers.split_costs(SIZES[model], k, n, 1.0, optimizer=opt, zero=True)
                    i = ((ki * len(ax["batch_size"]) + bi) * len(ax["optimizer"]) + oi) * S * P
                    for s, split in enumerate(grid["splits"]):
                        got = flat[i + s * P:i + (s + 1) * P]
                        assert got == [round(want[split][p]) for p in grid["parts"]], \
                            (model, k, n, opt, split)
                        checked += 1
    assert checked == 2 * 8 * 3 * 4 * len(grid["splits"])


def test_the_twin_mirrors_the_widget_and_shows_its_default():
    explorer = _explorer()
    bundle = helpers.with_static_twin(explorer, SIZES)._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle, "a live kernel shows the widget"
    html = bundle["text/html"]
    specs = _grid_of(html)["specs"]
    assert specs["k"]["values"] == list(range(1, 9)) and specs["k"]["value"] == 4
    assert specs["batch_size"]["values"] == [16, 64, 256] and specs["batch_size"]["value"] == 64
    assert specs["model"]["values"] == list(SIZES)
    assert specs["bandwidth_gbs"] == dict(kind="log", value=16.0, base=10.0, min=0.0, max=3.0,
                                          step=0.1, exponent=pytest.approx(1.2041, abs=1e-4))
    assert 'class="ce-controls" hidden' in html, "no control before its script runs"
    again = helpers.with_static_twin(_explorer(), SIZES)._repr_mimebundle_()["text/html"]
    assert again == html, "the same explorer must store the same HTML (no diff per run)"
    want = helpers.split_costs(SIZES["LeNet"], 4, 64, 16.0, optimizer="sgd", latency_us=10.0,
                               zero=True)
    cells = re.findall(r'<th scope="row">([^<]+)</th><td>([^<]+)</td><td>([^<]+)</td>'
                       r"<td>([^<]+)</td><td>([^<]+)</td>", html)
    assert [c[0] for c in cells] == list(want)
    for split, sent, memory, messages, ms in cells:
        d = want[split]
        assert float(sent) == pytest.approx(d["sent"] / 1e6, abs=0.005)      # shown as .2f
        assert float(memory) == pytest.approx(d["memory"] / 1e6, abs=0.05)   # .1f
        assert int(messages) == d["messages"]
        assert float(ms) == pytest.approx(1e3 * d["seconds"], abs=0.005)


def test_the_twin_refuses_an_explorer_it_cannot_look_up():
    with pytest.raises(ValueError, match="controls"):
        helpers.with_static_twin(widgets.interactive(lambda model, k: None, model=list(SIZES),
                                                     k=(1, 8)), SIZES)
    with pytest.raises(ValueError, match="models"):
        helpers.with_static_twin(_explorer(model=["LeNet"]), SIZES)


def test_the_stored_page_shows_the_twin_without_the_widget_manager():
    path = ROOT / "book" / "part1" / "costs.ipynb"
    nb = nbformat.read(path, as_version=4)
    twins = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
             if "cost-explorer" in o.get("data", {}).get("text/html", "")]
    assert len(twins) == 1, "the explorer cell's stored output carries its twin (make outputs)"
    assert "application/vnd.jupyter.widget-view+json" in twins[0]["data"]
    assert "widgets" not in nb.metadata, \
        "widget state stored: the page would load the widget manager for a widget it never shows"
    grid = _grid_of("".join(twins[0]["data"]["text/html"]))
    assert grid["axes"]["model"] == ["LeNet", "ResNet-18"]
