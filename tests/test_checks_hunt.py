"""The reference hunt: no course function solves an exercise while its check runs.

For every exercise check, the inputs of its first call are recorded (a spy answer); then every
public function of the course whose signature takes those inputs, and that returns on them
without raising, is handed to the check as the answer. A function that passes is a course
answer to the exercise: it must be in the check's `references=` registry (then the check refuses
it, so nothing passes here). Classes and functions that launch, save, plot or train are left out.
It calls hundreds of course functions on arbitrary inputs, which takes minutes on a loaded
machine, so it runs only when asked: `COURSE_HUNT=1 pytest tests/test_checks_hunt.py` hunts on
the exercises known to have course twins (TWINS), `COURSE_HUNT=all` on every check. A function
whose numbers are off by a unit (B/s for GB/s, seconds for ms) is a twin all the same: each number
it returns is also tried scaled by a power of 1000 (`_rescaled`).
"""
import inspect
import os
import re
import signal

import pytest

import helpers
import helpers.checks
from helpers.checks._core import REGISTRY

ALL = sorted(n for n in dir(helpers.checks) if n.startswith("check_") and n in REGISTRY)
# the whole hunt takes minutes (COURSE_HUNT=1); by default the exercises known to have a course
# twin (a function that once passed the check before it joined `references=`)
TWINS = ["check_saved_bytes", "check_order_1f1b", "check_bytes_sent_naive_vs_ring",
         "check_allreduce_spread", "check_reduce_then_broadcast", "check_global_mean_var",
         "check_split_by_params", "check_partial_sum_bytes", "check_shard_sizes",
         "check_tensor_bytes", "check_fit_copy_model"]
HUNT = os.environ.get("COURSE_HUNT", "")
CHECKS = ALL if HUNT == "all" else TWINS
SKIP = re.compile(r"launch|save|load|write|plot|show|glue|claim|train|download|run|bench|"
                  r"spawn|serve|main|figure|draw|print|record|resume|profile|sweep|time|sleep|"
                  r"checkpoint|snapshot|notebook|setup|init_process|destroy|stderr|quiet|file|"
                  r"atomic|open|close|sock|port|group|env|seed|barrier|agree")
HELPERS = sorted((name, obj) for name in dir(helpers) if not name.startswith("_")
                 and inspect.isfunction(obj := getattr(helpers, name)) and not SKIP.search(name)
                 and not obj.__module__.startswith(("helpers.runtime", "helpers.profiling")))


class _Spy(Exception):
    pass


def _first_call(check):
    """The (args, kwargs) of the check's first call of the answer (None if it never calls)."""
    seen = []

    def spy(*args, **kwargs):
        if not seen:
            seen.append((args, kwargs))
        raise NotImplementedError()
    getattr(helpers.checks, check)(spy)
    return seen[0] if seen else None


class _Late(BaseException):
    pass


def _returns(fn, args, kwargs, seconds=0.5):
    """fn(*args, **kwargs) returns (not raises) within `seconds` (an interval timer interrupts
    it, in this thread: nothing is left running)."""
    def late(*_):
        raise _Late()
    old = signal.signal(signal.SIGALRM, late)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds)
            fn(*args, **kwargs)
            ok = True
        except BaseException:     # any failure, or too slow: not a candidate
            ok = False
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Late:                 # the timer fired on the way out: too slow all the same
        ok = False
    finally:
        signal.signal(signal.SIGALRM, old)
    return ok


def _answer(fn, index=None, scale=1):
    """fn as an answer; with `index`, number `index` of what it returns times `scale`."""
    def answer(*args, **kwargs):
        out = fn(*args, **kwargs)
        if index is None:
            return out
        if isinstance(out, (int, float)):
            return out * scale
        return type(out)(x * scale if i == index else x for i, x in enumerate(out))
    return answer


def _rescaled(fn, args, kwargs):
    """fn's answers with one returned number in other units (times 1000**j, j in -3..3 but 0),
    where it returns a number or a tuple or list of at most 4 numbers."""
    try:
        out = fn(*args, **kwargs)
    except Exception:
        return []
    numbers = (out,) if isinstance(out, (int, float)) else out
    if not (isinstance(numbers, (tuple, list)) and 0 < len(numbers) <= 4
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers)):
        return []
    return [_answer(fn, i, 1000.0 ** j) for i in range(len(numbers))
            for j in (-3, -2, -1, 1, 2, 3)]


@pytest.mark.skipif(not HUNT, reason="the reference hunt runs with COURSE_HUNT=1 (minutes)")
@pytest.mark.parametrize("check", CHECKS)
def test_no_course_function_passes_a_check(check, monkeypatch, capsys):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    first = _first_call(check)
    if first is None:
        pytest.skip(f"{check} never called the answer")
    args, kwargs = first
    solved = []
    for name, fn in HELPERS:
        try:
            inspect.signature(fn).bind(*args, **kwargs)
        except (TypeError, ValueError):
            continue
        if not _returns(fn, args, kwargs):
            continue
        if any(getattr(helpers.checks, check)(answer).passed
               for answer in [_answer(fn), *_rescaled(fn, args, kwargs)]):
            solved.append(name)
    capsys.readouterr()
    assert not solved, (f"{check} passes with the course's {solved}: add them to its "
                        f"references= (exercise {REGISTRY[check].exercise!r})")
