"""Declaring a check: `@check(exercise, observes=[...], references=[...])` (see run.py)."""
import functools
import sys

import torch

from .guard import answering
from .provenance import handed_in
from .rank_builtins import shadow
from .references import blocked, code_key, resolve, scan
from .run import REGISTRY, CheckFailed, CheckInfo, is_reader_code, run_check

__all__ = ["check", "Answer"]


class Answer:
    """The reader's function as a check calls it: while it runs, the exercise's references are
    unavailable (references.blocked), it may not read the running program's frames, the
    threads it starts are observed like itself (guard.answering), and in a World rank's thread
    the tensors handed to it are that rank's (provenance.handed_in). Everything else passes
    through."""

    def __init__(self, fn, exercise, references):
        self.fn, self.exercise, self.references = fn, exercise, references
        self.__name__ = getattr(fn, "__name__", exercise)
        self.keys = {ref.key: str(ref) for ref in references if ref.key[0] == "code"}

    def __call__(self, *args, **kwargs):
        shadow(self.fn)                 # int(), float(), len() keep a rank's tags in a World
        with blocked(self.references, self.exercise), answering(self.keys, code_key), \
                handed_in(args, kwargs):
            return _no_own_tensors(self.fn(*args, **kwargs), self.__name__)

    def __getattr__(self, name):
        return getattr(self.fn, name)


def _no_own_tensors(result, name, depth=0):
    """`result`, refused where it holds a tensor of a subclass the reader defined: its
    __torch_function__ would answer the check's own comparisons (torch.equal, allclose)."""
    if isinstance(result, torch.Tensor):
        cls = type(result)
        where = getattr(sys.modules.get(cls.__module__), "__file__", None)
        if cls.__module__ == "__main__" or (where and is_reader_code(where)):
            raise CheckFailed(f"{name} returned a {cls.__name__}, a tensor subclass of your own: "
                              "return plain tensors, which the check compares itself")
    elif isinstance(result, (list, tuple)) and depth < 3:
        for item in result:
            _no_own_tensors(item, name, depth + 1)
    elif isinstance(result, dict) and depth < 3:
        for item in result.values():
            _no_own_tensors(item, name, depth + 1)
    return result


def check(exercise, *, observes, references=()):
    """Declare a check: `body(fn)` judges the reader's `fn` (called through Answer) and raises
    CheckFailed with the reason; the check function returned runs it through run_check, after
    refusing an answer that reaches a reference or the checks themselves (references.scan).
    `references` are names of the flat façade (`"balanced_cuts"`, `"CommLog.total"`)."""
    def declare(body):
        @functools.wraps(body)
        def check_fn(fn):
            def judged(fn):
                refs = resolve(references)
                scan(fn, refs, exercise)
                body(Answer(fn, exercise, refs))
            return run_check(exercise, judged, fn, declared=True)
        info = CheckInfo(body.__name__, exercise, observes, references, body.__module__)
        check_fn.info = info
        REGISTRY[body.__name__] = info
        return check_fn
    return declare
