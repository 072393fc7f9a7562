"""Tables the harness shares between rank threads are read at once: a storage another rank's
thread adds while one rank's first sight of memory outside torch lists the known storages, or a
module another rank's thread imports while the dispatch switches are guarded, raises nothing in
the answer ("dictionary changed size during iteration" once failed a right answer under load:
provenance.py's `known`, switches.py's `_torch_spaces`), nor does a class another rank's thread
patches while the scan or the held walk reads its members (reach.py: hooks.py sets and deletes
torch.Tensor's), or a function's keyword defaults. A collection run at every allocation, whose
callback adds an entry, stands in for the other thread (it runs between two items)."""
import gc
import sys
import types

import numpy as np
import pytest
import torch

from helpers.checks._core import reach, switches
from helpers.checks._core.provenance import Provenance


@pytest.fixture
def adds_at_every_collection():
    """Calls `add()` at each garbage collection, run after every allocation, while it lasts."""
    adds = []

    def callback(phase, info):
        if phase == "start":
            for add in adds:
                add()
    threshold = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1)
    try:
        yield adds.append
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(callback)


def test_first_sight_lists_the_known_storages_at_once(adds_at_every_collection):
    p = Provenance(world=None)
    for _ in range(5000):   # more pairs than the free list of tuples holds: new ones
        t = torch.zeros(2)
        p.owner[t.untyped_storage()._cdata] = (0, "zeros", t.untyped_storage())
    spare = [torch.zeros(2).untyped_storage() for _ in range(4096)]
    adds_at_every_collection(lambda: spare and p.owner.setdefault(
        spare[-1]._cdata, (1, "zeros", spare.pop())))
    outside = torch.from_numpy(np.zeros(4)).untyped_storage()
    assert p._first_sight(0, outside._cdata, outside) is None


def test_the_switches_list_the_loaded_modules_at_once(adds_at_every_collection):
    counter = iter(range(10**6))
    cache = switches._torch_spaces.__defaults__[-1]     # held there, no module attribute
    cache["loaded"] = []     # rebuilt: every module read
    names = []

    def add():
        names.append(f"torch_shared_tables_probe_{next(counter)}")
        sys.modules[names[-1]] = types.ModuleType(names[-1])
    adds_at_every_collection(add)
    try:
        assert switches._torch_spaces()
    finally:
        for name in names:
            sys.modules.pop(name, None)
        cache["loaded"] = []


def test_the_walk_lists_a_class_s_members_at_once(adds_at_every_collection):
    patched = type("Patched", (), {f"member_{i}": i for i in range(200)})
    counter = iter(range(10**6))
    adds_at_every_collection(lambda: setattr(patched, f"added_{next(counter)}", 0))
    assert reach.readers_class(patched)      # made by type() here: the reader's, walked


def test_the_walk_lists_a_function_s_keyword_defaults_at_once(adds_at_every_collection):
    def answer(*, a=0, b=1, c=2):
        return a + b + c
    counter = iter(range(10**6))
    adds_at_every_collection(lambda: answer.__kwdefaults__.setdefault(f"k{next(counter)}", 0))
    assert [d for label, d in reach.children(answer) if label == "default"][:3] == [0, 1, 2]
