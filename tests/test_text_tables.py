"""book/_ext/text_tables.py: which text outputs keep their alignment (scroll sideways on a phone
instead of wrapping). The examples are outputs of the book's that were found wrapped at 390 px
(a phone's width), and outputs that must keep wrapping (one long line, plain sentences)."""
import importlib.util
import re

import pytest
from book_files import ROOT


def _load():
    spec = importlib.util.spec_from_file_location("text_tables",
                                                  ROOT / "book" / "_ext" / "text_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


text_tables = _load()

ALIGNED = {
    # fixes: right-aligned labels (leading spaces, then single-space gaps)
    "fixes, eager and compiled": (
        "          plain, eager: 85.9 ms (83.1-91.1, 41 samples); against plain, eager: 1.00x\n"
        "    lenet_fused, eager: 103 ms (99.3-108, 41 samples); against plain, eager: 0.84x\n"
        "       plain, compiled: 56.9 ms (54.7-63, 41 samples); against plain, eager: 1.49x\n"
        " lenet_fused, compiled: 36.4 ms (34-40.9, 41 samples); against plain, eager: 2.33x\n"),
    "fixes, flat buffers": (
        " per parameter: 0.0767 ms (0.0426-0.0975, 20 samples)\n"
        "  flat, packed: 0.26 ms (0.234-0.334, 20 samples)\n"
        "  flat buffers: 0.0445 ms (0.0286-0.072, 20 samples)\n"),
    "fixes, fused step (one label padded)": (
        "    fused step: 101 ms (97.9-105, 30 samples)\n"
        "nn.Module step: 101 ms (98-102, 30 samples)\n"
        "the fused step against the nn.Module step: 1.00x (0.96-1.04, 30 rounds): within noise\n"),
    # printed source (inspect.getsource of a method: indented 4, body 8 and deeper)
    "fixes, index_batches": (
        "    def index_batches(self):\n"
        '        """One epoch: a list of index tensors (on X\'s device)."""\n'
        "        n = self.X.shape[0]\n"
        "        return list(perm.to(self.X.device).split(self.batch_size))\n"),
    "ddp_scratch, _grad_ready": (
        "    def _grad_ready(self, param):\n"
        "        k = self._index[id(param)]\n"
        "        i = self._bucket_of[k]\n"),
    "expert_parallel, a method's lines (8 spaces and deeper)": (
        "        for xg in x.chunk(groups):\n"
        "            logits = self.router(xg)\n"
        "            r = route(logits, self.k,\n"),
    "tensor_parallel_dist, two lines of source": (
        "    mesh = device_mesh((world,), (\"tp\",), device.type)\n"
        "        module = parallelize_module(copy.deepcopy(block), mesh, tp_plan(True, prep))\n"),
    "a top-level function's source": "def f(x):\n    return x + 1\n",
    # reprs
    "syncbn, an nn.Module": (
        "Sequential(\n"
        "  (0): Conv2d(1, 16, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))\n"
        "  (1): BatchNorm2d(16, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)\n"
        "  (2): ReLU()\n"
        ")\n"),
    "mesh2d, the rank grid": (
        "ranks of the mesh (rows: dp index, columns: tp index):\n"
        "tensor([[0, 1],\n"
        "        [2, 3]])\n"
        "tensor-parallel groups: [[0, 1], [2, 3]]\n"
        "data-parallel groups:   [[0, 2], [1, 3]]\n"),
    # profile and scaling: a heading, then indented rows
    "profile, the GPU reference run": (
        "GPU reference run (not this machine): NVIDIA H200 x1, torch 2.11.0+cu130, CUDA 13.0\n"
        "  reference (1 device): 0.456 s/epoch, test acc 0.096\n"
        "  fast (1 device): 0.028 s/epoch, test acc 0.096\n"),
    "zero, a detail under its rank": (
        "rank 0: max |difference to one process| ZeRO-1 1.6e-06, torch ZeRO 1.6e-06\n"
        "        |ZeRO-1 - torch ZeRO| = 0.0e+00\n"),
    # labels padded to a common colon (one gap is enough)
    "gpus, two timers": (
        "torch.utils.benchmark: median 6.91 ms (IQR 0.85 ms, 7 blocks of 10 runs)\n"
        "helpers.measure:       6.14 ms (5.99-7.62, 7 samples)\n"),
    "ddp_scratch, overlap and after": (
        "overlap : backward + finish 30.0 ms (spread 22.0 to 47.1, 7 rounds)\n"
        "after   : backward + finish 27.6 ms (spread 24.3 to 59.8, 7 rounds)\n"),
    "context_parallel, right-aligned": (
        "contiguous: formed [16, 32, 48, 64], kept by the mask [10, 26, 42, 58]\n"
        "    zigzag: formed [40, 40, 40, 40], kept by the mask [34, 34, 34, 34]\n"),
    "padded columns": "name      bytes\nweights   516,272\n",
    "tab-separated columns": "name\tbytes\nweights\t516272\n",
}

WRAPS = {
    "one long line": "Running copy pool (MiB) at reduced size: no GPU, so it is scaled down "
                     "(set COURSE_FULL=1 for the full size): 256\n",
    "one indented line": "    just one line\n",
    "sentences": ("No GPU here: only the CPU's product was timed.\n"
                  "This machine has no GPU, so only the CPU was timed; run the chapter on a GPU "
                  "to see the misleading figure next to the real one.\n"),
    "rows with single spaces": ("device 0: 3 examples, y = [5.0, 2.0, 2.0]\n"
                                "device 1: 3 examples, y = [3.0, 5.0, 4.0]\n"),
    "blank lines and trailing spaces do not count": "first line   \n\n   \nsecond line\n",
}


@pytest.mark.parametrize("name", ALIGNED)
def test_aligned_outputs_keep_their_alignment(name):
    assert text_tables.aligned(ALIGNED[name])


@pytest.mark.parametrize("name", WRAPS)
def test_plain_outputs_wrap(name):
    assert not text_tables.aligned(WRAPS[name])


def test_the_browser_check_uses_the_same_rule():
    """tests/browser/pagefeatures.py repeats the rule in JavaScript (check_text_tables): the same
    patterns, so a wrapped output the extension missed is what it reports."""
    js = (ROOT / "tests" / "browser" / "pagefeatures.py").read_text()
    for name in ("LEADING", "GAP"):
        found = re.search(rf"const .*?\b{name} = /(.+?)/[,;]", js)
        assert found, f"no {name} pattern in pagefeatures' _TEXT_TABLES_JS"
        # the JavaScript sits in a Python string: its backslashes are doubled
        assert found.group(1).replace("\\\\", "\\") == getattr(text_tables, name).pattern, name
