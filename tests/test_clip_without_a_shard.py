"""Sharded gradient clipping on a rank that holds no shard, under NCCL's rules (the fake GPUs of
tests/fake_cuda.py): that rank still all-reduces its squared norm, and NCCL takes CUDA tensors
only, so a tensor made on the CPU for want of a shard to take the device from fails on a GPU
machine. The Part V notebook's worked clip_sharded and the course's clip_sharded_grad_norm_."""
import json

import fake_cuda_targets
import pytest
from book_files import ROOT

import helpers

WORLD = 3           # the last rank holds no shard (clip_without_a_shard)


def _worked_source():
    """The solution cell of fsdp_scratch.ipynb that defines clip_sharded."""
    nb = json.loads((ROOT / "book" / "part5" / "fsdp_scratch.ipynb").read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if "solution" in cell["metadata"].get("tags", []) and "def clip_sharded(" in src:
            return src
    raise LookupError("fsdp_scratch.ipynb has no solution cell defining clip_sharded")


@pytest.fixture(scope="module")
def reports():
    runs = [("worked", fake_cuda_targets.clip_without_a_shard, dict(source=_worked_source())),
            ("course", fake_cuda_targets.clip_without_a_shard, {})]
    return helpers.launch(fake_cuda_targets.on_fake_gpus, WORLD, dict(runs=runs),
                          backend="gloo", quiet=True, timeout=300)


@pytest.mark.parametrize("label", ["worked", "course"])
def test_a_rank_without_a_shard_all_reduces_on_its_gpu(reports, label):
    """Every rank, the one without a shard included, clips without a CPU tensor in NCCL's
    all-reduce and returns the whole gradient's norm (the target raises otherwise)."""
    got = [(rank, report[label]) for rank, report in enumerate(reports)]
    assert all(r["error"] is None and not r["problems"] for _, r in got), got
