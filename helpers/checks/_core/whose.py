"""Whose code a code object is, by what it is and not only by the file name it claims.

`compile(source, name, ...)` lets any code claim any file: a function compiled from the
reader's source under `json/__init__.py`, a check module's path or `<frozen os>` would pass
`is_reader_code` (run.py) as a library's or the course's. `reader_code(code)` calls code the
reader's when its file name says so, or when it claims a library's, the course's or a frozen
module's file but is not that file's own code: the file's source (a frozen module's own code
object) is compiled once per process and the code must equal (CPython's code equality: bytecode,
constants, names, first line) one of its code objects of the same name and first line. The
harness vouches for the code it compiles under its own files (the stubs, the own-helpers' gates);
code the reader's code exec'd or made a function of is disowned (guard.py's hook), so a copy
compiled from a file's own source is the reader's however equal it is. `namedtuple_new(code,
space)` knows one kind of code compiled from a string that is no one's work: a namedtuple's
generated `__new__`, by its code and what it calls.
"""
import _imp
import collections
import functools
import io
import keyword
import os
import types

from .bytecode import nested
from .keys import str_keys
from .run import is_reader_code

__all__ = ["reader_code", "genuine", "vouch", "disown", "made_by_reader", "file_code",
           "namedtuple_new"]

_WALK = 6           # frames up from an exec to its reader's caller (a library's trampoline)
_IMPORTING = frozenset({"_load_unlocked", "exec_module", "_exec", "_load"})
_FROZEN = {"importlib._bootstrap": "_frozen_importlib",
           "importlib._bootstrap_external": "_frozen_importlib_external"}


def _compiled(filename, _open=io.open, _compile=compile, _frozen=_imp.is_frozen,
              _frozen_object=_imp.get_frozen_object, _len=len, _tuple=tuple):
    """The code objects the file `filename` (or the frozen module it names) compiles to. The
    callables are bound at import: the audit hook judges frames at any moment, and a name looked
    up then (`open` in builtins) could meet a key or a patch the reader left there, and a file
    judged unreadable once would leave its code the reader's for the rest of the process."""
    top = None
    try:
        if filename.startswith("<frozen ") and filename.endswith(">"):
            name = filename[_len("<frozen "):-1]
            name = _FROZEN.get(name, name)
            top = _frozen_object(name) if _frozen(name) else None
        elif not filename.startswith("<"):
            with _open(filename, "rb") as source:
                top = _compile(source.read(), filename, "exec", dont_inherit=True, optimize=-1)
    except (OSError, SyntaxError, ValueError, ImportError):
        top = None
    if top is None:
        return None
    found = {}
    for code in nested(top):
        found.setdefault((code.co_name, code.co_firstlineno), []).append(code)
    return {key: _tuple(codes) for key, codes in found.items()}


def _make(_id=id, _type=type, _all=all, _any=any, _len=len, _range=range):
    """vouch and genuine, their caches in this closure: no module attribute leads to them (a
    cell that reached a module dict of whose by a built name could enter its own code). The
    builtins they call are bound here too: a verdict is kept, and one made while an answer had
    `any` replaced would make the harness's own code the reader's for good."""
    trees = {}      # file name -> {(co_name, co_firstlineno): (code, ...)}, or None (unreadable)
    seen = {}       # id(code) -> (code, genuine?): by identity, the code kept alive with its answer
    vouched = {}    # id(code) -> code: compiled by the harness under its own file's name
    disowned = {}   # id(code) -> code: exec'd (or made a function) by the reader's code

    def vouch(code):
        """Code the harness compiled under its own file's name (and the code nested in it)."""
        for inner in nested(code):
            vouched[_id(inner)] = inner
        return code

    def disown(code, frame, event):
        """guard.py's hook, on `event` (exec, or a new function) of `code` called from `frame`:
        code the reader's code exec'd (directly or through a library's function that hands it
        on, not an import: the import system's frames) or made a function of (directly: a
        library that makes one of its own code for the reader's keeps it) is the reader's,
        whatever file it claims and however equal it is to that file's own code."""
        for _ in _range(_WALK if event == "exec" else 1):
            if frame is None or made_by_reader(frame.f_code):
                break
            if frame.f_code.co_name in _IMPORTING and frame.f_code.co_filename.startswith(
                    "<frozen importlib._bootstrap"):
                return
            frame = frame.f_back
        else:
            return
        if frame is None:
            return
        for inner in nested(code):
            if vouched.get(_id(inner)) is not inner:
                disowned[_id(inner)] = inner

    def genuine(code):
        """True when `code` is its file's own code (or the harness vouched for it)."""
        if vouched.get(_id(code)) is code:
            return True
        if disowned.get(_id(code)) is code:
            return False
        hit = seen.get(_id(code))
        if hit is not None and hit[0] is code:
            return hit[1]
        filename = code.co_filename
        if _type(filename) is not str or _type(code.co_name) is not str or not _all(str_keys(
                (c.co_names, c.co_varnames, c.co_freevars, c.co_cellvars)) for c in nested(code)):
            return False        # a name of the reader's class (`==` below compares the names
            #                     of every nested code object): no method of it runs here
        if filename not in trees:
            trees[filename] = _compiled(filename)
        tree = trees[filename]
        same = tree is not None and _any(
            code == mine for mine in tree.get((code.co_name, code.co_firstlineno), ()))
        if _len(seen) >= 16384:
            seen.clear()
        seen[_id(code)] = (code, same)
        return same

    def made_by_reader(code):
        """True when `code`'s file is the reader's (is_reader_code) or the reader's code exec'd
        it or made a function of it (disown): cheap, no file compiled."""
        return is_reader_code(code.co_filename) or disowned.get(_id(code)) is code

    return vouch, genuine, disown, made_by_reader


vouch, genuine, disown, made_by_reader = _make()


def reader_code(code):
    """True when `code` (a code object) is the reader's: by its file name (is_reader_code), or
    because it claims a file that is not the reader's without being that file's code."""
    return is_reader_code(code.co_filename) or not genuine(code)


def file_code(code, path):
    """True when `code` is the code of the file `path` (an absolute path), not a copy compiled
    under its name."""
    filename = code.co_filename
    return type(filename) is str and os.path.abspath(filename) == path and genuine(code)


@functools.lru_cache(maxsize=4096)
def forwarding_code(freevars, name, module, to, key, filename):
    """The code of a function `name` that hands every call to `module.to(key, args, kwargs)`,
    with as many free variables as the function whose `__code__` it replaces (a function's code
    must match its closure), compiled under the harness's `filename` and vouched for: stubs.py's
    stubs and own.py's gates."""
    free = [f"_f{i}" for i in range(freevars)]
    src = ("def _outer():\n" + "".join(f"    {v} = None\n" for v in free)
           + f"    def {name}(*args, **kwargs):\n"
           + (f"        {', '.join(free)}\n" if free else "")
           + f"        return __import__({module!r}, fromlist=['_']).{to}({key!r}, args, "
           f"kwargs)\n    return {name}\n")
    space = {}
    exec(vouch(compile(src, filename, "exec")), space)
    return space["_outer"]().__code__


@functools.lru_cache(maxsize=256)
def _tuple_new(names):
    """The code of namedtuple's `__new__` over `names` (its maker's template, compiled here: no
    exec, nothing run)."""
    args = ", ".join(names) + ("," if len(names) == 1 else "")
    top = compile(f"lambda _cls, {args}: _tuple_new(_cls, ({args}))", "<string>", "eval",
                  dont_inherit=True)
    return next(c for c in top.co_consts if isinstance(c, types.CodeType))


# the template above is this Python's own (else nothing is recognised)
_TEMPLATE = _tuple_new(("a", "b")) == collections.namedtuple("_T", "a b").__new__.__code__


def namedtuple_new(code, space, _type=type):
    """True when `code`, run with globals `space` (a frame's), is a namedtuple's generated
    `__new__` (file name `<string>`, which is_reader_code calls the reader's): its maker's
    template over its own argument names, its one global `_tuple_new` being `tuple.__new__`.
    Such a frame builds a tuple and runs nothing else, whoever made the class: a copy of the
    template with `_tuple_new` bound to another function is not it."""
    names = code.co_varnames if _type(code) is types.CodeType else None
    if (not _TEMPLATE or names is None or _type(code.co_filename) is not str
            or code.co_filename != "<string>" or not names or not str_keys((names,))
            or names[0] != "_cls" or code.co_argcount != len(names)
            or not all(n.isidentifier() and not keyword.iskeyword(n) for n in names)
            or _type(space) is not dict or not str_keys(space)):
        return False
    return dict.get(space, "_tuple_new") is tuple.__new__ and code == _tuple_new(names[1:])
