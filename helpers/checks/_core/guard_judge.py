"""What guard.py's audit hook refuses while an answer runs (its `judge`): a copy of the course's
own answer run (exec, a new function, its code read), and the reader's code reading the
running program (frames, tracebacks, the collector's lists)."""
import os
import sys
import sysconfig
import types

from .whose import genuine, reader_code

__all__ = ["judge"]

_CHECKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep   # helpers/checks/
_STDLIB = sysconfig.get_paths()["stdlib"]

# stdlib walkers: blame whoever called them (logging: only its currentframe, which hands the
# caller a frame; logging.info finding its caller's line is not reading the check)
_INTROSPECTORS = ("inspect.py", "traceback.py", "logging/__init__.py")
_LOGGING_FRAME = frozenset({"currentframe", "<lambda>"})
# traceback's functions that only print or format text (file names, lines, no values): an answer
# that reports an exception it caught is not reading the check (walk_stack, StackSummary.extract
# and TracebackException, which can capture locals, stay refused)
_PRINTERS = frozenset({"print_exc", "format_exc", "print_exception", "format_exception",
                       "print_tb", "format_tb", "print_last", "print_stack", "format_stack",
                       "extract_tb", "extract_stack"})


def _caller():
    """The code that triggered the event: past this hook, and past inspect/traceback; and the
    inspect/traceback function that code called (None if it triggered the event itself); and
    their code objects (each frame's `f_code` read once: every read is an audit event, which
    runs every audit hook)."""
    frame, entry, code, called = sys._getframe(3), None, None, None  # _caller, judge, the hook
    while frame is not None:
        code = frame.f_code
        if not (code.co_filename.endswith(_INTROSPECTORS)     # not a copy compiled under
                and genuine(code)):                           # inspect.py's name
            break
        frame, entry, called = frame.f_back, frame, code
    return frame, entry, code, called


def judge(state, event, args):
    if event in ("exec", "function.__new__"):
        code = args[0] if args else None
        name = _holds_reference(state, code) if isinstance(code, types.CodeType) else None
        how = "exec'd or imported again" if event == "exec" else "its code made a new function"
        return name and (f"your code ran a copy of {name} (the course's own answer: {how}), "
                         "which is unavailable while the check runs")
    if event == "object.__getattr__" and args[1] == "__code__":
        name = _blocked_name(state, args[0])
        if name:        # read by the reader's code, not by the harness walking what it holds
            frame, _ = _caller()
            name = name if frame is not None and reader_code(frame.f_code) else None
        return name and (f"your code read the code of {name} (the course's own answer), which "
                         "is unavailable while the check runs")
    if event == "object.__getattr__" and args[1] != "__code__" and args[1][0] == "_":
        return _harness_defaults(args[0], args[1])          # __defaults__, __kwdefaults__
    frame, entry, code, called = _caller()
    if frame is None or not reader_code(code):
        return None
    if (entry is not None and called.co_filename.endswith("traceback.py")
            and called.co_name in _PRINTERS):
        return None
    if (entry is not None and called.co_filename.endswith("logging/__init__.py")
            and called.co_name not in _LOGGING_FRAME):
        return None
    what = args[1] if event == "object.__getattr__" else event
    where = f", in {code.co_name} line {frame.f_lineno}" if code.co_name != "<module>" else ""
    return (f"your code inspects the running program ({what}{where}): an answer must compute "
            "its result, not read the check's frames, tracebacks or objects")


# defaults that hold nothing the answer could change (a stand-in's torch defaults, builtins
# bound at import); the harness's live state is held in containers and objects, refused
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes, type,
                    types.BuiltinFunctionType})


def _harness_defaults(fn, what):
    """A harness function's defaults read by the reader's code (the first frame past the
    standard library: `inspect.signature` blames its caller): they hold the harness's live
    state (stubs.py's swaps, patched.py's kept copies), which an answer may not reach."""
    if type(fn) is not types.FunctionType:
        return None
    code = fn.__code__
    name = code.co_filename
    if not (type(name) is str and os.path.abspath(name).startswith(_CHECKS) and genuine(code)) \
            or (code.co_varnames == ("args", "kwargs") and "__import__" in code.co_names):
        return None         # (whose.forwarding_code: a course or torch function stubbed or routed)
    frame = sys._getframe(3)            # past this function, judge and the hook
    while frame is not None and frame.f_code.co_filename.startswith(_STDLIB) \
            and "-packages" not in frame.f_code.co_filename and genuine(frame.f_code):
        frame = frame.f_back
    if frame is None or not reader_code(frame.f_code):
        return None
    # read here, past the test of the reader's frame: the read raises this event again, from
    # the harness's own code, which the test above lets through
    held = (*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values())
    if all(type(v) in _PLAIN or type(v) is tuple and all(type(x) in _PLAIN for x in v)
           for v in held):
        return None         # a stand-in's torch defaults (`inspect.signature(dist.all_reduce)`)
    return (f"your code read {what} of the grader's {fn.__qualname__}: the check's own state is "
            "held there, which an answer may not reach. Compute the result yourself")


def _blocked_name(state, obj):
    if not state.keys or not isinstance(obj, types.FunctionType) or state.code_key is None:
        return None
    return state.keys.get(("code", state.code_key(obj.__code__)))


def _holds_reference(state, code):
    if not state.keys or state.code_key is None:
        return None
    stack = [code]
    while stack:
        code = stack.pop()
        name = state.keys.get(("code", state.code_key(code)))
        if name:
            return name
        stack.extend(c for c in code.co_consts if type(c) is types.CodeType)
    return None
