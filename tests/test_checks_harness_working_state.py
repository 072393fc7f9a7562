"""The observers' working state, emptied or poisoned by the answer (reached by a name built at run
time) and put back before it returns, switches nothing off (tests/check_cases.py's form):
numpy_work's list of blocks running and a block's own record (every record ticks a counter the
block compares with what its list holds), exits.py's watchers (its stand-ins are in only while
one watches: an empty list while an answer runs is the answer's doing), and left_later's class
cache and young objects (the first answer's window keeps its own copy, which no module holds).
"""
import importlib
import sys

import numpy as np
import pytest
import torch
from check_cases import exact_mean_var, parametrize_cases, shortcut

HOLD = []


def _core(name):
    return importlib.import_module("helpers.checks._core." + name)


def _held(module, name):
    """A harness module's live state, held as a default argument of its functions (no module
    attribute): read here, before any answer runs (guard.py refuses the read while one does),
    so these cases test the defence behind that refusal."""
    found = [kw[name] for fn in vars(_core(module)).values()
             for kw in [getattr(fn, "__kwdefaults__", None) or {}] if name in kw]
    assert found, (module, name)
    return found[0]


STATE = {"window": _held("left_later", "_WINDOW"), "nodes": _held("hooks", "_NODES")}


@shortcut("check_shard_sizes", "np.array_split with numpy_work's blocks emptied",
          "emptied the check's record")
def shard_sizes_blocks_emptied(n, k):
    active = getattr(_core("numpy" + "_work"), "_ACT" + "IVE")
    saved = list(active)
    active.clear()
    try:
        return [len(part) for part in np.array_split(np.arange(n), k)]
    finally:
        active[:] = saved


@shortcut("check_shard_sizes", "np.array_split, then the block's record cleared",
          "emptied the check's record")
def shard_sizes_record_cleared(n, k):
    sizes = [len(part) for part in np.array_split(np.arange(n), k)]
    getattr(_core("numpy" + "_work"), "_ACT" + "IVE")[-1].clear()
    return sizes


@shortcut("check_shard_sizes", "np.array_split, recorded into a decoy list",
          "emptied the check's record")
def shard_sizes_record_decoy(n, k):
    active = getattr(_core("numpy" + "_work"), "_ACT" + "IVE")
    saved = list(active)
    active[:] = [[]]
    try:
        return [len(part) for part in np.array_split(np.arange(n), k)]
    finally:
        active[:] = saved


@shortcut("check_global_mean_var", "exact Fractions from .tolist(), the exit watchers emptied",
          "emptied the check's list")
def global_mean_var_watchers_emptied(counts, means, variances):
    watchers = getattr(_core("ex" + "its"), "_WATCH" + "ERS")
    saved = list(watchers)
    watchers.clear()
    try:
        return exact_mean_var(counts, means, variances)
    finally:
        watchers[:] = saved


class Later:
    def __del__(self):
        HOLD.append("ran")


@shortcut("check_gpipe_time", "an object with a __del__ left, its class marked as running "
          "nothing in the window's cache", "would run your code later")
def gpipe_time_kinds_poisoned(t_stage, p, m):
    window = STATE["window"]
    window["kinds"][Later] = None
    HOLD.append(Later())
    return (m + p - 1) * t_stage / m


@shortcut("check_gpipe_time", "an object with a __del__ left, noted as young before the call",
          "would run your code later")
def gpipe_time_young_poisoned(t_stage, p, m):
    window = STATE["window"]
    obj = Later()
    HOLD.append(obj)
    window["young"][id(obj)] = (obj, "a __del__")
    return (m + p - 1) * t_stage / m


test_case = parametrize_cases(__name__)


def test_no_module_holds_left_laters_class_cache():
    """The cache of what a class runs when its objects die lives in a window, not the module."""
    assert not hasattr(sys.modules["helpers.checks._core.left_later"], "_KINDS")


def _hook_then_emptied(X):
    """A hook left on the handed tensor's node, the answer's record of it emptied."""
    X.grad_fn.register_prehook(lambda g: tuple(x * 0 for x in g))
    for lists in STATE["nodes"]["lists"].values():
        for lst in lists:
            lst.clear()


def test_a_node_hook_left_with_its_record_emptied_fails():
    from helpers.checks._core import CheckFailed
    from helpers.checks._core.declare import Answer
    w = torch.ones(3, requires_grad=True)
    X = w * 3
    with pytest.raises(CheckFailed, match="emptied the check's record of the hooks"):
        Answer(_hook_then_emptied, "x", [])(X)
