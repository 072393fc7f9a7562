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


# Seconds each slow unit (a test module or a notebook, what xdist's loadscope hands a worker)
# took in one `make test` (test-py's two workers on a 2-core machine, the browser test in the same
# run; from _build/scope-times.json, 2026-12-07; `make test` now runs the browser test beside
# test-py, in test-beside, ordered by the same table). They only order the work (see
# pytest_collection_modifyitems), so a stale figure costs time, never a result. Units not
# listed: a notebook by its quick run in book/_ext/runs.json (capped below the listed ones),
# a module as short. test_checks_time_it.py's figure is its own run, alone (`make test` runs it
# beside test-py: Makefile, BESIDE).
SLOW_UNITS = {"tests/browser/test_pages.py": 199, "book/part3/ddp_torchrun.ipynb": 152,
              "tests/test_colab.py": 90, "tests/test_distributed.py": 62,
              "tests/test_autograde.py": 60, "tests/test_launch.py": 54,
              "tests/test_checks_time_it.py": 93, "tests/test_checks_frames.py": 53,
              "book/part4/fixes.ipynb": 47, "book/part3/syncbn.ipynb": 36,
              "tests/test_fast_processes.py": 26, "book/part4/scaling.ipynb": 36,
              "tests/test_checks_forced_cases.py": 35, "tests/test_fake_cuda.py": 34,
              "book/part6/pipeline_dist.ipynb": 33, "tests/browser/test_checks_fail.py": 30,
              "book/part3/dataparallel.ipynb": 29, "book/part1/costs.ipynb": 29,
              "book/part2/scratch.ipynb": 28, "tests/test_checks_work_before_the_call.py": 28,
              "book/part4/profile.ipynb": 26, "book/part3/custom_modules.ipynb": 26,
              "book/part5/zero.ipynb": 24, "book/part3/ddp_scratch.ipynb": 23,
              "tests/test_checks_fresh_draws.py": 23, "book/part6/tensor_parallel_dist.ipynb": 22,
              "tests/test_bench.py": 20, "book/part7/expert_parallel.ipynb": 20,
              "book/part7/composed.ipynb": 18, "tests/test_checks_between_windows.py": 18,
              "tests/test_wrappers_property.py": 17, "tests/test_chapter_runs.py": 17,
              "book/part7/context_parallel.ipynb": 17, "book/gpus.ipynb": 17,
              "tests/browser/test_accessibility.py": 17, "tests/browser/test_navigation.py": 17,
              "book/part5/fsdp2.ipynb": 16, "book/part6/mesh2d.ipynb": 16,
              "tests/test_checks_forced_draws.py": 16, "book/part1/network_split.ipynb": 15,
              "tests/test_package_rules.py": 9, "tests/test_parallel.py": 14,
              "book/part5/fsdp_scratch.ipynb": 14, "tests/test_checks_received_kept.py": 14,
              "tests/test_precommit.py": 14, "tests/test_temp_dirs.py": 14,
              "book/part1/within_layer.ipynb": 13, "tests/test_checks_compiled_answers.py": 13,
              "tests/test_checks_rewritten_functions.py": 12,
              # the shares of modules split from the ones above (their tests' times, measured)
              "tests/test_fast.py": 10, "tests/test_plain_install.py": 5,
              "tests/test_colab_setup_cell.py": 4, "tests/test_atomic_checkpoints.py": 4,
              "tests/test_one_home.py": 3, "tests/test_layout.py": 2,
              "tests/test_module_paths.py": 1}


def _scope_seconds(root):
    """{scope: expected seconds} for xdist's loadscope units: test modules and notebooks."""
    import json
    runs = {}
    path = root / "book" / "_ext" / "runs.json"
    if path.exists():   # a new notebook: its own quick run, below the measured units
        runs = {f"{k}.ipynb": min(v.get("quick", {}).get("seconds", 0), 12)
                for k, v in json.loads(path.read_text()).items()}
    runs.update(SLOW_UNITS)
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
