"""guard.py's shared state is the one its audit hook made, never whatever sys.modules holds: a
cell that puts a state of its own under `_course_answer_guard` (its `arm` doing nothing), or that
gives the real state no-op functions, leaves the hook armed for the answer, in the notebook's
check and in `fresh.regrade`'s fresh import alike (each import is handed the state and its
functions by the hook itself). exits.py's watchers come from the same hook.
"""
import importlib
import importlib.util
import sys
import threading
import types

import pytest

from helpers.checks import check_zigzag_positions
from helpers.checks._core import fresh


def zigzag_positions_copy(T, world, rank):
    """The course's own answer, its module exec'd again under another name."""
    path = importlib.import_module("helpers.context_" + "parallel.scratch").__file__
    spec = importlib.util.spec_from_file_location("helpers.context_parallel.mine_forged", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, "split_" + "positions")(T, world, rank)


def _forged(real):
    fake = types.ModuleType("_course_answer_guard")
    fake.arm, fake.disarm = (lambda keys, code_key: True), (lambda: (None, 0))
    fake.quiet, fake.refuse = (lambda flag: False), (lambda message: None)
    fake.armed, fake.refusal = (lambda: 0), (lambda: None)
    fake.judging, fake.rewritten, fake.lock = 0, [], threading.RLock()
    fake.start, fake.submit, fake.process_start = real.start, real.submit, real.process_start
    return fake


@pytest.fixture
def forged():
    """A cell before the check: a state of its own in sys.modules, no-op functions on the real
    one (put back afterwards)."""
    real = sys.modules["_course_answer_guard"]
    saved = {n: getattr(real, n) for n in ("arm", "disarm", "armed", "refuse", "refusal")}
    sys.modules["_course_answer_guard"] = _forged(real)
    for n, v in vars(_forged(real)).items():
        if n in saved:
            setattr(real, n, v)
    try:
        yield
    finally:
        sys.modules["_course_answer_guard"] = real
        for n, v in saved.items():
            setattr(real, n, v)


def test_a_forged_guard_state_switches_nothing_off(forged):
    result = check_zigzag_positions(zigzag_positions_copy)
    assert result.status == "failed" and "ran a copy of" in result.message, result


def test_regrade_trusts_no_forged_guard_state(forged):
    with pytest.raises(AssertionError, match="ran a copy of"):
        fresh.regrade("check_zigzag_positions", zigzag_positions_copy)


def test_the_exit_watch_is_no_sys_modules_entry():
    """exits.py's watchers are handed to each import by the guard's hook: a module a cell puts
    under the old name is never read."""
    from helpers.checks._core import exits, guard
    assert "_course_exit_watch" not in sys.modules
    assert exits._WATCHERS is guard._EXITS.watchers
