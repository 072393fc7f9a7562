"""book/gpus.ipynb's synchronised-timing lesson on a GPU: the product it times must take far
longer to run than to queue, on any GPU and in quick mode too. The first GPU run (one H200,
COURSE_QUICK=1) timed a 256x256 product twice: launching it cost more than running it, and the
unsynchronised reading came out LARGER (68 us against 28 us), failing the chapter's claim."""
import json
import statistics
import time

import torch
from book_files import ROOT

import helpers

FASTEST_FLOPS = 1e15   # FLOP/s: beyond any GPU's float32 matrix product today (an H200: ~5e13)
LAUNCH_S = 5e-6        # a kernel launch from Python, about
QUEUE_DEPTH = 1000     # CUDA's launch queue holds about 1,024 kernels; beyond it the host waits


def _cell(source_start):
    nb = json.loads((ROOT / "book" / "gpus.ipynb").read_text())
    got = [c for c in nb["cells"] if c["cell_type"] == "code"
           and "".join(c["source"]).startswith(source_start)]
    assert len(got) == 1, f"one cell starting {source_start!r}"
    return "".join(got[0]["source"])


def test_the_gpu_times_a_product_that_outlasts_its_launch(monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)   # as on the GPU machine
    monkeypatch.setattr(helpers, "num_gpus", lambda: 1, raising=False)
    ns = dict(helpers=helpers, torch=torch, time=time, statistics=statistics)
    exec(_cell("sizes = helpers.choose("), ns)
    gpu_branch = _cell("if torch.cuda.is_available():").split("else:")[0]
    work = ns.get("gpu_work") or dict(ns["sizes"], rounds=1)   # before: the CPU's quick size
    product_s = 2 * work["n"] ** 3 / FASTEST_FLOPS
    assert product_s >= 20 * LAUNCH_S, (
        f"a {work['n']}x{work['n']} product lasts {product_s * 1e6:.2f} us on the fastest GPU: "
        "launching it would cost as much as running it")
    assert 2 <= work["reps"] <= QUEUE_DEPTH, "several products, fewer than the launch queue holds"
    assert work["rounds"] >= 3, "rounds give the spread the verdict rests on"
    assert "gpu_work" in gpu_branch and "sizes[" not in gpu_branch, \
        "the GPU branch times its own workload, not the CPU's (quick) size"


def test_the_claim_rests_on_every_round():
    claim = _cell("#@title Bookkeeping for the text below (double-click to see the code)\n"
                  "if torch.cuda.is_available():\n    helpers.claim(verdict")
    assert 'verdict == "too small"' in claim
    branch = _cell("# the note the text quotes")
    assert "helpers.unsynced_timing_words(wrong_s, right_s)" in branch, \
        "the GPU branch's verdict comes from the tested words, on every round's readings"
    # every round decides: one round that overlaps the other side's makes it "cannot tell"
    words = helpers.unsynced_timing_words
    assert words([1e-4, 2e-4, 3e-4], [4e-4, 5e-4, 6e-4])[0] == "too small"
    assert words([7e-4, 8e-4, 9e-4], [4e-4, 5e-4, 6e-4])[0] == "too large"
    assert words([1e-4, 2e-4, 5e-4], [4e-4, 5e-4, 6e-4])[0] == "cannot tell"
    assert words([7e-4, 8e-4, 3e-4], [4e-4, 5e-4, 6e-4])[0] == "cannot tell"
