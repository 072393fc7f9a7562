"""What the harness skips while a dict's version tag holds (versions.py) is skipped only while
nothing changed: each test lets a first check read a dict (so its tag is noted), then the
reader's code changes that dict where the guard looks, and the guard must still fire. Without
tags (another Python) every dict is read each time, and the same tests pass."""
import builtins
import importlib
import sys
import textwrap
import types

import pytest
import torch
from check_cases import quiet

import helpers.checks
from helpers.checks._core import defaults, imported, patched

_LINEAR = "torch.nn.modules.linear"     # a torch module that holds no dispatch switch


def _shard_sizes(n, k):
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


@pytest.fixture(autouse=True)
def _reader_run(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)


SPLIT_UNDER_A_MOVED_SWITCH = """
def shard_sizes(n, k):
    where = importlib.import_module("torch.nn.modules.lin" + "ear")
    with getattr(where, "_Disable" + "TorchDispatch")():
        return [len(s) for s in torch.arange(n).tensor_split(k)]
"""


def test_a_switch_bound_after_its_module_was_read_is_still_guarded(monkeypatch):
    """switches.py reads a torch module's names again only when its tag changed: a dispatch
    switch bound into a module already read (a cell between two checks) is found and guarded,
    so the split measured under it fails as one measured in plain view does."""
    assert quiet(helpers.checks.check_shard_sizes, _shard_sizes).passed   # every module read
    monkeypatch.setattr(sys.modules[_LINEAR], "_DisableTorchDispatch",
                        torch._C._DisableTorchDispatch, raising=False)
    space = {"__name__": "answer", "__builtins__": builtins, "importlib": importlib,
             "torch": torch}
    exec(compile(textwrap.dedent(SPLIT_UNDER_A_MOVED_SWITCH), "<answer>", "exec"), space)
    result = quiet(helpers.checks.check_shard_sizes, space["shard_sizes"])
    assert not result.passed and "switches off torch's dispatch" in result.message, result


class _Odd:
    """A key of the reader's class: each lookup of a name of equal hash would run `__eq__`."""

    def __hash__(self):
        return hash("__name__")

    def __eq__(self, other):
        return False


def test_a_key_put_into_the_globals_after_a_clean_read_is_refused():
    """plain_globals skips the answer's globals while their tag is the one of a clean read: a
    key put there afterwards gives them another, so the next check reads them and refuses."""
    space = {"__name__": "answer", "__builtins__": builtins}
    exec("def shard_sizes(n, k):\n    return [n // k + (i < n % k) for i in range(k)]\n",
         space)
    assert quiet(helpers.checks.check_shard_sizes, space["shard_sizes"]).passed
    space[_Odd()] = None
    result = quiet(helpers.checks.check_shard_sizes, space["shard_sizes"])
    assert not result.passed and "keyed by names" in result.message, result


def test_a_key_put_into_sys_modules_after_a_clean_read_is_taken_out():
    """sys.modules' keys are read again once its tag changed since a clean read: a key put
    there between two checks is found by the next one and taken out, never looked up."""
    assert quiet(helpers.checks.check_shard_sizes, _shard_sizes).passed   # read clean
    key = _Odd()
    sys.modules[key] = types.ModuleType("odd")
    try:
        result = quiet(helpers.checks.check_shard_sizes, _shard_sizes)
        assert not result.passed and "sys.modules" in result.message, result
        assert all(type(k) is str for k in dict.keys(sys.modules))
    finally:
        kept = [(k, v) for k, v in dict.items(sys.modules) if type(k) is str]
        if len(kept) != len(sys.modules):
            sys.modules.clear()
            sys.modules.update(kept)
    assert quiet(helpers.checks.check_shard_sizes, _shard_sizes).passed


def test_an_entry_of_sys_modules_replaced_is_found_and_put_back():
    """imported.changed skips the comparison only while the table's tag holds: an entry
    replaced by one object (the table's size unchanged) is found and put back."""
    saved = imported.copy()
    original = sys.modules["json"]
    sys.modules["json"] = types.ModuleType("json")
    try:
        assert imported.changed(saved) == ["sys.modules['json']"]
    finally:
        sys.modules["json"] = original
    assert imported.changed(imported.copy()) == []


def test_a_default_changed_in_place_is_found_and_put_back():
    """defaults.changed skips a `__kwdefaults__` dict only while its tag holds: one value
    replaced (its size unchanged) is found and put back; one replaced and put back is not."""
    held = defaults.held([("torch.optim.AdamW", vars(torch.optim.AdamW))])
    kw = torch.optim.AdamW.__init__.__kwdefaults__
    assert any(obj is kw for _, obj in held)
    tags = defaults.tags(held)
    kept = defaults.copy(held, tags)
    original = kw["maximize"]
    kw["maximize"] = not original
    try:
        assert defaults.changed(held, kept, tags) == [
            "torch.optim.adamw.AdamW.__init__ (its __kwdefaults__)"]
        assert kw["maximize"] is original          # put back
    finally:
        kw["maximize"] = original
    kw["maximize"] = not original
    kw["maximize"] = original                      # another tag, the same contents
    assert defaults.changed(held, kept, tags) == []


def test_a_harness_cell_set_in_place_is_found_and_put_back():
    """patched.cells_changed compares every cell in C, by identity: a cell given another
    object (none emptied) is named and put back."""
    patched._spaces()
    saved = patched.cells()
    named, held, values = saved
    assert held, "the harness's functions have closure cells"
    cell, value = held[0], values[0]
    cell.cell_contents = object()
    try:
        assert patched.cells_changed(saved) == [f"{named[0][0]} (its closure)"]
        assert cell.cell_contents is value
    finally:
        cell.cell_contents = value
    assert patched.cells_changed(patched.cells()) == []


def _reachable_from_modules(depth=3):
    """The ids of every object the check modules' attributes lead to (module globals, then
    the items of containers, `depth` deep): what code of the reader's that reached a check
    module by a name built at run time could change in place, functions' defaults left out."""
    seen, frontier = set(), [m for name, m in list(sys.modules.items())
                             if name.startswith("helpers.checks") and m is not None]
    for _ in range(depth):
        nxt = []
        for obj in frontier:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, types.ModuleType):
                nxt += [v for v in vars(obj).values() if not isinstance(v, types.ModuleType)]
            elif type(obj) in (dict, list, tuple, set):
                nxt += list(obj.values()) if type(obj) is dict else list(obj)
        frontier = nxt
    return seen | {id(o) for o in frontier}


def test_no_module_attribute_leads_to_a_kept_copy_or_the_switches_cache():
    """patched.py's copies of the watched namespaces (kept while their tags hold) and the list
    of torch modules switches.py guards are what the verdict trusts after the call: an answer
    that reached them through a module attribute could poison a copy (a replaced
    torch.allclose then compares equal to it, and stays replaced) or empty the list (no switch
    guarded at its next call). They are held as functions' default arguments only."""
    assert quiet(helpers.checks.check_shard_sizes, _shard_sizes).passed   # copies kept
    from helpers.checks._core import switches
    cache = getattr(patched, "_CACHE", None) or patched._spaces.__defaults__[0]
    shared = getattr(patched, "_SHARED", None) or patched.snapshot.__defaults__[-1]
    kept = [cache, *cache["copies"].get("held", ()), shared]
    spaces = getattr(switches, "_CACHE", None) or switches._torch_spaces.__defaults__[-1]
    kept += [spaces, spaces["spaces"]]
    reachable = _reachable_from_modules()
    assert not [k for k in kept if id(k) in reachable]
