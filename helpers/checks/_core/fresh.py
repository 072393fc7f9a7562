"""Grading that a notebook cannot tamper with: `regrade(check_name, answer)` runs a check from a
fresh import of the course (new module objects, under a private name, left out of sys.modules),
so a solution cell that replaced `helpers.checks.check_x`, `run_check`, `expect` or any other
part of the checks and the harness does not change the verdict.

The student edition's check cells call it in a hidden test (scripts/student_edition.py), loading
this file by its path, not through `helpers`:

    ### BEGIN HIDDEN TESTS
    (import this file by path)(...).regrade("check_shard_sizes", shard_sizes)
    ### END HIDDEN TESTS

What it cannot stop: a notebook that rewrites Python's import system or torch itself; nbgrader's
locked cells and hidden tests are the guard there. This file imports nothing from the course at
its top, so that it can be loaded alone.
"""
import contextlib
import importlib
import importlib.util
import io
import itertools
import pathlib
import sys

import torch.autograd.graph

__all__ = ["HELPERS", "fresh_course", "regrade"]

_COUNTER = itertools.count()
_FIELDS = object.__getattribute__        # bound now: the verdict is read past Result's methods


class _Verdict:
    """regrade's own reading of a check's Result: the status its instance holds, read without any
    method of the Result class (a notebook's answer reaches that class while it runs and could
    give it a `__bool__` or a `passed` that says "passed")."""

    @staticmethod
    def passed(result, kind):
        if type(result) is not kind:
            return False
        status = _FIELDS(result, "__dict__").get("status")
        return type(status) is str and str.__eq__(status, "passed") is True
HELPERS = pathlib.Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def fresh_course():
    """A new import of the helpers package (this file's) under a private name, made now, after
    every cell of the notebook ran: no cell can have touched it. Dropped afterwards."""
    name = f"_graded_helpers_{next(_COUNTER)}"
    taken = _engine_route()
    spec = importlib.util.spec_from_file_location(
        name, HELPERS / "__init__.py", submodule_search_locations=[str(HELPERS)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    try:
        spec.loader.exec_module(package)
        yield importlib.import_module(f"{name}.checks")
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        for owner, key, value in taken:      # the harness loaded before the copy takes it back
            setattr(owner, key, value)


def _engine_route():
    """The names a copy's late.py takes over process-wide when it is imported (torch's route
    into the autograd engine), with what they hold now."""
    return [(owner, "_engine_run_backward", owner._engine_run_backward)
            for owner in (torch.autograd, torch.autograd.graph)]


def regrade(check_name, answer):
    """Run `check_name` of a fresh import on `answer`; raise AssertionError unless it passes."""
    with fresh_course() as checks:
        check, core = getattr(checks, check_name), checks._core
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                result = check(answer)
        except (core.CheckFailed, core.HarnessError) as e:
            message = str(e)
        else:
            if _Verdict.passed(result, core.Result):
                return result
            message = repr(result)
    print(f"graded again from a fresh import of the checks: {message}")
    raise AssertionError(message)
