import os
import pathlib
import sys
import zlib

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def pytest_configure(config):
    """Under pytest-xdist, each worker's torch gets its share of the cores: N workers each
    running a pool of N threads on N cores wait out scheduler slices at every barrier."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(autouse=True)
def _replayed_check_inputs(request):
    """Each test's exercise checks draw the same fresh inputs on every run (see
    helpers.checks._core.replay_seeds), so CI does not depend on a lucky draw."""
    from helpers.checks import _core
    _core.replay_seeds(zlib.crc32(request.node.nodeid.encode()))
    yield
    _core.replay_seeds(None)


def _public_function(v):
    import types
    return callable(v) and not isinstance(v, types.ModuleType)


def _replaced(spaces, before):
    """The public functions and classes of `before` (a copy of each namespace) that a namespace
    no longer holds, unless what it holds now wraps them (functools.wraps). Only the names whose
    object changed are looked at: a test's every call compares thousands of names."""
    changed = []
    for label, ns in spaces:
        for k, v in before[label].items():
            now = ns.get(k)
            if now is v or k.startswith("_") or not _public_function(v):
                continue
            now = now if _public_function(now) else None
            if getattr(now, "__wrapped__", None) is not v:
                changed.append(f"{label}.{k}")
    return sorted(changed)


@pytest.fixture(autouse=True)
def _libraries_left_as_found(request):
    """A grader test that leaves torch's or Python's functions replaced (an answer's patch that
    the harness failed to put back) fails itself, instead of bending every later test in the
    worker (wrong values far from their cause)."""
    if not request.node.fspath.basename.startswith(("test_checks_", "test_autograde")):
        yield
        return
    import builtins

    import torch
    import torch.distributed
    spaces = (("torch", vars(torch)), ("torch.Tensor", torch.Tensor.__dict__),
              ("builtins", vars(builtins)), ("torch.distributed", vars(torch.distributed)))
    before = {label: dict(ns) for label, ns in spaces}
    yield
    changed = _replaced(spaces, before)
    assert not changed, f"the test left {', '.join(changed[:5])} replaced"


# Seconds each slow test module took in one `make test-unit` (2 workers on a loaded 2-core
# machine): they only order the work (see pytest_collection_modifyitems), so a stale figure costs
# time, never a result. Notebooks are ordered by their quick runs in book/_ext/runs.json.
SLOW_MODULES = {"test_fake_cuda": 400, "test_distributed": 500, "test_colab": 440,
                "test_launch": 250, "test_bench": 250, "test_fast": 180, "test_parallel": 115,
                "test_data": 100, "test_sharding": 95, "test_ddp_scratch": 95,
                "test_reader_markup": 75, "test_checks_fast": 75, "test_student": 65,
                "test_composed": 60, "test_fake_gpus_fewer_real": 60, "test_tp_dist": 55,
                "test_planner": 55, "test_mesh": 55, "test_expert_parallel": 50,
                "test_context_parallel": 50, "test_autograde": 130, "test_wrappers_property": 120,
                "test_ddp_runs": 100, "test_pipeline_dist": 60, "test_chapter_runs": 40}


def _scope_seconds(root):
    """{scope: expected seconds} for xdist's loadscope units: test modules and notebooks."""
    import json
    runs = {}
    path = root / "book" / "_ext" / "runs.json"
    if path.exists():
        runs = {f"{k}.ipynb": v.get("quick", {}).get("seconds", 0)
                for k, v in json.loads(path.read_text()).items()}
    runs.update({f"tests/{k}.py": v for k, v in SLOW_MODULES.items()})
    return runs


def pytest_collection_modifyitems(config, items):
    """The longest modules and notebooks first (stable within each): under xdist's loadscope
    (`--no-loadscope-reorder`, as the Makefile runs it) each worker takes the next unit when it
    is free, so a long notebook started last would leave the other core idle at the end."""
    seconds = _scope_seconds(config.rootpath)

    def scope(item):
        return item.nodeid.split("::", 1)[0]
    first = {}
    for i, item in enumerate(items):
        first.setdefault(scope(item), i)
    items.sort(key=lambda item: (-seconds.get(scope(item), 0), first[scope(item)]))
