"""Threads started before an answer ran, which the per-thread Recorder and watches do not see:
who started each thread is noted (the reader's code, or not) from the checks' import on; when an
answer starts, a thread not started by an answer or a check that runs the reader's code, was
started by the reader's code (and is not an idle executor worker), or is a plain Thread looping
in library code over whatever it is handed, refuses it (guard.answering); while the answer runs,
an executor's worker started before it runs only what was submit()ted (carrying its modes).
A World's rank threads are the check's own while it runs (`world_ranks`), never judged by
their stacks, which between the rank's steps hold no check frame.
"""
import concurrent.futures.thread as _cf_thread
import contextlib
import gc
import inspect
import multiprocessing.pool as _mp_pool
import os
import sys
import threading
import types

from . import guard as _guard
from .guard import _CHECKS, _passes_on, armed, note_refusal
from .outlived import item_made, result_made
from .run import ReferenceUsed, is_reader_code
from .whose import genuine, namedtuple_new, reader_code

__all__ = ["note_start", "run_item", "made_item", "made_result", "stand_ins", "hidden_worker",
           "idle_worker", "world_ranks"]

_ITEM_RUN, _ITEM_INIT = _cf_thread._WorkItem.run, _cf_thread._WorkItem.__init__


def note_start(args):
    """A Thread started, at any time: marked when the reader's code started it (the first frame
    past the standard library and this module), so an answer refuses it while it lives."""
    owner = getattr(args[0], "__self__", None) if args else None
    if not isinstance(owner, threading.Thread) or _guard.MARKS.started.has(owner):
        return
    frame = sys._getframe(2)
    while frame is not None and _passes_on(frame.f_code.co_filename) and genuine(frame.f_code):
        frame = frame.f_back
    if frame is not None and reader_code(frame.f_code):      # a copy named a library's too
        _guard.MARKS.reader.add(owner)


def run_item(self):
    """An executor's work item, while an answer runs: on a worker started before the answer
    (not by it), only what was submitted (and so carries the answer's modes) may run; an item
    put on the executor's queue directly, made while the answer ran or holding the reader's
    code, would run unseen."""
    thread = threading.current_thread()
    if (armed() and not _guard.MARKS.started.has(thread) and not _guard.MARKS.carried.has(self.fn)
            and (_guard.MARKS.made.has(self) or _holds_reader_code(self))):
        message = (f"a thread started before the check ran ({thread.name}) ran your code, "
                   "handed to it through its executor's queue: its work is invisible to the "
                   "check. Start threads inside the answer, or submit() the work")
        note_refusal(message)
        if self.future.set_running_or_notify_cancel():
            self.future.set_exception(ReferenceUsed(message))
        return None
    return _ITEM_RUN(self)


def made_item(self, *args, **kwargs):
    _ITEM_INIT(self, *args, **kwargs)
    if armed():
        _guard.MARKS.made.add(self)
        item_made(vars(self).get("future"))     # judged at the answer's return (outlived.py)


def made_result(self, *args, **kwargs):
    """multiprocessing's pool task (`apply_async`, `map_async`): judged at the answer's return
    like an executor's item (outlived.py)."""
    _RESULT_INIT(self, *args, **kwargs)
    if armed():
        result_made(self)


_RESULT_INIT = _mp_pool.ApplyResult.__init__
_STAND_INS = ((_cf_thread._WorkItem, "run", run_item, _ITEM_RUN),
              (_cf_thread._WorkItem, "__init__", made_item, _ITEM_INIT),
              (_mp_pool.ApplyResult, "__init__", made_result, _RESULT_INIT))


def stand_ins(on):
    """The executors' stand-ins above in (guard.answering's first answer) or out (its last)."""
    for owner, name, stand_in, original in _STAND_INS:
        setattr(owner, name, stand_in if on else original)


def _holds_reader_code(item):
    """The reader's code in a work item's function or its arguments (one level down)."""
    for value in (item.fn, *item.args, *item.kwargs.values()):
        value = getattr(value, "func", value)          # a partial
        value = getattr(value, "__func__", value)      # a bound method
        code = getattr(value, "__code__", None)
        if isinstance(code, types.CodeType) and is_reader_code(code.co_filename):
            return True
    return False


def _worker(target):
    return getattr(target, "__code__", None) is getattr(_cf_thread._worker, "__code__", 0)


def _busy(frame):
    """An executor's worker running an item (one handed to it before the answer ran)."""
    while frame is not None:
        if frame.f_code is _ITEM_RUN.__code__:
            return True
        frame = frame.f_back
    return False


def _opaque(thread, target):
    """A plain Thread whose target is no Python function (a builtin, a type, a partial of
    one): a loop the library runs over whatever the reader queues (`deque(map(call,
    iter(q.get, None)))`). Threads started before the guard's hook could see who started
    them are judged by this alone."""
    if target is None or type(thread).run is not threading.Thread.run:
        return False
    target = getattr(target, "func", target)
    target = getattr(target, "__func__", target)
    return not isinstance(getattr(target, "__code__", None), types.CodeType)


_FRAMES_LOCK = threading.Lock()


def _current_frames():
    """sys._current_frames() with the garbage collector off: it builds frame objects while it
    holds the interpreter's thread-list lock, a collection there can free a tensor, and torch
    takes the GIL again to free it while another rank thread holds the GIL and waits for that
    lock (a deadlock two rank threads met on a loaded machine)."""
    with _FRAMES_LOCK:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return sys._current_frames()
        finally:
            if enabled:
                gc.enable()


@contextlib.contextmanager
def world_ranks():
    """While a World runs (world.py's run_context): `mark()`, called in each of its rank threads
    as the rank starts (rank_context, before any code of the reader's), makes the thread the
    check's own, observed by the rank's modes, whatever its stack holds between steps (the
    World's own code, a library's, a finalizer a collection runs there). The marks go when the
    run ends: a rank stuck past its deadline is judged by its stack again."""
    marked = []

    def mark():
        thread = threading.current_thread()
        _guard.MARKS.ranks.add(thread)
        marked.append(thread)
    try:
        yield mark
    finally:
        for thread in marked:
            _guard.MARKS.ranks.drop(thread)


def hidden_worker():
    """A thread started before the answer ran (not by an answer, nor a rank of the World
    running) that runs the reader's code: its target is the reader's, or the reader's code is
    on its stack outside an answer (a namedtuple's generated `__new__` is no one's). The
    Recorder and the other watches are per thread and carried only into threads started while
    the answer runs, so such a thread's work would go unseen. Its name and why (which code of
    the reader's it runs: the refusal says where), or None."""
    frames = _current_frames()
    me = threading.get_ident()
    for thread in threading.enumerate():
        if (thread.ident == me or _guard.MARKS.started.has(thread)
                or _guard.MARKS.ranks.has(thread) or thread.ident not in frames):
            continue
        target = getattr(thread, "_target", None)
        code = getattr(getattr(target, "__func__", target), "__code__", None)
        why = (_where(code) if isinstance(code, types.CodeType)
               and is_reader_code(code.co_filename) else None)
        frame = frames[thread.ident]
        if _worker(target):     # an executor's: fed only through submit() (or refused)
            if why is None and _guard.MARKS.reader.has(thread) and _busy(frame):
                why = "an item of yours on an executor"
        elif why is None and _guard.MARKS.reader.has(thread):
            why = "started by your code"
        elif why is None and _opaque(thread, target):   # idle in library code, over a queue
            why = "a library loop over what it is handed"
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(_CHECKS):    # a check's thread (a World's rank): observed
                why = None
                break
            if why is None and is_reader_code(name) and not namedtuple_new(
                    frame.f_code, frame.f_globals):
                why = _where(frame.f_code, frame.f_lineno)
            frame = frame.f_back
        if why is not None:
            return f"{thread.name}: {why}"
    return None


def _where(code, line=None):
    return (f"{code.co_name} in {os.path.basename(code.co_filename)}, line "
            f"{line if line is not None else code.co_firstlineno}")


_WORKER = _cf_thread._worker
# the line of `_worker` where a worker waits for its next item (None: not found, not required)
_WAIT = next((_WORKER.__code__.co_firstlineno + i for i, line in enumerate(
    inspect.getsourcelines(_WORKER)[0]) if "work_queue.get(" in line), None)
_QUEUE = type(_cf_thread.queue.SimpleQueue())


def idle_worker(thread, before):
    """Whether `thread`, started while an answer ran, is a worker of an executor that had a
    worker before (`before`: the threads alive then), now waiting on its empty queue: it runs
    nothing of the answer's, and later only what is submit()ted, like that earlier worker. One
    still running an item or an initializer, or with items queued, is not idle."""
    args = getattr(thread, "_args", ())
    if getattr(thread, "_target", None) is not _WORKER or len(args) != 4:
        return False
    queue = args[1]
    if type(queue) is not _QUEUE or not any(
            getattr(b, "_target", None) is _WORKER and b._args[1] is queue
            for b in before if b is not thread and b.is_alive()):
        return False
    frame = _current_frames().get(thread.ident)
    return (frame is not None and frame.f_code is _WORKER.__code__ and queue.empty()
            and (_WAIT is None or frame.f_lineno == _WAIT))
