"""An exception the answer raises is turned into words while its call is still watched
(raised.py): nothing of the reader's code runs when the check words its verdict after the call.
Each shortcut answer here does nothing but raise, and its words (its class's `__str__`, its
argument's, its metaclass's `__name__`, its `__class__`, its module's `__loader__`) give the
harness's Result class properties that read "passed"; each must fail. A plain exception keeps
its words, and a stub still reads "not done yet"."""
import contextlib
import io
import sys
import types

import pytest

import helpers.checks
from helpers.checks._core import fresh, run


@pytest.fixture(autouse=True)
def result_class_kept(monkeypatch):
    """Put Result's namespace back whatever the answer did to it (the fix does too)."""
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    kept = dict(vars(run.Result))
    yield
    for key in set(vars(run.Result)) - set(kept):
        delattr(run.Result, key)
    for key, value in kept.items():
        if vars(run.Result).get(key) is not value:
            setattr(run.Result, key, value)


def _forge():
    """What each shortcut's words do: the Result being built reads "passed", no message."""
    result = sys.modules["helpers.checks._core." + "run"].Result
    if "_forged" in vars(result):
        return "x"

    def field(attr, forged):
        return property(lambda self: forged,
                        lambda self, v: self.__dict__.__setitem__(attr, v))
    result.status, result.message = field("status", "passed"), field("message", "")
    result._forged = True
    return "x"


class Oops(Exception):
    def __str__(self):
        return _forge()


class Words:
    def __str__(self):
        return _forge()

    __repr__ = __str__


class Named(type):
    @property
    def __name__(cls):
        return _forge()


class Lying(Exception, metaclass=Named):
    pass


class Claims(Exception):
    @property
    def __class__(self):
        _forge()
        return ValueError


def _raising(make):
    def answer(*args, **kwargs):
        raise make()
    return answer


SHORTCUTS = {
    "its class's __str__": _raising(Oops),
    "its argument's __str__ (a ValueError)": _raising(lambda: ValueError(Words())),
    "two arguments' __repr__": _raising(lambda: RuntimeError("a", Words())),
    "its metaclass's __name__": _raising(Lying),
    "a __class__ property": _raising(Claims),
    "a note": _raising(lambda: _noted(ValueError("bad"))),
    "its cause's __str__": _raising(lambda: _caused(ValueError("bad"), Oops())),
}


def _noted(e):
    e.__notes__ = [Words()]
    return e


def _caused(e, cause):
    e.__cause__ = cause
    return e


def _judge(check, answer):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        result = check(answer)
    return result, out.getvalue()


@pytest.mark.parametrize("how", list(SHORTCUTS))
@pytest.mark.parametrize("check", ["check_matmul_flops", "check_dp_average"])
def test_words_of_a_raised_exception_cannot_forge_the_verdict(how, check):
    result, line = _judge(getattr(helpers.checks, check), SHORTCUTS[how])
    assert result.status == "failed" and "✘ failed" in line, (how, line)
    assert "_forged" not in vars(run.Result), how


def test_under_grading_and_from_a_fresh_import(monkeypatch):
    monkeypatch.setenv("COURSE_GRADING", "1")
    with pytest.raises(AssertionError), contextlib.redirect_stdout(io.StringIO()):
        helpers.checks.check_matmul_flops(SHORTCUTS["its class's __str__"])
    with pytest.raises(AssertionError):
        fresh.regrade("check_matmul_flops", SHORTCUTS["its argument's __str__ (a ValueError)"])


def test_a_module_loader_is_not_asked_for_source_lines(tmp_path):
    """Words of a traceback read source lines through a module's `__loader__` (linecache): a
    module of the reader's with a loader of its own must not be asked after the call."""
    source = "def answer(*args):\n    raise ValueError('bad')\n"
    path = tmp_path / "answer_with_loader.py"     # not on disk: linecache asks the loader
    module = types.ModuleType("answer_with_loader")
    module.__file__ = str(path)

    class Loader:
        def get_source(self, name):
            _forge()
            return source
    module.__loader__ = Loader()
    exec(compile(source, str(path), "exec"), vars(module))
    for check in ("check_matmul_flops", "check_dp_average"):
        result, _ = _judge(getattr(helpers.checks, check), module.answer)
        assert result.status == "failed" and "_forged" not in vars(run.Result), check


def test_a_plain_exception_keeps_its_words():
    def matmul_flops(n):
        raise ValueError(f"no flops for {n}")
    result, line = _judge(helpers.checks.check_matmul_flops, matmul_flops)
    assert result.status == "failed"
    assert "your code raised ValueError: no flops for" in result.message, result.message
    assert "(in matmul_flops, line" in result.message


def test_a_class_of_the_readers_is_named_beside_its_words():
    class ShapeError(ValueError):
        pass

    def matmul_flops(n):
        raise ShapeError("wrong shape")
    result, _ = _judge(helpers.checks.check_matmul_flops, matmul_flops)
    assert result.status == "failed"
    assert "ValueError: wrong shape (raised as ShapeError)" in result.message, result.message


def test_a_stub_still_reads_not_done():
    def matmul_flops(n):
        raise NotImplementedError()
    result, _ = _judge(helpers.checks.check_matmul_flops, matmul_flops)
    assert result.status == "not done", result
