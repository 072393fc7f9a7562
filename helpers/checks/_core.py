"""Automatic checks for the exercises: each runs the student's code on fresh inputs and says why
an answer is wrong. A stub (raise NotImplementedError) reports "not done yet" and never raises."""
import torch

__all__ = ["CheckFailed", "Result", "run_check", "expect", "fresh_generator"]


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
        mark = {"passed": "✔ passed", "not done": "… not done yet", "failed": "✘ failed"}[self.status]
        return f"{self.name}: {mark}" + (f": {self.message}" if self.message else "")


def run_check(name, body, *args):
    """Run `body(*args)`; NotImplementedError means not done yet, CheckFailed (or any other
    exception in the student's code) means failed with its message."""
    try:
        body(*args)
    except NotImplementedError:
        result = Result(name, "not done", "replace the `raise NotImplementedError()` with your code")
    except CheckFailed as e:
        result = Result(name, "failed", str(e))
    except Exception as e:  # the student's code crashed: say how, keep the notebook running
        result = Result(name, "failed", f"your code raised {type(e).__name__}: {e}")
    else:
        result = Result(name, "passed")
    print(result)
    return result


def expect(condition, message):
    """Fail the check with `message` unless `condition` holds."""
    if not condition:
        raise CheckFailed(message)


def fresh_generator(seed=None):
    """A random generator for fresh check inputs (a new seed each call unless given)."""
    return torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
