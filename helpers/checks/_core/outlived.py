"""What the reader's code starts in a call of the answer and leaves running when it returns: a
Thread whose target has not returned, a task submitted to an executor whose future is not done,
a multiprocessing pool's task not ready, a pool worker's initializer still running. The check
reads the answer's result after the call (a World's after `w.run`), so work done later in such
a thread (an all-reduce, a copy into the gradients) would look like the answer's own; on gloo
and NCCL the function has returned without it. Each call of the answer (and each late window,
late.py) opens an `answer_call` scope in its thread; the threads and tasks the reader's code
starts in it (and in the threads it starts: carried.py hands them the scope) are noted by
guard.py's Thread.start stand-in and early_threads' work-item and pool-task stand-ins, and
judged at the call's return, with no wait. A pool's own threads are not judged (an idle
worker runs only what is handed to it later): only what was handed to them, and their
initializer."""
import concurrent.futures
import concurrent.futures.thread as _cf_thread
import contextlib
import multiprocessing.pool as _mp_pool
import os
import sys
import sysconfig
import threading

from .run import CheckFailed
from .whose import genuine, reader_code

__all__ = ["answer_call", "calls_tasks", "current", "thread_started", "item_made",
           "result_made", "expect_joined"]

_CALL = threading.local()        # .call: the answer's call this thread works for
_STDLIB = sysconfig.get_paths()["stdlib"]
_HARNESS = os.path.dirname(os.path.abspath(__file__)) + os.sep
_ADJUST = _cf_thread.ThreadPoolExecutor._adjust_thread_count.__code__   # starts a worker
_MP = os.path.dirname(os.path.abspath(_mp_pool.__file__)) + os.sep    # multiprocessing/
_MP_POOL = os.path.abspath(_mp_pool.__file__)       # starts a ThreadPool's threads
_WORKERS = (_cf_thread._worker, _mp_pool.worker)    # (queue, ..., initializer, ...) both
_DONE, _READY = concurrent.futures.Future.done, _mp_pool.ApplyResult.ready

_THREAD = ("a thread it started", "join it")
_ITEM = ("a task it submitted to a thread pool", "wait for it (`future.result()`, or leave the "
         "executor's `with` block, which waits)")
_RESULT = ("a task it handed a multiprocessing pool", "wait for it (`.get()` or `.wait()`)")
_INIT = ("the initializer of a thread pool it made", "wait for it (an executor's `with` block "
         "waits; a multiprocessing pool's `close()` then `join()`)")


class _Call:
    """One call's tasks, each [(what, fix), done, finished: a test of its own or None];
    `outlived`: those running at its return."""
    __slots__ = ("tasks", "outlived", "closed")

    def __init__(self):
        self.tasks, self.outlived, self.closed = [], [], False

    def judge(self):
        """Note what is still running now (the call returned)."""
        for what, done, finished in list(self.tasks):
            if not done and not (finished is not None and finished()) and (
                    what not in self.outlived):
                self.outlived.append(what)


def current():
    """The call the calling thread works for (None outside an answer's call)."""
    return getattr(_CALL, "call", None)


@contextlib.contextmanager
def calls_tasks(call):
    """This thread works for `call` (None: no answer's) while the block runs."""
    before, _CALL.call = current(), call
    try:
        yield call
    finally:
        _CALL.call = before


@contextlib.contextmanager
def answer_call():
    """Around the reader's call: its scope, closed at the end (what runs after it is late)."""
    with calls_tasks(_Call()) as call:
        try:
            yield call
        finally:
            call.closed = True


def _asked_by_reader(frame):
    """Whether the first frame past the standard library and the harness's core is the
    reader's: the reader's code started it (a library's own thread is not the answer's)."""
    while frame is not None and genuine(frame.f_code) and (
            frame.f_code.co_filename.startswith(_HARNESS) or (
                frame.f_code.co_filename.startswith(_STDLIB)
                and "-packages" not in frame.f_code.co_filename)):
        frame = frame.f_back
    return frame is not None and reader_code(frame.f_code)


def _task(what, finished=None):
    call = current()
    if call is None or call.closed:
        return None
    task = [what, False, finished]
    call.tasks.append(task)
    return task


def _pool_machinery(frame):
    """Whether Thread.start was called by an executor or a multiprocessing pool starting its
    own thread (a worker, a handler), `frame` being its caller."""
    if frame is not None and frame.f_code is _ADJUST:
        return True
    while frame is not None and genuine(frame.f_code) and (
            frame.f_code.co_filename.startswith(_MP + "dummy")):
        frame = frame.f_back
    return frame is not None and genuine(frame.f_code) and (
        os.path.abspath(frame.f_code.co_filename) == _MP_POOL)


def thread_started(thread, frame):
    """The task of a Thread the reader's code starts (`frame`: Thread.start's caller), or None.
    A pool's own thread (an executor's worker, a multiprocessing pool's worker or handler) is
    no task: what was submitted to it is (`item_made`, `result_made`), and so is a worker's
    initializer, wrapped here to note its return."""
    asked = _asked_by_reader(frame)
    target = vars(thread).get("_target")
    if _pool_machinery(frame):
        args = vars(thread).get("_args", ())
        if asked and any(target is w for w in _WORKERS) and len(args) > 2 and args[2]:
            task = _task(_INIT)
            if task is not None:
                thread._args = (*args[:2], _noting(args[2], task), *args[3:])
        return None
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    runs_reader = code is not None and reader_code(code)
    return _task(_THREAD) if asked or runs_reader else None


def _noting(fn, task):
    def initializer(*args):
        try:
            return fn(*args)
        finally:
            task[1] = True
    return initializer


def item_made(future):
    """An executor's work item made while an answer runs (submit() makes one): a task of the
    call until its future is done (cancelled included)."""
    if _asked_by_reader(sys._getframe(1)):
        _task(_ITEM, lambda: issubclass(type(future), concurrent.futures.Future) and (
            _DONE(future)))


def result_made(result):
    """A multiprocessing pool's task (`apply_async`, `map_async`) made while an answer runs: a
    task of the call until it is ready."""
    if _asked_by_reader(sys._getframe(1)):
        _task(_RESULT, lambda: _READY(result))


def expect_joined(name, call, rank=None):
    """CheckFailed when the call returned while a thread or task it started was running."""
    if call is None or not call.outlived:
        return
    who = f"rank {rank} returned from {name}" if rank is not None else f"{name} returned"
    what, fix = call.outlived[0]
    raise CheckFailed(
        f"{who} while {what} was still running: {fix} before returning; what it does after "
        "the return is not your function's result (its caller uses the result as soon as "
        "the function returns)")
