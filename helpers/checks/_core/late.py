"""The reader's code that runs after the answer returned, while the check still judges it: a
custom `torch.autograd.Function`'s backward (or a checkpoint's recomputation) runs when the
check backpropagates through what the answer returned. So, while a check body runs:

- every backward the check runs after the first call of the answer, outside the answer's own
  calls, is a window of the answer's (`_Late`): its references blocked, the guard armed, the
  World's provenance counting it as the answer's work, and the libraries and callbacks compared
  around it as around a call (patched.py, callbacks.py), since the reader's code may run in it;
- when the body ends, the libraries and the harness's own globals are compared once more with a
  copy taken when it began, and any change fails the answer (put back first): what reader code
  left behind anywhere after a call would otherwise bend the verdict unseen;
- the route a check's backward takes into the engine (`torch.autograd._engine_run_backward`) is
  a stand-in, verified after each call of the answer (a replaced one fails);
- while the body runs, guard.py refuses a function of the libraries' or the course's given new
  code or defaults in place, and the body fails if one was tried, even outside the answer's
  calls (the same function object: none of the comparisons by identity would see it)."""
import contextlib
import threading

import torch
import torch.autograd
import torch.autograd.graph
import torch.autograd.variable

from . import defaults, imported, patched, tables
from .callbacks import callbacks, expect_no_callbacks
from .carried import rank_carried
from .guard import answering, started_by_answer
from .guard import judging as _judging
from .keys import odd_keys_message
from .outlived import answer_call, expect_joined
from .parts import wrapped_by
from .patched import expect_unpatched, snapshot
from .provenance import handed_in
from .references import blocked, code_key
from .run import CheckFailed

__all__ = ["checking", "inside", "LATE"]

# torch's engine entry, kept where a fresh import of the course (fresh.py) finds it too
_ENGINE = vars(torch.autograd.graph).setdefault("_course_engine",
                                                torch.autograd.graph._engine_run_backward)
_STATE = {"answer": None, "called": False}     # the check body running now, and whether its
_LOCAL = threading.local()                      # answer was called; per thread: inside a call
LATE = "after your function returned"


def _run_backward(*args, **kwargs):
    """torch.autograd's entry into the engine: while a check judges an answer it called, the
    check's own backward is a window of the answer's (the reader's code may run in it)."""
    answer = _late_answer()
    if answer is None:
        return _ENGINE(*args, **kwargs)
    return _LATE(answer, args, kwargs)


def _late_answer(*, _STATE=_STATE):
    """The answer a backward run now is a late window of (None: none). `_STATE` is no parameter
    of `_run_backward`, whose keywords are its caller's."""
    answer = _STATE["answer"]
    if answer is None or not _STATE["called"] or getattr(_LOCAL, "depth", 0) or (
            started_by_answer(threading.current_thread())):  # a thread of the answer's: watched
        return None
    return answer


_ROUTE = ((torch.autograd, "_engine_run_backward", _run_backward),
          (torch.autograd.graph, "_engine_run_backward", _run_backward),
          (torch.autograd, "backward", torch.autograd.backward),
          (torch.autograd, "grad", torch.autograd.grad),
          (torch.autograd.variable.Variable, "_execution_engine",
           torch.autograd.variable.Variable._execution_engine))


def _route_changed():
    """The names of the route into the engine that differ from the harness's (each put back)."""
    changed = []
    for owner, key, value in _ROUTE:
        if getattr(owner, key, None) is not value:
            changed.append(f"{getattr(owner, '__name__', owner)}.{key}")
            setattr(owner, key, value)
    return changed


class _Late:
    """Runs the check's backward as a window of the answer's. Named `__call__` like Answer's,
    so an exception out of the reader's code in it is blamed on the answer (run.py)."""

    def __call__(self, answer, args, kwargs):
        name = f"{answer.__name__} (its backward, run by the check {LATE})"
        libraries, later = snapshot(keys=False), callbacks()
        try:
            with inside(), blocked(answer.references, answer.exercise), \
                    answering(answer.keys, code_key), handed_in((), {}), answer_call() as call:
                result = _ENGINE(*args, **kwargs)
                call.judge()            # a thread its backward left running (outlived.py)
        except BaseException:
            try:
                expect_unpatched(name, libraries)
            finally:
                expect_no_callbacks(name, later)
            raise
        try:
            expect_unpatched(name, libraries)
            expect_no_callbacks(name, later)
        except Exception:       # the first cause (outlived.py)
            expect_joined(name, call, rank_carried())
            raise
        expect_joined(name, call, rank_carried())
        return result


_LATE = _Late()


@contextlib.contextmanager
def inside(*, _STATE=_STATE):
    """Around a call of the answer (or a late window): the check's backwards run in it are the
    answer's already; at its end, the route into the engine must be the harness's."""
    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    _STATE["called"] = True
    try:
        yield
    finally:
        _LOCAL.depth -= 1
    odd = patched.odd_keys()    # while the window is open: the harness's code after it looks
    if odd:                     # names up (its globals, builtins) with no key of the reader's
        raise CheckFailed(odd_keys_message("your code", odd))
    changed = _route_changed()
    if changed:
        raise CheckFailed(f"your code replaced {changed[0]}: the check's backward goes through "
                          "it after your function returns, so it may not change it (the "
                          "original is put back)")


def _changed(spaces, copies, tagged):
    """What was replaced, deleted or added in the watched namespaces since `copies` were made
    (each put back or removed), by patched.py's rules; names a library added on its own (a lazy
    import's, the first optimizer of a class hooking its step) are left. A namespace whose tag
    is the one read before the copy is unchanged (patched.copied)."""
    changed = []
    tags, then = tagged
    now_tags = tags() if tags else None
    for i, ((space, owner, _, private), saved) in enumerate(zip(spaces, copies, strict=True)):
        if tags and now_tags[i] == then[i]:
            continue
        now, own = vars(owner), patched._own(owner)
        for key, value in saved.items():
            new = now.get(key, patched._MISSING)
            if new is value:
                continue
            if own and patched._judged(owner, key, value):
                changed.append(f"{space}.{key}")
                setattr(owner, key, value)
            elif not ((patched._private(key) and not private)
                      or not patched._watched(value if new is patched._MISSING else new, space)
                      or patched._harness(new) or patched._harness(value)
                      or patched._library_wrapper(new, value)):
                changed.append(f"{space}.{key}")
                patched._restore(owner, key, value)
        for key in now.keys() - saved.keys():
            added = now[key]        # a name added (a property on torch.Tensor), as patched.py
            if (own and patched._judged(owner, key, added)) or (
                    (private or not patched._private(key)) and patched._watched(added, space)
                    and not patched._harness(added) and not patched._library_wrapper(
                        added, wrapped_by(added), added=True)):
                changed.append(f"{space}.{key}")
                delattr(owner, key)
    return changed


@contextlib.contextmanager
def checking(answer, *, _STATE=_STATE):
    """Around a check body: arms the late windows for `answer`, and compares the libraries and
    the harness's globals at the end with a copy taken at the start (fails on a change)."""
    _route_changed()          # a route replaced before the check ran is the harness's again
    spaces, _, copies, tagged = patched.copied()
    before = ((spaces, copies, tagged), patched.cells(), patched.held_defaults(),
              imported.copy(), tables.kept())
    outer = dict(_STATE)
    _STATE.update(answer=answer, called=False)
    failed, tried = True, _judging(1)
    try:
        yield
        failed = False
    finally:
        rewritten = _judging(-1, tried)
        _STATE.update(outer)
        odd = patched.odd_keys()
        changed = _changed(*before[0]) + patched.cells_changed(before[1]) + defaults.changed(
            *before[2]) + _route_changed() + imported.changed(before[3]) + tables.changed(
            before[4])
        if odd and not failed:
            raise CheckFailed(odd_keys_message(f"something of your code ran {LATE}", odd))
        if rewritten and not failed:
            raise CheckFailed(f"something of your code ran {LATE} or in it: {rewritten[0]}")
        if changed and not failed:
            raise CheckFailed(
                f"something of your code ran {LATE} (a custom autograd Function's backward, a "
                f"callback) and replaced {', '.join(sorted(changed)[:3])}: the check computes "
                "its verdict with them, so nothing may change them (the originals are put "
                "back). Leave the libraries and the course's modules as they are")


_route_changed()             # the stand-in installed


del _STATE
