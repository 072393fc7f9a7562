"""patched.py tells an unchanged namespace by its dict's version tag (versions.py) instead of
comparing its names: each kind of change must give a new tag, a copy is reused only while the
tag holds, a scan for odd keys is skipped only while it holds, and a rebound library function
is still found and put back, with tags and without (a Python that keeps none)."""
import ctypes
import sys
import types

import pytest
import torch

from helpers.checks import check_dp_average
from helpers.checks._core import patched, versions

needs_tags = pytest.mark.skipif(versions._OFFSET is None, reason="this Python keeps no tags")


@needs_tags
def test_every_kind_of_change_gives_a_new_tag():
    module = types.ModuleType("tagged")

    class Space:
        pass
    tags = versions.reader((vars(module), Space.__dict__))
    seen = [tags()]
    assert tags() == seen[0], "reading changes nothing"
    for change in (lambda: setattr(module, "a", 1), lambda: setattr(module, "a", 2),
                   lambda: delattr(module, "a"), lambda: vars(module).update(b=3),
                   lambda: vars(module).pop("b"), lambda: setattr(Space, "x", 1),
                   lambda: setattr(Space, "x", property(len)), lambda: delattr(Space, "x")):
        change()
        seen.append(tags())
    assert len(set(seen)) == len(seen), seen


@needs_tags
def test_a_changed_ctypes_class_does_not_blind_the_tags(monkeypatch):
    """ctypes' Python classes can be changed by a cell; the reader's getter and constructor
    were bound at import."""
    module = types.ModuleType("tagged")
    monkeypatch.setattr(ctypes.c_uint64, "value", property(lambda self: 0), raising=False)
    monkeypatch.setattr(ctypes.c_uint64, "from_address", classmethod(lambda c, a: c(0)),
                        raising=False)
    tags = versions.reader((vars(module),))
    before = tags()
    module.a = 1
    assert tags() != before


def test_a_copy_is_reused_only_while_its_namespace_is_unchanged():
    module = types.ModuleType("tagged")
    module.a = 1
    views, kept = (vars(module),), {}
    tags = versions.reader(views)
    first = versions.copies(views, tags() if tags else None, kept)
    again = versions.copies(views, tags() if tags else None, kept)
    assert again[0] == {"__name__": "tagged", "__doc__": None, "__package__": None,
                        "__loader__": None, "__spec__": None, "a": 1}
    if tags:
        assert again[0] is first[0], "an unchanged namespace is not copied again"
    module.a = 2
    changed = versions.copies(views, tags() if tags else None, kept)
    assert changed[0]["a"] == 2 and changed[0] is not first[0]


class _Odd:
    """A key whose hash copies a name's (keys.py): its `__eq__` would run at each lookup of
    that name (here it only counts the lookups)."""
    calls = 0

    def __hash__(self):
        return hash("allclose")

    def __eq__(self, other):
        _Odd.calls += 1
        return other is self


def test_a_key_put_after_a_clean_scan_is_found():
    """odd_keys skips a namespace whose tag is the one of its last clean scan: a key put in it
    afterwards gives it another tag, so it is scanned, found and taken out."""
    assert patched.odd_keys() == []
    key = _Odd()
    vars(torch)[key] = None
    try:
        assert sum(type(k) is _Odd for k in vars(torch)) == 1
        assert patched.odd_keys() == ["torch"]
        assert all(type(k) is str for k in vars(torch))
    finally:
        left = {k: v for k, v in vars(torch).items() if type(k) is str}
        vars(torch).clear()
        vars(torch).update(left)
    assert patched.odd_keys() == []


@pytest.fixture(params=["version tags", "names compared"])
def tag_mode(request, monkeypatch):
    """Both ways of telling a namespace unchanged: the tags, and (as on a Python without them)
    the name-by-name comparison."""
    patched._spaces()
    cache = patched._spaces.__defaults__[0]     # held there, no module attribute
    if request.param == "names compared":
        monkeypatch.setitem(cache, "tags", None)
    elif cache["tags"] is None:
        pytest.skip("this Python keeps no tags")
    return request.param


def test_a_library_function_rebound_in_the_call_is_found_and_put_back(tag_mode, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    original = torch.Tensor.div_

    def dp_average(grads, comm):
        for t in grads:
            comm.all_reduce(t)
        torch.Tensor.div_ = lambda self, other: self     # the check divides nothing now
    result = check_dp_average(dp_average)
    assert not result.passed and "replaced torch.Tensor.div_" in result.message, result.message
    assert torch.Tensor.div_ is original


def test_a_right_answer_passes_either_way(tag_mode, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)

    def dp_average(grads, comm):
        for t in grads:
            comm.all_reduce(t)
            t.div_(comm.world)
    assert check_dp_average(dp_average).passed


def test_tags_are_read_where_cpython_keeps_them():
    """On CPython 3.11 to 3.13 (the course's Pythons) the fast path is on: a layout change that
    turned it off would go unnoticed, every call paying the full comparison again."""
    if sys.implementation.name == "cpython" and sys.version_info[:2] <= (3, 13):
        assert versions._OFFSET is not None
