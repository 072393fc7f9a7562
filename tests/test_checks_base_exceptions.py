"""A BaseException that is not an Exception (SystemExit, KeyboardInterrupt, GeneratorExit) out of
the answer ends the check like any error of the reader's code: one verdict line and a failed
Result, "your code raised ...", under grading a CheckFailed (run.py's contract). The harness's
own ReferenceUsed keeps its words, and the kernel's interrupt (a signal, not a `raise` of the
reader's) still stops the check."""
import contextlib
import io
import signal
import sys

import pytest

import helpers.checks
from helpers.checks._core import fresh


def _raising(kind):
    def gpipe_time(t_stage, p, m):
        raise kind(0)
    return gpipe_time


def _exit(t_stage, p, m):
    sys.exit("done")


@pytest.mark.parametrize("answer", [_raising(SystemExit), _raising(KeyboardInterrupt),
                                    _raising(GeneratorExit), _exit],
                         ids=["SystemExit", "KeyboardInterrupt", "GeneratorExit", "sys.exit"])
def test_a_base_exception_of_the_answer_fails_it(answer, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = helpers.checks.check_gpipe_time(answer)
    assert result.status == "failed" and "your code raised" in result.message, result
    assert out.getvalue().count("\n") == 1 and "your code raised" in out.getvalue()


def test_under_grading_it_is_a_check_failure(monkeypatch):
    monkeypatch.setenv("COURSE_GRADING", "1")
    with pytest.raises(AssertionError, match="your code raised SystemExit"), \
            contextlib.redirect_stdout(io.StringIO()):
        helpers.checks.check_gpipe_time(_raising(SystemExit))
    with pytest.raises(AssertionError, match="your code raised KeyboardInterrupt"):
        fresh.regrade("check_gpipe_time", _raising(KeyboardInterrupt))


def test_in_a_rank_of_a_world(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)

    def average_bucket(grads):
        sys.exit(1)
    with contextlib.redirect_stdout(io.StringIO()):
        result = helpers.checks.check_average_bucket(average_bucket)
    assert result.status == "failed" and "your code raised SystemExit" in result.message, result


def test_the_kernels_interrupt_still_stops_the_check():
    def gpipe_time(t_stage, p, m):
        signal.raise_signal(signal.SIGINT)      # as the kernel's interrupt button does
        return 0.0
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), contextlib.redirect_stdout(io.StringIO()):
            helpers.checks.check_gpipe_time(gpipe_time)
    finally:
        signal.signal(signal.SIGINT, saved)
