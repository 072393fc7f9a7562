"""Every exercise check is on the harness and tested three ways: declared with @check
(what it observes, the references it blocks), and registered in tests/check_cases.py with its
worked answer, at least two shortcuts of different kinds, and at least one other right answer.
"""
import importlib
import pathlib

import pytest
from check_cases import CASES

import helpers.checks
from helpers.checks._core import REGISTRY

TESTS = pathlib.Path(__file__).resolve().parent
for path in sorted(TESTS.glob("test_checks_*.py")):
    if path.stem != "test_checks_registry":
        importlib.import_module(path.stem)     # fills CASES

CHECKS = sorted(n for n in dir(helpers.checks) if n.startswith("check_")
                and callable(getattr(helpers.checks, n)))


@pytest.mark.parametrize("name", CHECKS)
def test_every_check_is_declared_and_tested_three_ways(name):
    assert name in REGISTRY, f"{name} is not declared with @check (helpers/checks/_core)"
    cases = CASES.get(name)
    assert cases, f"{name} has no cases in tests/test_checks_*.py (tests/check_cases.py)"
    assert cases["worked"], f"{name}: no @worked answer"
    kinds = {c.label for c in cases["shortcuts"]}
    assert len(kinds) >= 2, f"{name}: shortcuts of {len(kinds)} kind(s) {sorted(kinds)}; need 2"
    assert cases["others"], f"{name}: no @other right answer"
    assert REGISTRY[name].observes, f"{name} declares nothing it observes (teachers.md)"


@pytest.mark.parametrize("name", CHECKS)
def test_a_stub_is_not_done_yet(name, monkeypatch, capsys):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)

    def stub(*args, **kwargs):
        raise NotImplementedError()
    assert getattr(helpers.checks, name)(stub).status == "not done"


def test_teachers_guide_lists_what_every_check_observes():
    import sys
    sys.path.insert(0, str(TESTS.parent / "scripts"))
    import teachers_guide as tg
    text = tg.TEACHERS.read_text()
    begin = text.index(tg.CHECKS_BEGIN) + len(tg.CHECKS_BEGIN)
    assert text[begin:text.index(tg.CHECKS_END)].strip() == tg.checks_table(), (
        "book/teachers.md's checks table is out of date: run "
        ".venv/bin/python scripts/student_edition.py --update-teachers-guide")


def test_every_reference_resolves_to_a_facade_name_or_torch():
    """A check resolves its `references=` only when it runs: a split that renames a function
    some check lists would make that check fail as "the check itself failed" in a classroom.
    Each course name is a façade name (`helpers.X`, or a member of one: `ByteLog.wire_bytes`),
    never a path into a split's module, so `from .. import`'s rule holds for references too."""
    import inspect

    import helpers
    from helpers.checks._core.references import _torch_object
    stale = []
    for check, info in sorted(REGISTRY.items()):
        for name in info.references:
            head, *rest = name.split(".")
            if name.startswith("torch."):
                found = _torch_object(name) is not None
            else:
                obj = getattr(helpers, head, None)
                found = obj is not None and not inspect.ismodule(obj)
                for part in rest:
                    obj = getattr(obj, part, None)
                found = found and obj is not None
            if not found:
                stale.append(f"{check} ({info.module}): {name!r}")
    assert not stale, ("references= names that are not a façade name (or torch's) here: "
                       f"{stale}: rename them in the check too")
