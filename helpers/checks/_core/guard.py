"""While an answer runs: it may not read the running program, and every thread it starts is
observed like the thread that called it.

- An audit hook (PEP 578; one per process, shared by every import of the course) refuses, from
  the reader's code while an answer runs, what reaches another function's frame or the objects
  the check holds: `sys._getframe` (so `inspect.currentframe`/`stack` too), `sys._current_frames`,
  a traceback's `tb_frame`, a generator's `gi_frame`, `gc.get_referrers`/`get_referents`/
  `get_objects`, `sys.settrace`/`setprofile`. The check's expected values live in its frame; an
  answer that could walk there would not need to compute anything.
- The same hook refuses running code that holds the course's own answer to the exercise: an
  `exec` (or an import under another name) of code that contains a blocked reference's code, a
  new function made of it (`types.FunctionType(saved_code, ...)`, the code saved before the
  check ran, wherever it was held), and reading a blocked reference's `__code__`.
- It refuses reading a harness function's `__defaults__`/`__kwdefaults__` from the reader's code
  while an answer runs: the harness's live state is held there (patched.py, switches.py,
  stubs.py), where no module attribute leads to it.
- It refuses, while an answer runs or a check body judges one, giving a function that is not
  the reader's new `__code__`, `__defaults__` or `__kwdefaults__` in place (`expect.__code__ =
  ...`, `F.silu.__code__ = ...`): the same object, so every binding the harness compares by
  identity would still look like the original. Each attempt is noted (`rewritten`): a check body
  in which one was made fails (late.py).
- Processes: the answer may not start one (`os.fork`, `subprocess`, `multiprocessing`, a
  `ProcessPoolExecutor`, the `os.exec*`/`spawn*`/`system` family): a child's work is not seen
  by the check, and a fresh interpreter imports the course without the check's blocks. Torch's
  own workers (a compiler's pool, say) are let through: the first frame past the standard
  library that starts them must be the reader's for a refusal.
- Threads: `threading.Thread.start` and `ThreadPoolExecutor.submit` carry the caller's torch
  dispatch modes (the check's Recorder, the simulated GPUs) into the new thread, so work done in
  a worker thread is seen as if done in place.

What it cannot stop: Python code that avoids these entry points (ctypes, a C extension). Those
are named in book/teachers.md. Code compiled under a library's or the course's file name is the
reader's all the same (whose.py: it is not that file's own code).
"""
import concurrent.futures
import multiprocessing.process
import os
import sys
import sysconfig
import threading
import types

from .carried import _modes, _with_modes
from .guard_judge import judge as _judge
from .marks import registries
from .outlived import thread_started
from .run import CheckFailed, ReferenceUsed, is_reader_function
from .whose import disown, file_code, genuine, reader_code

__all__ = ["answering", "refusal", "refuse", "harness_busy", "own_operator", "TORCH_OPERATORS"]

_SHARED = "_course_answer_guard"          # one hook and one state for every import of the course
_PING = "_course_answer_guard.state"     # the hook hands its state to the callable of this event
_FRAME_EVENTS = frozenset({"sys._getframe", "sys._current_frames", "sys._current_exceptions",
                           "gc.get_referrers", "gc.get_referents", "gc.get_objects",
                           "sys.settrace", "sys.setprofile", "sys._getframemodulename"})
# process-wide callbacks: the reader's code would run after the answer returned, while the check
# judges it (an audit hook cannot even be removed); refused whoever calls them while one runs
_CALLBACK_EVENTS = frozenset({"sys.addaudithook", "sys.monitoring.register_callback",
                              "sys._setprofileallthreads", "sys._settraceallthreads"})
_PROCESS_EVENTS = frozenset({"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec",
                             "os.system", "subprocess.Popen", "os.startfile"})
_STDLIB = sysconfig.get_paths()["stdlib"]
_FUNCTION_PARTS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
_HERE = os.path.abspath(__file__)
_OFF = "your code switched the check's guard off: an answer computes, it leaves the grader be"
_STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stubs.py")
_CHECKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep   # helpers/checks/
_LATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "late.py")
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})


class _State(types.ModuleType):
    """Shared between imports of the course (fresh.py makes new ones): the depth of answers
    running, the code keys blocked now, and the first refusal seen."""

    def __init__(self):
        super().__init__(_SHARED)
        self.lock = threading.RLock()
        self.start = threading.Thread.start          # the originals, restored after each answer
        self.submit = concurrent.futures.ThreadPoolExecutor.submit
        self.process_start = multiprocessing.process.BaseProcess.start


def _shared():
    """The state of the course's first import, found by asking the audit hooks (the first one
    installed answers first: an earlier import's), never by `sys.modules`, which any cell can
    change; a new state and hook if none answers."""
    found = []
    sys.audit(_PING, lambda api: found.append(api) if not found else None)
    if not found:
        hook, api = _make_hook(_State())
        sys.addaudithook(hook)
        found.append(api)
    sys.modules[_SHARED] = found[0][0]       # (for reading only: nothing looks it up there)
    return found[0]


def _state():
    return _STATE


def _make_hook(state):
    # what the hook decides by, in its closure (no object an answer can name holds it): a
    # thread's off switch (re-entry, stubs), and the answers running, their blocked code keys
    # and first refusal, changed only through the functions below, by answering and stubs.py
    local = threading.local()
    armed = types.SimpleNamespace(depth=0, keys={}, code_key=None, refused=None, judging=0,
                                  rewritten=[])

    def refuse(message):
        if armed.depth and armed.refused is None:
            armed.refused = message

    def quiet(flag):
        """harness_busy's switch, for stubs.py's code only: returns the flag it replaced."""
        if not file_code(sys._getframe(2).f_code, _STUBS):
            refuse(_OFF)
            raise ReferenceUsed(_OFF)
        before, local.busy = getattr(local, "busy", False), flag
        return before

    def arm(keys, code_key):
        """answering's: one more answer running; True for the outermost."""
        _from_answering(sys._getframe(1), refuse)
        if armed.depth == 0:
            armed.refused, armed.keys, armed.code_key = None, dict(keys), code_key
        armed.depth += 1
        return armed.depth == 1

    def disarm():
        """answering's: one answer fewer; its first refusal and the answers left."""
        _from_answering(sys._getframe(1), refuse)
        armed.depth -= 1
        if armed.depth == 0:
            armed.keys = {}
        return armed.refused, armed.depth
    def judge(step, tried=0):
        """late.checking's, around a check body: one more (`step` 1: returns how many rewrites
        were noted) or one fewer (-1: returns those noted since `tried`)."""
        frame = sys._getframe(2)      # checking's, through contextlib
        if frame.f_code.co_name != "checking" or os.path.abspath(
                frame.f_code.co_filename) != _LATE:
            refuse(_OFF)
            raise ReferenceUsed(_OFF)
        armed.judging += step
        if step > 0:
            return len(armed.rewritten)
        rewritten = tuple(armed.rewritten[tried:])
        if not armed.judging:
            armed.rewritten.clear()
        return rewritten
    state.quiet, state.arm, state.disarm, state.refuse = quiet, arm, disarm, refuse
    state.armed, state.refusal = (lambda: armed.depth), (lambda: armed.refused)
    # what every import binds once, from the hook itself (`_PING`): never read off `state`,
    # whose attributes a cell can set
    exits = types.SimpleNamespace(lock=threading.RLock(), watchers=[], entered=[],
                                  saved={})      # exits.py's and storage_exits.py's
    api = (state, quiet, arm, disarm, refuse, state.armed, state.refusal, judge, exits,
           registries())                     # marks.py's: threads and work, by identity

    def hook(event, args):
        if event == "object.__getattr__" and len(args) > 1 and args[1] == "f_code":
            return      # (the most frequent event, judged by nothing below: every frame walk)
        if event == _PING:
            args[0](api)
            return
        if event == "_thread.start_new_thread":
            _threads.note_start(args)
            return
        if event == "object.__setattr__":
            _rewrite(armed, local, args)
            return
        if event in ("exec", "function.__new__") and args and isinstance(args[0], types.CodeType):
            disown(args[0], sys._getframe(1), event)    # a copy of a file's code the reader made
        if not armed.depth or getattr(local, "busy", False):
            return
        if event in _PROCESS_EVENTS:
            _refuse_process(refuse, local, event)
            return
        if event in _CALLBACK_EVENTS:
            message = (f"your code installs a process-wide callback ({event}): it would run "
                       "your code after your function returned, while the check judges it. "
                       "An answer does its work inside its call")
            refuse(message)
            raise ReferenceUsed(message)
        if event not in _FRAME_EVENTS and event not in ("exec", "function.__new__") and not (
                event == "object.__getattr__" and len(args) > 1 and (
                    args[1] in _FRAME_ATTRS or args[1] in _FUNCTION_PARTS)):
            return
        local.busy = True
        try:
            message = _judge(armed, event, args)
        finally:
            local.busy = False
        if message:
            refuse(message)
            raise ReferenceUsed(message)
    return hook, api


def _from_answering(frame, refuse):
    """Only answering's methods arm and disarm the hook, called from the harness's code."""
    if (frame.f_code.co_name not in ("__enter__", "__exit__") or frame.f_back is None
            or not file_code(frame.f_code, _HERE) or reader_code(frame.f_back.f_code)):
        refuse(_OFF)
        raise ReferenceUsed(_OFF)


def _rewrite(armed, local, args):
    """Refuse a function of the libraries' or the course's given new code or defaults in place
    while an answer runs or a check judges one (the harness's own stubs are `busy`), and one of
    the harness's own by the reader's code at any time (a getter the harness reads between its
    windows, a cell: the verdict's `expect` would be the reader's)."""
    if (len(args) < 2 or args[1] not in _FUNCTION_PARTS
            or not isinstance(args[0], types.FunctionType)
            or getattr(local, "busy", False)):
        return
    local.busy = True
    try:
        code = args[0].__code__
        setter = sys._getframe(2)
        if not (armed.depth or armed.judging) and not (
                os.path.abspath(code.co_filename).startswith(_CHECKS)
                and reader_code(setter.f_code)):
            return             # outside a check: only the harness's own functions are kept
        if is_reader_function(args[0], setter) or (
                args[1] == "__code__" and code.co_name == "_stub"
                and file_code(code, _STUBS)):
            return             # the reader's own function, or a stubbed reference (stubs.py's)
        fn = args[0]
        name = f"{getattr(fn, '__module__', None)}.{getattr(fn, '__qualname__', '?')}"
    finally:
        local.busy = False
    message = (f"your code gave {name} a new {args[1]} in place: the check computes its verdict "
               "with that function, so it may not change it. Compute the result with your own "
               "functions")
    if armed.depth or armed.judging:
        armed.rewritten.append(message)
    if armed.depth and armed.refused is None:
        armed.refused = message
    raise ReferenceUsed(message)


def _process_message(event):
    """A refusal when the first frame past the standard library that started a process is the
    reader's (None for torch's or the course's own workers)."""
    frame = sys._getframe(2)
    while frame is not None and _passes_on(frame.f_code.co_filename) and genuine(frame.f_code):
        frame = frame.f_back
    if frame is None or not reader_code(frame.f_code):
        return None
    return (f"your code starts another process ({event}): the check sees only this process, "
            "so an answer must do its work here (threads are fine)")


def _passes_on(filename):
    """This module, or the standard library (not its site-packages): code that starts a process
    for whoever called it."""
    return filename == __file__ or (filename.startswith(_STDLIB)
                                    and "-packages" not in filename)


def _refuse_process(refuse, local, event):
    local.busy = True
    try:
        message = _process_message(event)
    finally:
        local.busy = False
    if message:
        refuse(message)
        raise ReferenceUsed(message)


def _process_start(self, *args, **kwargs):
    if _ARMED():
        _refuse_process(_REFUSE, threading.local(), "multiprocessing")
    return _STATE.process_start(self, *args, **kwargs)


# --- threads ---------------------------------------------------------------------------------
def _start(self, *args, **kwargs):
    MARKS.started.add(self)             # started while an answer ran: observed (carried)
    modes, task = _modes(), thread_started(self, sys._getframe(1))   # judged at the return
    try:
        if modes or task is not None:
            run = _with_modes(self.run, modes, task)
            object.__setattr__(self, "run", run)      # not through a class's own __setattr__
            if object.__getattribute__(self, "run") is not run or any(
                    "__getattribute__" in vars(c) for c in type(self).__mro__[:-1]):
                refuse("your Thread class keeps the check's watch out of the thread it starts "
                       "(its own run or attribute lookup): its work would go unseen. Use "
                       "threading.Thread with a target, or subclass it without those")
        return _STATE.start(self, *args, **kwargs)
    except BaseException:
        if task is not None:
            task[1] = True              # not started: nothing of it runs later
        raise


def _submit(self, fn, /, *args, **kwargs):
    carried = _with_modes(fn, _modes())
    MARKS.carried.add(carried)
    return _STATE.submit(self, carried, *args, **kwargs)


def started_by_answer(thread):
    """Whether `thread` was started while an answer ran (guard's Thread.start stand-in)."""
    return MARKS.started.has(thread)


class answering:
    """While an answer runs: the hook is armed with `keys` ({code key: reference name}), threads
    carry the dispatch modes. Raises ReferenceUsed at the end if the hook refused anything, even
    if the answer caught it."""

    def __init__(self, keys, code_key):
        self.keys, self.code_key = keys, code_key

    def __enter__(self):
        hidden = _threads.hidden_worker()
        if hidden is not None:
            raise CheckFailed(f"a thread started before the check ran ({hidden}) is running your "
                              "code: its work is invisible to the check. Start threads inside "
                              "the answer (they are observed like the answer itself), or do "
                              "the work in the answer")
        state = _STATE
        with state.lock:
            if _ARM(self.keys, self.code_key):
                threading.Thread.start = _start
                concurrent.futures.ThreadPoolExecutor.submit = _submit
                _threads.stand_ins(True)        # an executor's work items, pool tasks
                _switches.guard_switches()
                multiprocessing.process.BaseProcess.start = _process_start
        return self

    def __exit__(self, *exc):
        state = _STATE
        with state.lock:
            refused, depth = _DISARM()
            if depth == 0:
                threading.Thread.start = state.start
                concurrent.futures.ThreadPoolExecutor.submit = state.submit
                _threads.stand_ins(False)
                _switches.restore_switches()
                multiprocessing.process.BaseProcess.start = state.process_start
        if refused and not (exc[0] is not None and issubclass(exc[0], ReferenceUsed)):
            raise ReferenceUsed(refused)
        return False


class harness_busy:
    """The stubs' own work is not the answer's: the hook lets it read the references' code."""

    def __enter__(self):
        self.before = _QUIET(True)

    def __exit__(self, *exc):
        _QUIET(self.before)
        return False


def refuse(message):
    """Refuse from a harness's stand-in: the answer's first refusal (its `except` cannot hide
    it), raised."""
    _REFUSE(message)
    raise ReferenceUsed(message)


def note_refusal(message):
    """Note a refusal as the answer's first (if none yet), without raising."""
    _REFUSE(message)


def refusal():
    """The message of the hook's first refusal in the current answer (None if none)."""
    return _REFUSAL()


def armed():
    """How many answers run now (0: none)."""
    return _ARMED()


def judging(step, tried=0):
    """late.checking's count of check bodies running (see `judge` in the hook's closure)."""
    return _JUDGE(step, tried)


from . import early_threads as _threads  # noqa: E402  (they read the names above)
from . import switches as _switches  # noqa: E402
from .operators import TORCH_OPERATORS, own_operator  # noqa: E402

# the hook from the checks' import on (it notes who starts each thread), and its functions
_STATE, _QUIET, _ARM, _DISARM, _REFUSE, _ARMED, _REFUSAL, _JUDGE, _EXITS, MARKS = _shared()
