"""The planner's static twin (helpers/composed/planner_page.py): its JavaScript port plans
what helpers.plan plans (the same layouts in the same order, the same memory and seconds) on
dense, MoE, pipeline-only and long-sequence models, run by node; the HTML shows the default
plan without JavaScript, every field of the form, and a table that scrolls sideways."""
import json
import shutil
import subprocess

import pytest

from helpers import PLANNER_FIELDS, plan
from helpers.composed.planner_page import PLANNER_JS, planner_html

GPU = dict(memory=80e9, flops=989e12, bandwidth=450e9, latency=10e-6)
CASES = [
    (dict(layers=32, width=4096, heads=32, vocab=32000, seq=4096, batch=512, experts=0), GPU, 64),
    (dict(layers=80, width=8192, heads=64, vocab=32000, seq=4096, batch=512, experts=0), GPU, 64),
    (dict(layers=24, width=2048, heads=16, vocab=50000, seq=32768, batch=64, experts=8),
     dict(GPU, memory=40e9, bandwidth=50e9, latency=30e-6), 32),
    (dict(layers=12, width=768, heads=12, vocab=50257, seq=1024, batch=48, experts=0),
     dict(GPU, memory=8e9), 6),
]


def _js_plans(cases):
    harness = PLANNER_JS + "\nconst cases = " + json.dumps(cases) + ";\n" + """
const out = cases.map(([M, G, n]) => Planner.plan(M, G, n, 'mixed_adam', 2).slice(0, 25)
  .map(r => [r.dp, r.tp, r.pp, r.cp, r.ep, r.zero, r.acc, r.recompute, r.m, r.memory,
             r.seconds]));
console.log(JSON.stringify(out));"""
    got = subprocess.run(["node", "-e", harness], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


@pytest.mark.skipif(shutil.which("node") is None, reason="node runs the page's JavaScript")
def test_the_javascript_plans_what_python_plans():
    for (model, gpu, n), js in zip(CASES, _js_plans([list(c) for c in CASES])):
        py = plan(model, gpu, n, optimizer="mixed_adam", dtype_bytes=2)[:25]
        assert py, model
        assert len(js) == len(py)
        for a, b in zip(js, py):
            keys = [b[k] for k in ("dp", "tp", "pp", "cp", "ep", "zero", "acc", "recompute", "m")]
            assert a[:9] == keys
            assert a[9] == pytest.approx(b["memory"], rel=1e-12)
            assert a[10] == pytest.approx(b["seconds"], rel=1e-12)


def test_the_page_shows_the_default_plan_and_every_field():
    page = planner_html()
    for name, label, _, _ in PLANNER_FIELDS:
        assert f'data-field="{name}"' in page and label in page
    rows = plan(CASES[0][0], GPU, 64, optimizer="mixed_adam", dtype_bytes=2)
    assert f"{len(rows)} layouts fit" in page
    first = rows[0]
    assert f"<td>{first['zero']}</td><td>{first['acc']}</td>" in page
    assert 'overflow-x:auto' in page and "<table>" in page


def test_a_plan_with_no_layout_says_what_to_try():
    """Three GPUs for the default model: no layout (a bare '0 layouts fit; the 0 fastest' was a
    dead end); the script's spec carries the same sentence for the page's own replans."""
    from helpers.composed.planner_page import NO_FIT
    page = planner_html(dict(gpus=3))
    assert "0 layouts fit" not in page and NO_FIT in page
    assert page.count(json.dumps(NO_FIT)[1:-1]) >= 2      # the status and the page's spec
