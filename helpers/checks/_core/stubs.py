"""While the answer runs, the course's own answer to the exercise is a stub: the references'
function objects get a stub's code (so a binding made before the check ran, in a deque, an
object's attribute, a thread's queue, reaches the stub too), the check's own code still computes
with them, and an answer that puts their code back fails (an audit hook refuses it, and the
block's end verifies it). Used through references.blocked.
"""
import contextlib
import operator
import os
import sys
import threading
import types
import weakref

from . import bindings
from .guard import harness_busy
from .own import checks_calling
from .references import _FACADE, identity
from .run import ReferenceUsed
from .whose import file_code, forwarding_code

__all__ = ["blocked"]

# --- while the answer runs ----------------------------------------------------------------------
_LOCK = threading.RLock()
# The blocks' state, shared by a run's ranks: handed to the functions below as a default argument
# (`_s`), then deleted as a module attribute, so code of the reader's that reached this module by a
# name built at run time cannot put the reader's code where the saved original is (the harness
# would write it into the course's function when the block ends) or switch the audit hook's
# refusal off (guard.py refuses reading a harness function's defaults while an answer runs).
# "swapped": stub key -> (function, original code, stub code, ref, exercise), never changed in
# place; "holders": stub key -> how many blocks hold it; "writes": functions' code written
# since import, but the harness's own swaps.
_STATE = {"depth": 0, "patched": [], "used": [], "swapping": False, "writing": None,
          "swapped": {}, "holders": {}, "writes": 0}


def _stub(ref, exercise, _s=_STATE):
    def unavailable(*args, **kwargs):
        _s["used"].append(ref)
        raise ReferenceUsed(_message(ref, exercise))
    unavailable.__name__ = unavailable.__qualname__ = ref.name.split(".")[-1]
    return unavailable


def _message(ref, exercise):
    whose = getattr(ref, "whose", "the course's own answer")
    return (f"the exercise asks you to write {exercise} yourself, but your code called {ref} "
            f"({whose}), which is unavailable while the check runs")


def _stub_code(freevars, key):
    """Code that hands every call to `_hit(key, ...)` (whose.forwarding_code)."""
    return forwarding_code(freevars, "_stub", __name__, "_hit", key, __file__)


def _checks_calling():
    """True when the call comes from a check's own code: a check module's own frame above it,
    and no answer window (the reader's frames, the answer's entry in declare.py, submitted
    work) anywhere below on this thread's stack (own.checks_calling)."""
    return checks_calling(sys._getframe(3), bare=False)   # <- _hit <- the stub <- its caller


def _hit(key, args, kwargs, _s=_STATE):
    """A call of a blocked reference, bound however early: refused from the answer's code (and
    from threads it reaches), run as itself when the check's own code computes with it."""
    entry = _s["swapped"].get(key)
    if entry is None:
        raise ReferenceUsed("the course's own answer is unavailable while the check runs")
    fn, original, _, ref, exercise = entry
    if _checks_calling():
        with harness_busy():            # the check's own copy: not the answer's (guard.py)
            again = types.FunctionType(original, fn.__globals__, fn.__name__, fn.__defaults__,
                                       fn.__closure__)
        again.__kwdefaults__ = fn.__kwdefaults__
        return again(*args, **kwargs)
    _s["used"].append(ref)
    raise ReferenceUsed(_message(ref, exercise))


def _functions(value):
    """The Python function objects behind `value` (a method's function, a wrapper's inner)."""
    seen = []
    value = getattr(value, "__func__", value)
    while value is not None and len(seen) < 8:
        if isinstance(value, types.FunctionType):
            seen.append(value)
        value = getattr(value, "__wrapped__", None)
    return seen


def _hold(key, entry, mine, first, _s=_STATE):
    """One more block holds `key`; the block keeps (key, the entry as it saw it, whether it made
    it) in its own frame, which no code of the reader's reaches (guard.py refuses frames)."""
    _s["holders"][key] = _s["holders"].get(key, 0) + 1
    mine.append((key, entry, first))


def _swap(fn, ref, exercise, mine, _s=_STATE):
    """Replace `fn`'s code by a stub (every binding of `fn` reaches it), counted per holder."""
    swapped = _s["swapped"]
    for key, entry in swapped.items():
        if entry[0] is fn:
            _hold(key, entry, mine, False)
            return
    key = f"{id(fn)}:{len(swapped)}:{ref.name}"
    stub = _stub_code(len(fn.__code__.co_freevars), key)
    swapped[key] = entry = (fn, fn.__code__, stub, ref, exercise)
    _write_code(fn, stub)
    _hold(key, entry, mine, True)


def _write_code(fn, code, _s=_STATE):
    """The harness's own write of a blocked function's code (not counted as a code written)."""
    _s["swapping"] = True
    _s["writing"] = (fn, code)
    try:
        fn.__code__ = code
    finally:
        _s["swapping"] = False
        _s["writing"] = None


def _code_writes(_s=_STATE):
    """How many times a function's code was written, other than by the harness's swaps."""
    return _s["writes"]


def _swapped(_s=_STATE):
    """{id(function): its entry} of the functions stubbed now."""
    return {id(entry[0]): entry for entry in _s["swapped"].values()}


def _patch(refs, exercise, mine, _s=_STATE):
    keys = {ref.key: ref for ref in refs}
    for key, entry in list(_s["swapped"].items()):   # stubbed already (another rank's block,
        if entry[3].key in keys:                # an outer one): counted, so that the first block
            _hold(key, entry, mine, False)      # out leaves it stubbed for the others (its
                                                # code is the stub's: the walk finds it no more)
    known = {}      # id(value) -> its reference or None, for the objects bound in several modules

    def visit(module, attr, value):
        """One binding of a course module: stub it if it is a reference's."""
        if isinstance(value, type) or not callable(value):   # classes stay: isinstance
            return False
        ref = known.get(id(value), known)
        if ref is known:
            ref = known[id(value)] = keys.get(identity(value))
        return ref is not None and hit(module, attr, value, ref)

    def hit(module, attr, value, ref):
        """A binding of `ref`: its functions stubbed (True), else the name alone."""
        inner = [f for f in _functions(value) if identity(f) == ref.key]
        if inner:
            known.clear()          # a stubbed function changes the identity of its wrappers
        for fn in inner:
            _swap(fn, ref, exercise, mine)
        if not inner and _s["depth"] == 0:   # not Python code: the name alone
            _s["patched"].append((module, attr, value))
            setattr(module, attr, _stub(ref, exercise))
        return bool(inner)

    # every course module's binding, by the walk kept per module where provably current
    bindings.walk(sys.modules, keys, visit, hit, known, _code_writes, _swapped)
    for ref in refs:                   # the object itself (torch's too), however reached
        for fn in _functions(ref.obj):
            if identity(fn) == ref.key:
                _swap(fn, ref, exercise, mine)
    for ref in refs:                   # methods: "ByteLog.wire_bytes"
        owner, _, method = ref.name.rpartition(".")
        cls = _owner(owner) if owner else None
        if isinstance(cls, type) and method in vars(cls):
            for fn in _functions(vars(cls)[method]):
                _swap(fn, ref, exercise, mine)


def _restore(mine, _s=_STATE):
    """Put back the code of the functions this block stubbed; the references whose stub was
    replaced while the answer ran (restored by the answer), or whose entry is not the one the
    block kept (another original put there: never written into the course's function)."""
    tampered = []
    swapped, holders = _s["swapped"], _s["holders"]
    for key, kept, first in mine:
        fn, original, stub, ref, _ = kept
        entry = swapped.get(key)
        if entry is not kept:
            tampered.append(ref)
            if first or entry is None:      # the block that made it holds the saved original
                swapped[key] = entry = kept
        holders[key] = holders.get(key, 1) - 1
        if holders[key] <= 0:
            if fn.__code__ is not stub:
                tampered.append(ref)
            if entry[0] is fn and entry[2] is stub:
                _write_code(fn, (kept if first else entry)[1])
            del swapped[key], holders[key]
    return tampered


def _code_written(event, args, _s=_STATE):
    """Audit hook: a blocked reference's code replaced while the check runs, other than by
    the check, is refused (and remembered: the check fails). Every function's code written,
    but by the harness's own swaps, is counted (bindings.py reads its kept walks again)."""
    if event != "object.__setattr__":
        return
    writing = _s["writing"]    # read once: another thread's swap may end meanwhile
    if len(args) >= 3 and args[1] == "__code__" and not (
            writing is not None and args[0] is writing[0] and args[2] is writing[1]):
        _s["writes"] += 1           # any other write: bindings.py's kept walks read it again
    if not _s["swapped"] or _s["swapping"] or len(args) < 2 or args[1] != "__code__":
        return
    # one copy of the entries, read once: another rank's block may end (and delete its entry,
    # under _LOCK) between two reads
    ref = next((e[3] for e in list(_s["swapped"].values()) if e[0] is args[0]), None)
    if ref is not None:
        _s["used"].append(ref)
        raise ReferenceUsed(f"your code rewrote the code of {ref} (the course's own answer) "
                            "while the check ran: it stays unavailable")


_PING = "_course_stubs.hook"     # the hook hands its `register` to the callable of this event
_HERE = os.path.abspath(__file__)


def _make_hook():
    """The one audit hook of stubs.py in the process: an audit hook cannot be removed, and
    fresh.py imports the course again for each regrade, so one per import would have every
    audit event (each `frame.f_code` the harness reads) run one more Python function from then
    on. It hands `object.__setattr__` (the one event `_code_written` judges) to the
    `_code_written` of every import still alive, each held by a weak reference."""
    handlers = []

    def register(fn):
        """Only a stubs.py's own import registers its own `_code_written` (`_one_hook`)."""
        frame = sys._getframe(1)
        if not (frame.f_code.co_name == "_one_hook" and file_code(frame.f_code, _HERE)
                and type(fn) is types.FunctionType and fn.__globals__ is frame.f_globals
                and fn.__code__.co_name == "_code_written" and file_code(fn.__code__, _HERE)):
            raise ReferenceUsed("only the grader's own code registers with its hook")
        handlers.append(weakref.ref(fn))

    def hook(event, args):
        if event == _PING:
            args[0](register)
        if event != "object.__setattr__":
            return
        for ref in tuple(handlers):
            fn = ref()
            if fn is not None:
                fn(event, args)
            elif ref in handlers:
                handlers.remove(ref)        # (a dead reference equals only itself)
    sys.addaudithook(hook)
    return register


def _one_hook():
    """Register `_code_written` with the hook of the course's first import (found by asking the
    audit hooks, never by a module attribute a cell can set), made now if none answers."""
    found = []
    sys.audit(_PING, lambda register: found.append(register) if not found else None)
    (found[0] if found else _make_hook())(_code_written)


_one_hook()


@contextlib.contextmanager
def blocked(refs, exercise, _s=_STATE):
    """Replace the code of every reference (the function objects themselves, so a binding made
    before the check ran is stubbed too) by a stub that raises ReferenceUsed while the block
    runs; fail afterwards if the answer called one (even if it caught the error) or put the
    code back. Ranks running the same answer on threads share the stubs (counted per function:
    the last out restores); a nested block adds its own references."""
    if not refs:
        yield
        return
    mine = []       # (key, entry, made here): in this frame, where no reader's code reaches
    with _LOCK, harness_busy():
        if _s["depth"] == 0:
            _s["used"] = []
        _patch(refs, exercise, mine)
        _s["depth"] += 1
        names = tuple(_s["patched"]) if _s["depth"] == 1 else ()   # kept here too
    try:
        yield
    finally:
        with _LOCK, harness_busy():
            _s["depth"] -= 1
            tampered = _restore(mine)
            now = _s["patched"]         # the names stubbed, as this block made them?
            if names and (len(now) != len(names) or not all(map(operator.is_, now, names))):
                tampered.append(refs[0])                # another binding to "put back"
                _s["patched"] = list(names)
            used = list(_s["used"]) + tampered
            if _s["depth"] == 0:
                for owner, attr, value in reversed(_s["patched"]):
                    setattr(owner, attr, value)
                _s["patched"] = []
    if tampered:
        raise ReferenceUsed(f"the code of {tampered[0]} (the course's own answer) was put back "
                            f"while the check ran: write {exercise} yourself")
    if used:
        raise ReferenceUsed(_message(used[0], exercise))


def _owner(dotted):
    obj = _FACADE
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
    return obj


@contextlib.contextmanager
def codes_routed(codes):
    """{function: code} written while the block runs, put back after, as the harness's own
    writes (dist_bound.py's routes of torch.distributed's functions, bound however early);
    yields {function: a copy of it with its own code}, for the calls not routed."""
    with _LOCK, harness_busy():
        own = {}
        for fn, code in codes.items():
            own[fn] = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__,
                                         fn.__defaults__, fn.__closure__)
            own[fn].__kwdefaults__ = fn.__kwdefaults__
            codes[fn], _ = fn.__code__, _write_code(fn, code)
    try:
        yield own
    finally:
        with _LOCK, harness_busy():
            for fn, code in codes.items():
                _write_code(fn, code)


del _STATE
