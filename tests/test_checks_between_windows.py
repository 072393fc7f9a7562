"""The harness reads the reader's answer object only by type between the answer's watched
windows (parts.py), and the harness's own functions keep their code at all times (guard.py): an
answer object whose `__name__` is a property or whose `__getattr__` runs code, read by the check
before or between the answer's calls, did its work unwatched (a shortcut: the check's `expect`
given a no-op's code, or the sizes measured from the check's own frame)."""
import os
import pathlib
import subprocess
import sys

import pytest
from check_cases import quiet
from numpy import arange as _arange
from numpy import array_split as _array_split

import helpers.checks
from helpers.checks._core import run
from helpers.checks._core.run import ReferenceUsed

_EXPECT_CODE = run.expect.__code__


def _noop(condition, message):
    return None


@pytest.fixture(autouse=True)
def expect_kept(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    yield
    if run.expect.__code__ is not _EXPECT_CODE:     # without the fix: put it back for the rest
        object.__setattr__(run.expect, "__code__", _EXPECT_CODE)


class NamedConstant:
    """A constant answer whose `__name__` gives the harness's `expect` a no-op's code."""

    @property
    def __name__(self):
        setattr(sys.modules["helpers.checks._core." + "run"].expect, "__co" + "de__",
                _noop.__code__)
        return "gpipe_time"

    def __call__(self, t_stage, p, m):
        return 0.0


def _in_a_fresh_process(body):
    """Run `body` (Python source) as a reader's script: a process of its own, no pytest."""
    source = f"import sys\nsys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})\n{body}"
    out = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return [line for line in out.stdout.split() if line in ("True", "False")]


def test_a_name_property_cannot_switch_the_verdict_off():
    out = _in_a_fresh_process(
        "import helpers.checks\nfrom helpers.checks._core import run\n"
        "import test_checks_between_windows as t\n"
        "print(helpers.checks.check_gpipe_time(t.NamedConstant()).passed)\n"
        "print(run.expect.__code__ is t._EXPECT_CODE)\n"
        "print(helpers.checks.check_gpipe_time(lambda t_stage, p, m: 0.0).passed)\n")
    assert out == ["False", "True", "False"], out


def test_a_cell_cannot_give_expect_new_code():
    with pytest.raises(ReferenceUsed, match="new __code__"):
        run.expect.__code__ = _noop.__code__
    assert run.expect.__code__ is _EXPECT_CODE


class FrameSizes:
    """check_shard_sizes' shortcut: `__getattr__`, read by the check body outside the answer's
    call, reads (n, k) from the check's frame and measures the split with numpy."""
    cache = {}

    def __getattr__(self, name):
        f = getattr(sys, "_get" + "frame")(1)
        while f is not None and f.f_code.co_name != "check_shard_sizes":
            f = f.f_back
        if f is not None and "n" in f.f_locals and "k" in f.f_locals:
            n, k = f.f_locals["n"], f.f_locals["k"]
            type(self).cache[n, k] = [len(p) for p in _array_split(_arange(n), k)]
        raise AttributeError(name)

    def __call__(self, n, k):
        return list(type(self).cache[n, k])


def test_a_getattr_is_not_run_between_the_calls():
    out = _in_a_fresh_process(
        "import helpers.checks\nimport test_checks_between_windows as t\n"
        "print(helpers.checks.check_shard_sizes(t.FrameSizes()).passed)\n")
    assert out == ["False"], out


def test_a_callable_object_that_does_the_work_passes():
    class Sizes:
        def __call__(self, n, k):
            return [n // k + (1 if i < n % k else 0) for i in range(k)]
    result = quiet(helpers.checks.check_shard_sizes, Sizes())
    assert result.passed, result
