"""A code object's constants are read by exact type: the harness keys code by what it is
(its bytecode, names and constants, nested code included) to tell the course's functions from
the reader's, and walks nested code; a constant that is an object of the reader's class (put
there by `CodeType.replace`) is keyed by identity, so none of its methods (`__repr__`,
`__class__`, `__eq__`, `__hash__`) runs inside the harness."""
import contextlib
import io
import types

import pytest

import helpers.checks

RAN = []


class Meta(type):
    def __eq__(cls, other):
        RAN.append("metaclass __eq__")
        return False

    __hash__ = type.__hash__


class Spy(metaclass=Meta):
    """Records every method of it that runs."""

    def __repr__(self):
        RAN.append("__repr__")
        return "Spy()"

    def __eq__(self, other):
        RAN.append("__eq__")
        return False

    def __hash__(self):
        RAN.append("__hash__")
        return 0

    @property
    def __class__(self):
        RAN.append("__class__")
        return int


def shard_sizes(n, k):
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


def _with_spies(fn):
    """`fn` whose code holds, unused, a Spy as a constant and in a tuple."""
    code = fn.__code__
    code = code.replace(co_consts=code.co_consts + (Spy(), (1, Spy()), frozenset({2})))
    return types.FunctionType(code, fn.__globals__, fn.__name__)


@pytest.fixture(autouse=True)
def plain_run(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    RAN.clear()


@pytest.mark.parametrize("grading", [False, True], ids=["reader", "grading"])
def test_no_method_of_a_code_constant_runs(grading, monkeypatch):
    if grading:
        monkeypatch.setenv("COURSE_GRADING", "1")
    answer = _with_spies(shard_sizes)
    with contextlib.redirect_stdout(io.StringIO()):
        result = helpers.checks.check_shard_sizes(answer)
    assert RAN == [], f"the harness ran the reader's constants' methods: {RAN}"
    assert result.passed, result
