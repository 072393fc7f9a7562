"""Automatic checks for the exercises: each runs the student's code on fresh inputs and says why
an answer is wrong. A stub (raise NotImplementedError) reports "not done yet" and never raises.

A check module defines one function per exercise:

    def check_matmul_flops(fn):
        def body(fn):
            g = fresh_generator()
            ...
            expect(got == want, f"matmul_flops({n}) returned {got}, expected {want}")
        return run_check("matmul_flops", body, fn)

In a notebook the check prints one line (and shows nothing more). Under nbgrader's autograder
(`nbgrader autograde`, `nbgrader validate`: they set NBGRADER_EXECUTION) or with COURSE_GRADING=1
a check that did not pass also raises CheckFailed after printing, so the grader's test cell fails.
"""
import os
import random

import torch

__all__ = ["CheckFailed", "Result", "run_check", "expect", "fresh_generator"]

GRADING_ENVS = ("NBGRADER_EXECUTION", "COURSE_GRADING")


class CheckFailed(AssertionError):
    """A specific reason why an answer is wrong."""


class Result:
    """The outcome of a check: truthy when passed; prints as one line for the student."""

    def __init__(self, name, status, message=""):
        self.name, self.status, self.message = name, status, message

    @property
    def passed(self):
        return self.status == "passed"

    def __bool__(self):
        return self.passed

    def __repr__(self):
        mark = {"passed": "✔ passed", "not done": "… not done yet",
                "failed": "✘ failed"}[self.status]
        return f"{self.name}: {mark}" + (f": {self.message}" if self.message else "")

    def _ipython_display_(self):
        """run_check has printed the line already: a cell ending in a check shows it once."""


def grading():
    """True while an autograder runs the notebook (nbgrader sets NBGRADER_EXECUTION)."""
    return any(os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")
               for name in GRADING_ENVS)


def run_check(name, body, *args):
    """Run `body(*args)`; NotImplementedError means not done yet, CheckFailed (or any other
    exception in the student's code) means failed with its message. Prints and returns a Result;
    while grading (see `grading()`), a result that did not pass is raised as CheckFailed."""
    try:
        body(*args)
    except NotImplementedError:
        result = Result(name, "not done",
                        "replace the `raise NotImplementedError()` with your code")
    except CheckFailed as e:
        result = Result(name, "failed", str(e))
    except Exception as e:  # the student's code crashed: say how, keep the notebook running
        result = Result(name, "failed", f"your code raised {type(e).__name__}: {e}")
    else:
        result = Result(name, "passed")
    print(result)
    if not result.passed and grading():
        raise CheckFailed(repr(result))
    return result


def expect(condition, message):
    """Fail the check with `message` unless `condition` holds."""
    if not condition:
        raise CheckFailed(message)


def fresh_generator(seed=None):
    """A random generator for fresh check inputs (a new seed each call unless given).

    The seed comes from the operating system, never from torch's global generator: a check must
    not change the random numbers the rest of the notebook draws.
    """
    if seed is None:
        seed = (_SEEDS or random.SystemRandom()).randrange(2**31)
    return torch.Generator().manual_seed(seed)


# The course's own test suite replays the same draws on every run (tests/conftest.py calls
# replay_seeds per test): inputs stay fresh from call to call, and a rare unlucky draw cannot
# make CI flaky. Readers and graders always get seeds from the operating system.
_SEEDS = None


def replay_seeds(seed):
    """Draw check inputs from a sequence seeded with `seed` (None: the operating system again)."""
    global _SEEDS
    _SEEDS = None if seed is None else random.Random(seed)


def randint(g, low, high):
    """A random int in [low, high] (both included) drawn from generator `g`."""
    return int(torch.randint(low, high + 1, (), generator=g))


def as_number(value, what):
    """`value` as a Python float (ints, floats, 0-d tensors and numpy scalars), or fail saying
    what came back instead."""
    if isinstance(value, torch.Tensor):
        expect(value.numel() == 1, f"{what} returned a tensor of shape {tuple(value.shape)}, "
                                   "expected a single number")
        return float(value.item())
    expect(not isinstance(value, bool), f"{what} returned {value!r}, expected a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise CheckFailed(f"{what} returned {value!r} ({type(value).__name__}), expected a number")
