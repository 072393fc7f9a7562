"""Shortcuts that read the check's own state, tried on any exercise (tests/check_cases.py's
form): its frame (walked, computed names, from a traceback, from another thread, by inspect or
by traceback's walkers), the garbage collector. Each must fail in the harness, no expected value
is in a frame while the answer runs, and a right answer that prints a traceback it caught passes."""
import gc
import inspect
import sys

import pytest
from check_cases import other, parametrize_cases, shortcut

import helpers

PEEK = "inspects the running program"


# ---- reading the check: its frame, its traceback, the garbage collector --------------------------
def _peek(name):
    """The nearest caller's local `name` (the check's expected value)."""
    f = sys._getframe(1)
    while f is not None:
        if name in f.f_locals:
            return f.f_locals[name]
        f = f.f_back
    return 0


def _peek_hidden(name):
    """The same walk, every name computed (nothing for a reader of the bytecode to see)."""
    f = getattr(sys, "_get" + "frame")(1)
    while f is not None:
        scope = getattr(f, "f_" + "locals")
        if name in scope:
            return scope[name]
        f = getattr(f, "f_" + "back")
    return 0


def _peek_traceback(name):
    try:
        raise RuntimeError
    except RuntimeError as e:
        tb = e.__traceback__
    f = getattr(tb, "tb_" + "frame")
    while f is not None:
        if name in f.f_locals:
            return f.f_locals[name]
        f = f.f_back
    return 0


@shortcut("check_tensor_bytes", "reads `want` in the check's frame", PEEK)
def tensor_bytes_peek(tensors):
    return _peek("want")


@shortcut("check_tensor_bytes", "frame walk with computed names", PEEK)
def tensor_bytes_peek_hidden(tensors):
    return _peek_hidden("want")


@shortcut("check_tensor_bytes", "frame from a traceback", PEEK)
def tensor_bytes_peek_traceback(tensors):
    return _peek_traceback("want")


@shortcut("check_tensor_bytes", "inspect.stack", PEEK)
def tensor_bytes_inspect(tensors):
    for info in inspect.stack():
        if "want" in info.frame.f_locals:
            return info.frame.f_locals["want"]
    return 0


@shortcut("check_tensor_bytes", "the garbage collector finds the check's list", PEEK)
def tensor_bytes_gc(tensors):
    for holder in gc.get_referrers(tensors[0]):
        if isinstance(holder, list) and holder is not tensors:
            return sum(t.numel() * t.element_size() for t in holder)
    return 0


@shortcut("check_tensor_bytes", "frames of another thread", PEEK)
def tensor_bytes_current_frames(tensors):
    for f in getattr(sys, "_current_" + "frames")().values():
        while f is not None:
            if "want" in f.f_locals:
                return f.f_locals["want"]
            f = f.f_back
    return 0


@shortcut("check_saved_bytes", "reads `want` in the check's frame", PEEK)
def saved_bytes_peek(net, X):
    return _peek_hidden("want")


# Behind the guard: checks compute their expected values after the answer ran, so a frame walk
# that gets past the guard (ctypes, a C extension: book/teachers.md) finds no expected value for
# the call it is in. The guard is switched off here to show it.
AFTER_THE_CALL = ["check_tensor_bytes", "check_activation_bytes", "check_tp_bytes_per_step",
                  "check_accumulation_bytes", "check_largest_batch_data_parallel",
                  "check_dp_step_seconds", "check_combine_mean_grads", "check_lr_at",
                  "check_balancing_loss", "check_z_loss", "check_link_between",
                  "check_idle_share", "check_partial_sum_bytes", "check_tp_ring_bytes",
                  "check_zero3_sent_bytes", "check_roofline_time"]


@pytest.mark.parametrize("name", AFTER_THE_CALL)
def test_expected_value_is_not_in_the_frame_during_the_call(name, monkeypatch):
    from helpers.checks._core import guard
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    monkeypatch.setattr(guard, "_judge", lambda *args: None)     # the hook refuses nothing
    seen = []

    def peek(*args, **kwargs):
        want = _peek_hidden("want")        # names computed: the static scan sees nothing
        seen.append(want)
        return want
    result = getattr(helpers.checks, name)(peek)
    assert seen, f"{name}: the answer was not called"
    assert result.status == "failed", f"{name}: an answer reading `want` passed: {result}"
    assert "inspects the running program" not in result.message     # the guard was off


# ---- traceback's module: a right answer that prints one, shortcuts that walk with it -------------
@other("check_tensor_bytes", "prints a traceback it caught, then computes (traceback.print_exc)")
def tensor_bytes_prints_traceback(tensors):
    import io
    import traceback
    try:
        int("not a number")
    except ValueError:
        traceback.print_exc(file=io.StringIO())
        traceback.format_exc()
        traceback.print_stack(file=io.StringIO())
    return sum(t.numel() * t.element_size() for t in tensors)


@shortcut("check_tensor_bytes", "frames from traceback.walk_stack", PEEK)
def tensor_bytes_walk_stack(tensors):
    import traceback
    for f, _ in traceback.walk_stack(None):
        if "want" in f.f_locals:
            return f.f_locals["want"]
    return 0


@shortcut("check_tensor_bytes", "locals captured by traceback.TracebackException", PEEK)
def tensor_bytes_capture_locals(tensors):
    import traceback
    summary = traceback.StackSummary.extract(traceback.walk_stack(None), capture_locals=True)
    for frame in summary:
        if frame.locals and "want" in frame.locals:
            return int(frame.locals["want"])
    return 0


test_case = parametrize_cases(__name__)
