"""Declaring a check: `@check(exercise, observes=[...], references=[...])` (see run.py)."""
import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

from .callbacks import callbacks, expect_no_callbacks
from .carried import rank_carried
from .compile_ready import ready as compile_ready
from .early_hooks import expect_no_early_hooks
from .early_views import early_views_read_only
from .guard import answering
from .hooks import expect_no_new_hooks, hooks_of, node_hooks
from .kept_hooks import keeping
from .late import checking, inside
from .left_later import collector_back, left_later
from .modes import expect_same_switches, switches
from .numpy_work import c_calls_watched
from .outlived import answer_call, expect_joined
from .own import KEYS
from .parts import function_name, plain_globals
from .patched import expect_unpatched, snapshot
from .provenance import handed_in, in_world
from .raised import settled_raise
from .rank_builtins import shadow
from .references import blocked, code_key, resolve, scan, torch_objects
from .run import REGISTRY, CheckInfo, Result, expect, run_check
from .same_work import expect_same_work, traced
from .settle import Guarded, settle
from .untouched import (
    classes,
    expect_named_attributes,
    expect_same_classes,
    expect_untouched,
    fingerprint,
    grad_spared,
)

__all__ = ["check", "Answer", "judged_scan"]


class Answer(Guarded):
    """The reader's function as a check calls it: while it runs, the exercise's references are
    unavailable (references.blocked), it may not read the running program's frames, the
    threads it starts are observed like itself (guard.answering), and in a World rank's thread
    the tensors handed to it are that rank's (provenance.handed_in); what it returns is settled
    before the call ends (settle.py: nothing of the reader's code left to run in it)."""

    def __init__(self, fn, exercise, references, changes_inputs=False, keeps_hooks=False,
                 simulated=False):
        self.fn, self.exercise, self.references = fn, exercise, references
        self.changes_inputs = changes_inputs   # else what it is handed stays (untouched.py)
        self.keeps_hooks = keeps_hooks         # else it leaves no hook behind (hooks.py)
        self.traces = {} if simulated else None   # its work, CPU against FakeGPUs (same_work.py)
        self.__name__ = function_name(fn, exercise)   # read by type: no property of the reader's
        self.keys = {**KEYS, **{ref.key: str(ref) for ref in references if ref.key[0] == "code"}}

    def __call__(self, *args, **kwargs):
        expect(plain_globals(self.fn), _ODD_GLOBALS)     # before anything looks a name up
        shadow(self.fn)                 # int(), float(), len() keep a rank's tags in a World
        kinds = classes((args, kwargs))     # never changed, not even by an in-place exercise
        seen = grad_spared(args) if self.keeps_hooks else args   # a kept node hook's p.grad
        before = None if self.changes_inputs else (fingerprint(seen), fingerprint(kwargs))
        hooks = hooks_of(args, kwargs)
        keep = keeping(self._again) if self.keeps_hooks else None   # guarded, run as this
        trace = contextlib.nullcontext() if self.traces is None else traced(self, args, kwargs)
        nodes = node_hooks(self.__name__, keep)
        libraries = snapshot(keys=False)    # what the answer may not rebind (patched.py)
        later = callbacks()             # what runs later on its own (callbacks.py)
        modes = switches()              # grad mode, default dtype, ... (modes.py)
        try:
            with left_later(self.__name__, self.fn, args, in_world()), nodes, \
                    blocked(self.references, self.exercise), \
                    answering(self.keys, code_key), handed_in(args, kwargs), \
                    early_views_read_only(self.fn, in_world()), trace, inside(), \
                    answer_call() as call:      # the threads it starts (outlived.py)
                with c_calls_watched():
                    returned = self._call(args, kwargs)
                    call.judge()            # at the return: what runs now is late
                    result = settle(returned, self.__name__, self._again)
                    call.judge()
                expect_named_attributes(self.__name__, kinds)   # before a name is read there
        except BaseException:
            _after_call(self.__name__, libraries, modes, later)   # put back, even when it raised
            raise
        try:
            _after_call(self.__name__, libraries, modes, later)
        except Exception:   # the first cause: patched.py's join waited for what ran late
            expect_joined(self.__name__, call, rank_carried())
            raise
        expect_joined(self.__name__, call, rank_carried())
        expect(plain_globals(self.fn), _ODD_GLOBALS)     # a key the call added
        expect_same_classes(self.__name__, kinds)
        if before is not None:
            expect_untouched(self.__name__, before, seen, kwargs)
        expect_no_new_hooks(self.__name__, hooks, args, kwargs, keep)
        return result

    def _call(self, args, kwargs):
        """The reader's function's result; an exception it raised is settled here, while its
        call is still watched (raised.py), and raised outside the `except`, with no chain."""
        failure = None
        try:
            return self.fn(*args, **kwargs)
        except BaseException as exc:   # settled, then raised again (below)
            failure = settled_raise(exc)
        raise failure

    def _again(self, fn):
        """`fn` (returned by the answer: a function, an iterator's next step, a hook) guarded
        as the answer itself is, when the check calls it later."""
        return Answer(fn, self.exercise, self.references, self.changes_inputs, self.keeps_hooks,
                      self.traces is not None)



def judged_scan(fn, refs, exercise):
    """references.scan, judged as the answer's call is: a read of the reader's object (a
    property, a `__getattr__`) runs its code, so what it changed fails and is put back."""
    compile_ready(fn)       # torch.compile's one-time installs, before the first snapshot
    noted = snapshot(), switches(), callbacks()
    try:
        scan(fn, refs, exercise)
    finally:
        _after_call(exercise, *noted)


def _after_call(name, libraries, modes, later):
    """Judge what the call may have changed in the process, each comparison putting its own back
    (all run; the first failure is raised), then the collector back on (callbacks.py)."""
    failure = None
    for judge, noted in ((expect_unpatched, libraries), (expect_same_switches, modes),
                         (expect_no_callbacks, later)):
        try:
            judge(name, noted)
        except BaseException as error:      # every one puts its own back
            failure = failure or error
    collector_back()
    if failure is not None:
        raise failure


_ODD_GLOBALS = ("your function's module globals are not a plain dict keyed by names (made with a "
                "dict subclass, by `exec` or `types.FunctionType`, or given a key that is not a "
                "str): the check reads them, so define it in a cell or a module and bind only "
                "names in it")

Body = Callable[["Answer"], None]             # judges the answer; raises CheckFailed
CheckFn = Callable[[Callable[..., Any]], Result]   # what a notebook calls: check_x(x)


def check(exercise: str, *, observes: Sequence[str], references: Sequence[str] = (),
          changes_inputs: bool = False, keeps_hooks: bool = False,
          simulated: bool = False) -> Callable[[Body], CheckFn]:
    """Declare a check: `body(fn)` judges the reader's `fn` (called through Answer) and raises
    CheckFailed with the reason; the check function returned runs it through run_check, after
    refusing an answer that reaches a reference or the checks themselves (references.scan), and
    refusing to start while a mode or global hook of the reader's is active (early_hooks.py).
    `references` are names of the flat façade (`"balanced_cuts"`, `"ByteLog.wire_bytes"`).
    `changes_inputs`: the exercise writes into what it is handed (otherwise an answer that
    changes its arguments fails: untouched.py). `keeps_hooks`: the exercise registers hooks that
    run after it returns (otherwise an answer that leaves one fails: hooks.py). `simulated`: the
    check runs the answer on CPU tensors and on FakeGPUs, which must do the same work
    (same_work.py)."""
    def declare(body: Body) -> CheckFn:
        named = (references, torch_objects(references))   # torch's imported now, not later
        @functools.wraps(body)
        def check_fn(fn: Callable[..., Any]) -> Result:
            def judged(fn):
                expect_no_early_hooks()     # before the check computes anything
                expect(plain_globals(fn), _ODD_GLOBALS)
                refs = resolve(*named)
                judged_scan(fn, refs, exercise)
                answer = Answer(fn, exercise, refs, changes_inputs, keeps_hooks, simulated)
                with checking(answer):      # late.py: the reader's code after a call
                    body(answer)
                expect_same_work(answer)
            return run_check(exercise, judged, fn, declared=True)
        info = CheckInfo(body.__name__, exercise, observes, references, body.__module__)
        check_fn.info = info
        REGISTRY[body.__name__] = info
        return check_fn
    return declare
