"""An exception the answer raised, settled before its guarded call ends (declare.Answer), as what
it returns is (settle.py): the check turns it into words after the call (run.py's verdict, a
World's first cause, a check's `except ... as e`), and words of an exception run its class's
`__str__`, its arguments' `__str__` and `__repr__`, its notes and its chain. So an exception
that is not plain (a class of the reader's, or a metaclass; arguments, attributes or notes that
are not plain data; a chain that is not plain) is replaced, still inside the call, by an
exception of the first C type it derives from (`ValueError`, `AssertionError`) holding its text,
taken now, while the answer's observers still watch (a `__str__` that changes the harness is
judged like the answer), with its traceback (run.py's blame reads the reader's frames from it).
What the check reads of an exception afterwards it reads with C-level accessors (`describe`)."""
from .parts import class_mro
from .settle import _IMMUTABLE, reader_class

__all__ = ["settled_raise", "describe", "type_name", "traceback_of"]

_NAME = type.__dict__["__name__"].__get__
_FLAGS = type.__dict__["__flags__"].__get__
_ARGS = BaseException.__dict__["args"].__get__
_DICT = BaseException.__dict__["__dict__"].__get__
_CAUSE = BaseException.__dict__["__cause__"].__get__
_CONTEXT = BaseException.__dict__["__context__"].__get__
_SUPPRESS = BaseException.__dict__["__suppress_context__"].__get__
_TB = BaseException.__dict__["__traceback__"].__get__
_STR = BaseException.__str__
_WITH_TB = BaseException.with_traceback
_UNREADABLE = "(its message could not be read)"
_DEPTH = 4
# data whose words run no Python code, told by identity (`type(v) in a_set` would hash the type:
# a metaclass's `__hash__`)
_ATOMS = (type(None), bool, int, float, complex, str, bytes)


def _inert(v, depth=0):
    cls = type(v)
    if any(cls is a for a in _ATOMS):
        return True
    return cls is tuple and depth < _DEPTH and all(_inert(u, depth + 1) for u in v)


def _exception(v):
    """An exception, told from its type alone (`isinstance` would read a `__class__` property)."""
    return issubclass(type(v), BaseException)


def type_name(cls):
    """A class's own name, read from the type (a metaclass's `__name__` property never runs)."""
    return _NAME(cls)


def traceback_of(exc):
    """An exception's traceback, read from BaseException's slot (a class's property never runs)."""
    return _TB(exc)


def _plain(exc, depth=0):
    """Whether words of `exc` run nothing but the libraries' code: its class is not the
    reader's, with `type` as its metaclass, its arguments and attributes are plain data (or
    plain exceptions: a launch's RankFailed keeps the rank's), its chain too."""
    cls = type(exc)
    if depth > _DEPTH or type(cls) is not type:
        return False
    if not _FLAGS(cls) & _IMMUTABLE and reader_class(cls):
        return False
    values = (*_ARGS(exc), *dict.values(_DICT(exc)))
    if not all(_inert(v) or (_exception(v) and _plain(v, depth + 1)) for v in values):
        return False
    return all(link is None or _plain(link, depth + 1) for link in (_CAUSE(exc), _CONTEXT(exc)))


def _c_base(cls):
    """The C types `cls` derives from, nearest first (BaseException is always one)."""
    return [c for c in class_mro(cls) if _FLAGS(c) & _IMMUTABLE and issubclass(c, BaseException)]


def _text(exc):
    """`str(exc)`, run now (inside the answer's call: its code is watched as the answer's); a
    text that is not a plain str, or that raised, is not shown."""
    try:
        text = str(exc)
    except Exception:
        return _UNREADABLE
    return text if type(text) is str else _UNREADABLE


def settled_raise(exc):
    """`exc` itself if plain, else an exception of its nearest C type holding its text (and the
    name of the reader's class), with its traceback and no chain."""
    if _plain(exc):
        return exc
    cls, args = type(exc), _ARGS(exc)
    text = _text(exc)
    name = type_name(cls) if type(cls) is type else "an exception of your metaclass"
    for base in _c_base(cls):
        said = text if type_name(base) == name else f"{text} (raised as {name})"
        attempts = ((args,) if all(_inert(v) for v in args) and base is cls else ()) + ((said,),)
        for tried in attempts:
            try:
                new = base(*tried)
            except Exception:     # a C type's own arguments (UnicodeDecodeError's five)
                continue
            return _WITH_TB(new, _TB(exc))
    return _WITH_TB(BaseException(f"{text} (raised as {name})"), _TB(exc))


def describe(exc):
    """An exception's words for a verdict, read without running any class's code: its arguments
    as BaseException words them, when they are plain data (settled_raise made them so for
    every exception out of an answer; the harness's own carry a plain message)."""
    args = _ARGS(exc)
    return _STR(exc) if all(_inert(v) for v in args) else _UNREADABLE
