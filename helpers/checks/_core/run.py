"""Running a check: one line for the reader, an exception for a grader, and the blame where it
belongs: on the answer (failed, not done yet) or on the check itself (an error of the harness).

A check is declared with `@check`: its exercise, what it observes (for book/teachers.md) and the
course's references that the answer may not use (see references.py):

    @check("matmul_flops", observes=["the number returned for fresh sizes n"])
    def check_matmul_flops(fn):
        g = fresh_generator()
        ...
        expect(got == want, f"matmul_flops({n}) returned {got}, expected {want}")

In a notebook the check prints one line. Under nbgrader's autograder (it sets
NBGRADER_EXECUTION) or with COURSE_GRADING=1 a check that did not pass also raises, so the
grader's test cell fails.
"""
import dis
import functools
import inspect
import os
import pathlib
import sys
import sysconfig

from .keys import str_keys

__all__ = ["CheckFailed", "HarnessError", "ReferenceUsed", "Result", "run_check", "expect",
           "grading", "REGISTRY", "CheckInfo", "is_reader_code", "stand_in", "observer_failed"]

GRADING_ENVS = ("NBGRADER_EXECUTION", "COURSE_GRADING")
_ENVIRON = os.environ            # bound at import: an answer that rebinds os.environ leaves it
_STDOUT = sys.__stdout__         # the process's own stream, for a stdout that is the reader's


class CheckFailed(AssertionError):
    """A specific reason why an answer is wrong."""


class HarnessError(RuntimeError):
    """The check itself could not judge the answer (a limit of the simulation, a bug of the
    check): never reported as the reader's mistake."""


def observer_failed(what, exc):
    """The HarnessError for an exception out of the harness's own bookkeeping that runs inside
    the answer's call (a Recorder's record of an operation, a hook tapping a gradient): the
    check could not watch, the answer did nothing wrong (run.py blames it on the check)."""
    return HarnessError(f"{what} failed ({_type_name(type(exc))}: {_describe(exc)}): the "
                        "check's own limit, not a verdict on your answer")


class ReferenceUsed(BaseException):
    """Raised inside the answer when it calls a reference the exercise asks it to write. A
    BaseException, so an answer's `except Exception` cannot swallow it."""


class Result:
    """The outcome of a check: truthy when passed; prints as one line for the reader."""

    MARKS = {"passed": "✔ passed", "not done": "… not done yet", "failed": "✘ failed",
             "error": "⚠ the check itself failed (not your answer)"}

    def __init__(self, name, status, message=""):
        self.name, self.status, self.message = name, status, message

    @property
    def passed(self):
        return self.status == "passed"

    def __bool__(self):
        return self.passed

    def __repr__(self):
        return f"{self.name}: {self.MARKS[self.status]}" + (
            f": {self.message}" if self.message else "")

    def _ipython_display_(self):
        """run_check has printed the line already: a cell ending in a check shows it once."""


def grading():
    """True while an autograder runs the notebook (nbgrader sets NBGRADER_EXECUTION)."""
    return any(_ENVIRON.get(name, "").strip().lower() not in ("", "0", "false", "no")
               for name in GRADING_ENVS)


# --- whose code raised? -----------------------------------------------------------------------
# The reader's code is whatever is not the course's helpers, torch, an installed package or the
# standard library: a notebook cell, a test file, a script.
_HELPERS = pathlib.Path(__file__).resolve().parents[2]
_LIBRARIES = {pathlib.Path(p).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")
              if (p := sysconfig.get_paths().get(key))}
_LIBRARIES = frozenset(_LIBRARIES)
_LIBRARIES |= {pathlib.Path(p).resolve() for p in sys.path if "site-packages" in p}


def is_reader_code(filename, _type=type):
    """True when `filename` (a code object's co_filename) holds the reader's code; a name that
    is not an exact str (`code.replace(co_filename=MyStr(...))`) is the reader's, and none of
    its methods (`__hash__`, `startswith`) runs."""
    return _type(filename) is not str or _reader_file(filename)


def _dir_key(path):
    st = os.stat(path)
    return st.st_dev, st.st_ino


# The roots by (device, inode): a file is the course's or a library's when one of its folders is
# one of them, found by os.stat (a symlinked venv or worktree is the same folder).
_ROOTS = frozenset(_dir_key(p) for p in (_HELPERS, *_LIBRARIES) if p.is_dir())


@functools.lru_cache(maxsize=4096)
def _reader_file(filename, _cwd=os.getcwd):
    """Whether `filename` is outside every root. Cached, and judged at any moment (the audit
    hook, an answer's call): only C functions bound at import run (_outside), none looked up in a
    module or in builtins, so an answer that replaced `any`, `len` or pathlib's helpers cannot
    make a harness file the reader's (a cached wrong verdict refused later right answers)."""
    if filename.startswith("<frozen"):
        return False
    if filename.startswith("<"):
        return True                      # <ipython-input-…>, <stdin>, exec'd cells
    return _outside(filename if filename.startswith("/") else _cwd() + "/" + filename)


def _outside(path, _lstat=os.lstat, _readlink=os.readlink, _rpartition=str.rpartition,
             _roots=_ROOTS, _error=(OSError, ValueError), _hops=range(40)):
    """True when no folder of the absolute `path` is a root, its links followed (a folder that
    links into a root is in it): the folders read bottom-up, from a link's target on."""
    for _ in _hops:
        head, tail = path, ""
        while True:
            head, sep, name = _rpartition(head, "/")
            if not sep:
                return True
            tail = "/" + name + tail
            try:
                st = _lstat(head or "/")
            except _error:
                continue
            if st.st_mode & 0o170000 == 0o120000:      # a link: go on from where it points
                target = _readlink(head)
                path = (target if target.startswith("/") else
                        _rpartition(head, "/")[0] + "/" + target) + tail
                break
            if (st.st_dev, st.st_ino) in _roots:
                return False
    return True                          # (a loop of links)


_MAKERS = ("collections/__init__.py", "dataclasses.py")     # the stdlib's generated methods


def is_reader_function(fn, setter):
    """True when `fn` is the reader's: its code's file is (is_reader_code) and, for code compiled
    from a string (`<...>`: a cell, but also namedtuple's and dataclasses' generated methods),
    so is the module it runs in: a course class's generated `__new__` is not. `setter`, the
    frame changing it: the stdlib's maker setting up a method it made passes."""
    filename = fn.__code__.co_filename
    if not is_reader_code(filename) or not filename.startswith("<"):
        return is_reader_code(filename)
    made = setter.f_code.co_filename if setter is not None else ""
    if made.startswith(sysconfig.get_paths()["stdlib"]) and made.endswith(_MAKERS):
        return True
    g = fn.__globals__          # the reader's: looked up only if a plain dict keyed by strs
    if type(g) is not dict or not str_keys(g):
        return False            # (a key's `__eq__` would run here with the hook off)
    name = dict.get(g, "__name__")
    if (name is not None and type(name) is not str) or not str_keys(sys.modules):
        return False
    module = sys.modules.get(name) if name not in (None, "__main__") else None
    if name not in (None, "__main__") and module is None:
        return False                     # namedtuple's own namespace ("namedtuple_Transfer")
    file = getattr(module, "__file__", None)
    return file is None or is_reader_code(file)


_DECLARE = str(pathlib.Path(__file__).with_name("declare.py"))
_ENTRIES = (_DECLARE, str(pathlib.Path(__file__).with_name("late.py")))   # the answer's windows


def _blame(exc, declared):
    """("stub" | "answer" | "harness", frame) for an exception out of a check body. In a
    declared check the answer is what ran inside Answer.__call__; in an older check, whatever
    passed through the reader's files. A HarnessError the harness raised is the check's own,
    wherever it ran (a hook or a Recorder's record inside the answer's call: observer_failed)."""
    frames = _frames(_traceback_of(exc))
    if issubclass(type(exc), HarnessError) and frames and not is_reader_code(frames[-1].filename):
        return "harness", frames[-1]     # raised by the harness, inside the answer's call too
    if declared:
        calls = [i for i, f in enumerate(frames) if f.filename in _ENTRIES and f.name == "__call__"]
        inside = frames[calls[0] + 1:] if calls else []
    else:
        inside = frames
    reader = [f for f in inside if is_reader_code(f.filename)]
    if not inside or not reader:
        return "harness", frames[-1] if frames else None
    if issubclass(type(exc), NotImplementedError) and is_reader_code(frames[-1].filename):
        return "stub", frames[-1]
    return "answer", reader[-1]


class _Frame:
    """Where a traceback entry ran (what `traceback.extract_tb` gives, without reading source
    lines: linecache would ask the loader a module's globals name, which may be the reader's)."""
    __slots__ = ("filename", "name", "lineno")

    def __init__(self, tb):
        code = tb.tb_frame.f_code
        self.filename, self.name, self.lineno = code.co_filename, code.co_name, tb.tb_lineno


def _frames(tb):
    frames = []
    while tb is not None:
        frames.append(_Frame(tb))
        tb = tb.tb_next
    return frames


def _interrupt(exc):
    """True for a KeyboardInterrupt the reader's code did not raise with a `raise` statement: the
    kernel interrupted (a signal lands on whatever instruction runs), so it propagates."""
    tb = _traceback_of(exc)
    if not issubclass(type(exc), KeyboardInterrupt) or tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code.co_code
    return not (0 <= tb.tb_lasti < len(code) and code[tb.tb_lasti] in _RAISES)


_RAISES = frozenset(dis.opmap[name] for name in ("RAISE_VARARGS", "RERAISE") if name in dis.opmap)


def _answer_error(exc, frame):
    where = f" (in {frame.name}, line {frame.lineno})" if frame and frame.name != "<module>" else ""
    return f"your code raised {_type_name(type(exc))}: {_describe(exc)}{where}"


def run_check(name, body, *args, declared=False):
    """Run `body(*args)` and report: CheckFailed -> failed with its message; the stub's
    NotImplementedError -> not done yet; an exception out of the reader's code -> failed, saying
    what it raised (SystemExit, GeneratorExit and a KeyboardInterrupt it raises included; the
    harness's own ReferenceUsed and the kernel's interrupt propagate); any other exception -> an
    error of the check itself. Prints and returns a Result; while grading, a result that did
    not pass is raised (CheckFailed, or HarnessError).
    The grading switch, the output stream and the reader's trace functions (taken off: they
    could rewrite the check's locals) are settled before anything runs, so the answer cannot
    change how its verdict is reported; the verdict is fixed before it is printed."""
    early = taken_off()              # first: a tracer of the reader's sees each line until then
    graded, say = grading(), verdict_writer(sys.stdout, _STDOUT)
    try:
        if early:
            raise CheckFailed(early)
        body(*args)
    except CheckFailed as e:
        result = Result(name, "failed", _describe(e))
    except ReferenceUsed as e:
        result = Result(name, "failed", _describe(e))
    except BaseException as e:   # sorted out below, never lost
        kind, frame = _blame(e, declared)
        if not issubclass(type(e), Exception) and (kind == "harness" or _interrupt(e)):
            raise                    # the harness's own, or the kernel interrupted
        if kind == "stub":
            result = Result(name, "not done",
                            "replace the `raise NotImplementedError()` with your code")
        elif kind == "answer":
            result = Result(name, "failed", _answer_error(e, frame))
        else:
            where = f" at {pathlib.Path(frame.filename).name}:{frame.lineno}" if frame else ""
            result = Result(name, "error", f"{_type_name(type(e))}: {_describe(e)}{where}. "
                                           "Please report it; "
                                           "your answer was not judged")
    else:
        result = Result(name, "passed")
    line, status, message = repr(result), result.status, result.message
    say(line + "\n")
    if status != "passed" and graded:
        raise (HarnessError if status == "error" else CheckFailed)(line)
    return Result(name, status, message)


def expect(condition, message):
    """Fail the check with `message` unless `condition` holds."""
    if not condition:
        raise CheckFailed(message)


# --- declared checks --------------------------------------------------------------------------
class CheckInfo:
    """What a check declares: its exercise, what it observes, the references it blocks."""

    def __init__(self, name, exercise, observes, references, module):
        self.name, self.exercise, self.module = name, exercise, module
        self.observes, self.references = tuple(observes), tuple(references)

    def __repr__(self):
        return f"CheckInfo({self.name!r}, exercise={self.exercise!r})"


REGISTRY = {}   # check function name -> CheckInfo, filled by @check at import


def stand_in(original):
    """functools.wraps without `__wrapped__`: a harness stand-in looks like what it replaces
    (name, doc, module) but does not hand the original it guards or watches to the answer. Where
    the original wraps another (torch's logged collectives), so does the stand-in: a twin of
    itself, so `dist.all_reduce.__wrapped__(t)`, right on torch, runs the stand-in's code."""
    def decorate(fn):
        fn = functools.wraps(original)(fn)
        del fn.__wrapped__
        try:                # inspect.signature reads the original's: a right answer may ask it
            fn.__signature__ = inspect.signature(original)
        except (TypeError, ValueError):     # a C function that keeps no signature
            pass
        space = getattr(original, "__dict__", None)
        inner = space.get("__wrapped__") if type(space) is dict and str_keys(space) else None
        if inner is not None:
            twin = type(fn)(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                            fn.__closure__)
            twin.__kwdefaults__ = fn.__kwdefaults__
            fn.__wrapped__ = stand_in(inner)(twin)
        return fn
    return decorate


EMPTIED = ("your code emptied the check's list of what watches tensor values leaving torch "
           "(exits.py): an answer computes, it leaves the grader be")


def stand_in_below(frame, filename):
    """Whether a watching stand-in of `filename` (a function named `method` there, whichever
    import of the course made it) runs at or below `frame`: an exit inside another is one."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "method" and code.co_filename == filename:
            return True
        frame = frame.f_back
    return False


# bound once this module's names exist (early_hooks.py and what it imports need them); the
# package imports this module first (_core/__init__.py), so run_check never imports at run time
from .early_hooks import taken_off, verdict_writer  # noqa: E402
from .raised import describe as _describe  # noqa: E402
from .raised import traceback_of as _traceback_of  # noqa: E402
from .raised import type_name as _type_name  # noqa: E402
