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
it returns is also tried scaled by a power of 1000 (`_rescaled`). `COURSE_HUNT=zero,fsdp2` hunts
on the checks of those chapters' modules (or `COURSE_HUNT=check_x,check_y` on those checks).

A reader composes a course function too, which a call on the check's inputs as they are never
finds (`_composed`): one layer of a list of modules at a time, given its parameter count (padded
to a multiple of the world size) and summed; with a mode string more (a word of the exercise's
name: "zero3" for zero3_sent_bytes); one number read out of a dict it returns; a tracker class
whose method, handed a module's parameters, is a context manager the module runs in (Part VI's
LiveActivations), its numbers read after; a function of a count searched for the fewest count
that meets the one float input (`_searched`: microbatches_for_bubble through unequal_bubble of
equal stages, a call on the inputs as they are never makes that loop).
"""
import inspect
import os
import re
import signal

import pytest
from torch import nn

import helpers
import helpers.checks
from helpers.checks._core import REGISTRY

ALL = sorted(n for n in dir(helpers.checks) if n.startswith("check_") and n in REGISTRY)
# the whole hunt takes minutes (COURSE_HUNT=1); by default the exercises known to have a course
# twin (a function that once passed the check before it joined `references=`)
TWINS = ["check_saved_bytes", "check_order_1f1b", "check_bytes_sent_naive_vs_ring",
         "check_allreduce_spread", "check_reduce_then_broadcast", "check_global_mean_var",
         "check_split_by_params", "check_partial_sum_bytes", "check_shard_sizes",
         "check_tensor_bytes", "check_fit_copy_model", "check_zero3_sent_bytes",
         "check_saved_bytes_of_call", "check_microbatches_for_bubble"]
HUNT = os.environ.get("COURSE_HUNT", "")
NAMED = set(HUNT.split(",")) - {"", "1", "all"}
CHECKS = (ALL if HUNT == "all" else [c for c in ALL if c in NAMED or REGISTRY[c].module.rsplit(
    ".", 1)[-1] in NAMED] if NAMED else TWINS)
SKIP = re.compile(r"launch|save|load|write|plot|show|glue|claim|train|download|run|bench|"
                  r"spawn|serve|main|figure|draw|print|record|resume|profile|sweep|time|sleep|"
                  r"checkpoint|snapshot|notebook|setup|init_process|destroy|stderr|quiet|file|"
                  r"atomic|open|close|sock|port|group|env|seed|barrier|agree|mnist|ensure|"
                  r"dump|dir|path|cache|anim")
# a function that reads or writes a file: an int handed as its path is a file descriptor
# (open(2) closes stderr when the file object goes)
FILES = re.compile(r"path|file|root|dir|notebook|url")
HELPERS = sorted((name, obj) for name in dir(helpers) if not name.startswith("_")
                 and inspect.isfunction(obj := getattr(helpers, name)) and not SKIP.search(name)
                 and not obj.__module__.startswith(("helpers.runtime", "helpers.profiling"))
                 and not any(map(FILES.search, inspect.signature(obj).parameters)))
CLASSES = sorted((name, obj) for name in dir(helpers) if not name.startswith("_")
                 and inspect.isclass(obj := getattr(helpers, name)) and not SKIP.search(name)
                 and obj.__module__.startswith("helpers.")
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


def _number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _readings(out):
    """Ways to read one number out of what a course function returned: the number itself, a
    dict's numeric entry (or a list of numbers in it, summed), an object's numeric attribute."""
    if _number(out):
        return [lambda o: o]
    items = out if isinstance(out, dict) else vars(out) if hasattr(out, "__dict__") else {}
    found = []
    for key, value in items.items():
        get = ((lambda o, k=key: o[k]) if isinstance(out, dict) else
               (lambda o, k=key: getattr(o, k)))
        if _number(value):
            found.append(get)
        elif isinstance(value, (list, tuple)) and value and all(map(_number, value)):
            found.append(lambda o, get=get: sum(get(o)))
    return found


def _words(check):
    """The words of the check's exercise name, alone and two by two: the modes a reader might
    hand a course function ("zero3" of zero3_sent_bytes)."""
    parts = REGISTRY[check].exercise.split("_")
    return [*parts, *("_".join(pair) for pair in zip(parts, parts[1:]))]


def _ways(args, check):
    """Calls a reader might make of a course function on the check's inputs: each a function of
    (fn, the inputs of one call) -> the outputs to sum. One layer of a list of modules at a time
    (the layer, its parameter count, or that count padded to a multiple of an int input, then the
    other int inputs), and the inputs as they are, each with a word of the exercise's name more."""
    ints = [i for i, a in enumerate(args) if _number(a) and isinstance(a, int)]
    extras = [()] + [(w,) for w in _words(check)]
    ways = [lambda fn, a, x=x: [fn(*a, *x)] for x in extras[1:]]
    for i, a in enumerate(args):
        if not (isinstance(a, (list, tuple)) and a and all(isinstance(m, nn.Module) for m in a)):
            continue
        sizes = [lambda m, a: m, lambda m, a: sum(p.numel() for p in m.parameters())]
        sizes += [lambda m, a, j=j: -(-sum(p.numel() for p in m.parameters()) // a[j]) * a[j]
                  for j in ints]
        for size in sizes:
            for x in extras:
                ways.append(lambda fn, a, i=i, size=size, x=x: [
                    fn(size(m, a), *(a[j] for j in ints), *x) for m in a[i]])
    return ways


def _tracked(cls, args):
    """Answers from a tracker class: made with no arguments, a method of it handed the module
    argument's parameters gives a context manager the module runs in on the other inputs; a
    number of what it yields, or of the tracker, read after."""
    if not (args and isinstance(args[0], nn.Module)):
        return []
    found = []
    for name, _ in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_"):
            continue

        def run(a, name=name):
            tracker = cls()
            with getattr(tracker, name)(list(a[0].parameters())) as inside:
                out = a[0](*a[1:])
            return out, inside, tracker
        try:
            if not _returns(run, (args,), {}):
                continue
            _, inside, tracker = run(args)
        except BaseException:
            continue
        for which, obj in ((1, inside), (2, tracker)):
            found += [lambda *a, read=read, which=which, run=run: read(run(a)[which])
                      for read in _readings(obj)]
    return found


def _composed(fn, args, check):
    """fn composed as a reader would (`_ways`, `_readings`): the answers whose first call
    returns."""
    found = []
    for way in _ways(args, check):
        try:
            if not _returns(way, (fn, args), {}):
                continue
            outs = way(fn, args)
        except BaseException:
            continue
        if outs:
            found += [lambda *a, way=way, read=read: sum(read(o) for o in way(fn, a))
                      for read in _readings(outs[0])]
    return found


def _searched(fn, args):
    """fn inverted as a reader would search it: the fewest count m (1 to 512) for which fn of
    the int inputs and m (with a 1 more: one chunk, one of anything), or of p equal stages
    (forward and backward lists of p ones) and m, is at most the one float input
    (microbatches_for_bubble through any bubble of the course). The answers whose first call
    returns a count."""
    ints = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
    floats = [a for a in args if isinstance(a, float)]
    if not (ints and len(floats) == 1 and len(ints) + 1 == len(args)):
        return []
    forms = [lambda a, m: (*a, m), lambda a, m: (*a, m, 1),
             lambda a, m: ([1.0] * a[0], [1.0] * a[0], m)]
    found = []
    for form in forms:
        def answer(*a, form=form):
            whole = [x for x in a if isinstance(x, int) and not isinstance(x, bool)]
            target = next(x for x in a if isinstance(x, float))
            return next(m for m in range(1, 513) if fn(*form(whole, m)) <= target + 1e-12)
        if _returns(answer, args, {}):
            found.append(answer)
    return found


@pytest.mark.skipif(not HUNT, reason="the reference hunt runs with COURSE_HUNT=1 (minutes)")
@pytest.mark.parametrize("check", CHECKS)
def test_no_course_function_passes_a_check(check, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)      # a word handed as a path writes nothing into the tree
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    first = _first_call(check)
    if first is None:
        pytest.skip(f"{check} never called the answer")
    args, kwargs = first
    solved = []
    for name, fn in HELPERS:
        answers = [] if kwargs else _composed(fn, args, check) + _searched(fn, args)
        try:
            inspect.signature(fn).bind(*args, **kwargs)
            if _returns(fn, args, kwargs):
                answers += [_answer(fn), *_rescaled(fn, args, kwargs)]
        except (TypeError, ValueError):
            pass
        if any(getattr(helpers.checks, check)(answer).passed for answer in answers):
            solved.append(name)
    for name, cls in CLASSES:
        if not kwargs and any(getattr(helpers.checks, check)(answer).passed
                              for answer in _tracked(cls, args)):
            solved.append(name)
    capsys.readouterr()
    assert not solved, (f"{check} passes with the course's {solved}: add them to its "
                        f"references= (exercise {REGISTRY[check].exercise!r})")
