"""The state the harness's hooks decide by is not the answer's to change (tests/check_cases.py's
form): guard.py's off switch for a thread, the answers running and their blocked code live in
its audit hook's closure, and exits.py reads from the thread's stack whether an exit is already
running, so setting a flag or a depth on the shared objects (`_course_answer_guard` in
sys.modules, exits.py's state) switches nothing off; calling the guard's own
switches (`quiet`, `disarm`) from the answer is refused. Each refusal keeps its own words.
"""
import importlib
import importlib.util
import sys
import types

import pytest
from check_cases import exact_mean_var, parametrize_cases, shortcut


def _flag(module, name):
    """Sets `name` on the shared state's per-thread object, and on a stand-in for it (names
    built at run time: the scan sees nothing)."""
    state = sys.modules.get("_course_" + module) or getattr(
        importlib.import_module("helpers.checks._core.ex" + "its"), "_EX" + "ITS")
    held = getattr(state, "local", None)
    if held is not None:
        setattr(held, name, True)
    state.local = types.SimpleNamespace(busy=True, inside=True)


@shortcut("check_zigzag_positions", "the course's module imported again, the guard's flag set",
          "ran a copy of")
def zigzag_positions_guard_flag(T, world, rank):
    _flag("answer_guard", "busy")
    path = importlib.import_module("helpers.context_" + "parallel.scratch").__file__
    spec = importlib.util.spec_from_file_location("helpers.context_parallel.mine_again", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, "split_" + "positions")(T, world, rank)


@shortcut("check_zigzag_positions", "the course's module imported again, the answers' depth 0",
          "ran a copy of")
def zigzag_positions_guard_depth(T, world, rank):
    state = sys.modules["_course_answer" + "_guard"]
    state.depth, state.keys = 0, {}
    path = importlib.import_module("helpers.context_" + "parallel.scratch").__file__
    spec = importlib.util.spec_from_file_location("helpers.context_parallel.mine_again2", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, "split_" + "positions")(T, world, rank)


@shortcut("check_gpipe_time", "no overlap; the guard disarmed by its own function", "guard off")
def gpipe_time_guard_disarmed(t_stage, p, m):
    getattr(sys.modules["_course_answer" + "_guard"], "dis" + "arm")()
    return t_stage * p


def _noop(condition, message):
    return None


@shortcut("check_gpipe_time", "no overlap; the guard's flag set, then expect given new code",
          "new __code__")
def gpipe_time_guard_flag(t_stage, p, m):
    _flag("answer_guard", "busy")
    run = importlib.import_module("helpers.checks._core." + "run")
    setattr(getattr(run, "exp" + "ect"), "__co" + "de__", getattr(_noop, "__co" + "de__"))
    return t_stage * p


@shortcut("check_gpipe_time", "no overlap; the guard's own switch called", "guard off")
def gpipe_time_guard_switch(t_stage, p, m):
    getattr(sys.modules["_course_answer" + "_guard"], "qui" + "et")(True)
    return t_stage * p


@shortcut("check_global_mean_var", "exact Fractions from .tolist(); the exit watch's flag set",
          "tolist")
def global_mean_var_exit_flag(counts, means, variances):
    _flag("exit_watch", "inside")
    return exact_mean_var(counts, means, variances)


test_case = parametrize_cases(__name__)


def test_the_guards_switch_is_the_stubs_alone():
    """The guard's off switch, called from code that is not stubs.py's, is refused."""
    from helpers.checks._core import guard
    with pytest.raises(guard.ReferenceUsed, match="guard off"):
        guard._state().quiet(True)          # from a test file: not stubs.py's code
