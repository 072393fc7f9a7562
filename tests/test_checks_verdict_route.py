"""The route of a verdict from the check to the reader and the grader is the harness's, whatever
the answer or an earlier cell did with the process:

1. the output stream: the verdict line is printed through `sys.stdout`, so an answer that leaves
   its own writer there (whose `write` would run after the verdict, with the check's frames
   open, and flip the Result it prints) fails and the stream is put back (callbacks.py); a
   writer of the reader's set before the check makes it refuse to start, and the verdict goes
   to the process's own stream (early_hooks.py, run.py);
2. the grading switch (`COURSE_GRADING`, `NBGRADER_EXECUTION`) is read when the check starts,
   and an answer that changes it fails, the environment put back (run.py, callbacks.py);
3. the reader's trace and profile functions, and the other process callbacks callbacks.py
   judges after the call, set before the check: a tracer sees every frame of the check and can
   rewrite its locals (`got = want`), so it is taken off and the check refuses; the others make
   it refuse to start (early_hooks.py).
"""
import contextlib
import cProfile
import gc
import io
import os
import sys
import threading

import pytest
from check_cases import other, parametrize_cases, shortcut

import helpers.checks
from helpers.checks._core import fresh

CHANGED = "changed (put back)"
EARLIER = "set earlier"


def _lr(step, base_lr, base_batch, batch, warmup):
    peak = base_lr * batch / base_batch
    return peak * min(1.0, (step + 1) / warmup) if warmup else peak


def _lr_wrong(step, base_lr, base_batch, batch, warmup):
    return base_lr                    # no scaling with the batch, no warm-up


class _Flipper:
    """A writer whose `write` walks up to run_check's frame and says the check passed."""

    def __init__(self, inner):
        self.inner, self.wrote = inner, []

    def write(self, s):
        self.wrote.append(s)
        f = getattr(sys, "_get" + "frame")(1)
        while f is not None:
            r = getattr(f, "f_" + "locals").get("result")
            if r is not None and hasattr(r, "status"):
                r.status, r.message = "passed", ""
            f = getattr(f, "f_" + "back")
        return self.inner.write(s)

    def flush(self):
        return self.inner.flush()


# ---- 1, 2: what the answer leaves -------------------------------------------------------------
@shortcut("check_lr_at", "its own writer left in sys.stdout flips the printed Result",
          [CHANGED, "sys.stdout", "redirect_stdout"])
def lr_at_stdout_flipper(step, base_lr, base_batch, batch, warmup):
    setattr(sys, "std" + "out", _Flipper(sys.stdout))
    return _lr_wrong(step, base_lr, base_batch, batch, warmup)


def _flip_write(s):
    _Flipper(sys.__stdout__).write(s)


@shortcut("check_lr_at", "its own write set on the stream flips the printed Result",
          [CHANGED, "sys.stdout.__dict__"])
def lr_at_stdout_own_write(step, base_lr, base_batch, batch, warmup):
    setattr(sys.stdout, "wr" + "ite", _flip_write)
    return _lr_wrong(step, base_lr, base_batch, batch, warmup)


@shortcut("check_lr_at", "a library's stream left in sys.stderr", [CHANGED, "sys.stderr"])
def lr_at_stderr_left(step, base_lr, base_batch, batch, warmup):
    sys.stderr = io.StringIO()
    return _lr(step, base_lr, base_batch, batch, warmup)


@shortcut("check_lr_at", "the grading switch popped", [CHANGED, "grading switch"])
def lr_at_grading_popped(step, base_lr, base_batch, batch, warmup):
    for key in ("COURSE_GRADING", "NBGRADER_EXECUTION"):
        os.environ.pop(key, None)
    os.environ["NBGRADER_EXECUTION"] = "0"
    return _lr_wrong(step, base_lr, base_batch, batch, warmup)


@other("check_lr_at", "prints through contextlib.redirect_stdout, which restores the stream")
def lr_at_redirected_print(step, base_lr, base_batch, batch, warmup):
    with contextlib.redirect_stdout(io.StringIO()):
        print("computing")
    return _lr(step, base_lr, base_batch, batch, warmup)


test_case = parametrize_cases(__name__)


@pytest.fixture(autouse=True)
def _not_grading(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)


def test_the_flipped_result_stays_failed_and_the_stream_is_back(capsys):
    out = sys.stdout
    result = helpers.checks.check_lr_at(lr_at_stdout_flipper)
    assert sys.stdout is out
    assert result.status == "failed" and not result, result
    assert "✘ failed" in capsys.readouterr().out


def test_the_grading_switch_is_read_before_the_answer(monkeypatch):
    monkeypatch.setenv("COURSE_GRADING", "1")
    with pytest.raises(helpers.checks.CheckFailed, match="grading switch"):
        helpers.checks.check_lr_at(lr_at_grading_popped)
    assert os.environ.get("COURSE_GRADING") == "1" and "NBGRADER_EXECUTION" not in os.environ
    with pytest.raises(AssertionError, match="grading switch"):
        fresh.regrade("check_lr_at", lr_at_grading_popped)


# ---- 1, 3: what an earlier cell left ----------------------------------------------------------
def test_a_writer_of_the_readers_set_earlier_refuses_the_check(capsys):
    out = _Flipper(sys.stdout)
    sys.stdout = out
    try:
        result = helpers.checks.check_lr_at(_lr_wrong)
        assert sys.stdout is out, "the reader's stream was removed: the process changed"
    finally:
        sys.stdout = out.inner
    assert result.status == "failed" and "sys.stdout runs code of yours" in result.message
    assert not out.wrote, "the reader's write ran: the verdict went through it"


def test_a_write_of_the_readers_set_on_the_stream_earlier_refuses_the_check():
    wrote = []

    def keep(s):
        wrote.append(s)
    sys.stdout.write = keep
    try:
        result = helpers.checks.check_lr_at(_lr_wrong)
    finally:
        del sys.stdout.write
    assert result.status == "failed" and "sys.stdout runs code of yours" in result.message
    assert not wrote, "the reader's write ran: the verdict went through it"


def _tracer(frame, event, arg):
    """Sets the check's `got` to its `want` on every line of a check's frame."""
    def line(frame, event, arg):
        loc = frame.f_locals
        if event == "line" and "want" in loc and "got" in loc:
            loc["got"] = loc["want"]
        return line
    return line if event == "call" and frame.f_code.co_name.startswith("check_") else None


def _profiler(frame, event, arg):
    if event == "return" and "got" in frame.f_locals:
        frame.f_locals["got"] = frame.f_locals.get("want")


@pytest.mark.parametrize("what", ["sys.settrace", "sys.setprofile", "threading.settrace"])
def test_a_tracer_set_earlier_is_taken_off_and_refused(what):
    setter = {"sys.settrace": sys.settrace, "sys.setprofile": sys.setprofile,
              "threading.settrace": threading.settrace}[what]
    setter(_profiler if "profile" in what else _tracer)
    try:
        result = helpers.checks.check_lr_at(_lr_wrong)
    finally:
        setter(None)
    assert result.status == "failed", result
    assert f"function of yours ({what}" in result.message and f"{what}(None)" in result.message
    assert sys.gettrace() is None and sys.getprofile() is None
    assert getattr(threading, "_trace_hook", None) is None
    assert helpers.checks.check_lr_at(_lr).status == "passed"


def test_regrade_takes_the_tracer_off_too(monkeypatch):
    monkeypatch.setenv("COURSE_GRADING", "1")
    sys.settrace(_tracer)
    try:
        with pytest.raises(AssertionError, match="trace function of yours"):
            fresh.regrade("check_lr_at", _lr_wrong)
    finally:
        sys.settrace(None)


def _collect(phase, info):
    pass


class _Finder:
    @staticmethod
    def find_spec(*args):
        return None


@pytest.mark.parametrize("slot", ["gc.callbacks", "sys.excepthook", "sys.meta_path",
                                  "sys.unraisablehook"])
def test_a_process_callback_of_the_readers_set_earlier_refuses_the_check(slot):
    if slot == "gc.callbacks":
        gc.callbacks.append(_collect)
        undo = lambda: gc.callbacks.remove(_collect)
    elif slot == "sys.meta_path":
        finder = _Finder()
        sys.meta_path.append(finder)
        undo = lambda: sys.meta_path.remove(finder)
    else:
        old = getattr(sys, slot[4:])
        setattr(sys, slot[4:], _collect)
        undo = lambda: setattr(sys, slot[4:], old)
    try:
        result = helpers.checks.check_lr_at(_lr)
    finally:
        undo()
    assert result.status == "failed" and slot in result.message, result
    assert "restart the kernel" in result.message
    assert helpers.checks.check_lr_at(_lr).status == "passed"


def test_a_librarys_profiler_stays_and_the_check_passes():
    """cProfile (a library's profile function, no code of the reader's) is left alone."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        result = helpers.checks.check_lr_at(_lr)
        assert sys.getprofile() is profiler
    finally:
        profiler.disable()
    assert result.status == "passed", result


# ---- the draws: fresh from the operating system, whatever a cell patched ----------------------
def _seen_args(monkeypatch, patch):
    """Every argument tuple each of three regrades hands a right answer, with `patch` applied."""
    patch()
    seen = []

    def probe(*args):
        seen[-1].append(args)
        return _lr(*args)
    for _ in range(3):
        seen.append([])
        fresh.regrade("check_lr_at", probe)
    return seen


def test_a_patched_system_random_does_not_fix_the_draws(monkeypatch):
    import random
    seen = _seen_args(monkeypatch, lambda: monkeypatch.setattr(
        random.SystemRandom, "getrandbits", lambda self, k: 12345 % (1 << k)))
    assert len(seen) == 3 and all(seen), seen
    assert len({tuple(calls) for calls in seen}) == 3, "the draws repeated"


def test_a_replaced_os_urandom_is_refused(monkeypatch):
    monkeypatch.setattr(os, "urandom", lambda n: bytes(n))
    with pytest.raises(AssertionError, match="os.urandom is not the operating system's"):
        fresh.regrade("check_lr_at", _lr)
