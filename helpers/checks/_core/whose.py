"""Whose code a code object is, by what it is and not only by the file name it claims.

`compile(source, name, ...)` lets any code claim any file: a function compiled from the
reader's source under `json/__init__.py`, a check module's path or `<frozen os>` would pass
`is_reader_code` (run.py) as a library's or the course's. `reader_code(code)` calls code the
reader's when its file name says so, or when it claims a library's, the course's or a frozen
module's file but is not that file's own code: the file's source (a frozen module's own code
object) is compiled once per process and the code must equal (CPython's code equality: bytecode,
constants, names, first line) one of its code objects of the same name and first line. The
harness vouches for the code it compiles under its own files (the stubs, the own-helpers' gates).
"""
import _imp
import functools
import os
import types

from .run import is_reader_code

__all__ = ["reader_code", "genuine", "vouch", "file_code"]

_TREES = {}     # file name -> {(co_name, co_firstlineno): (code, ...)}, or None (unreadable)
_SEEN = {}      # id(code) -> (code, genuine?): by identity, the code kept alive with its answer
_VOUCHED = {}   # id(code) -> code: compiled by the harness under its own file's name
_FROZEN = {"importlib._bootstrap": "_frozen_importlib",
           "importlib._bootstrap_external": "_frozen_importlib_external"}


def _codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _tree(filename):
    """The code objects the file `filename` (or the frozen module it names) compiles to."""
    if filename in _TREES:
        return _TREES[filename]
    top = None
    try:
        if filename.startswith("<frozen ") and filename.endswith(">"):
            name = filename[len("<frozen "):-1]
            name = _FROZEN.get(name, name)
            top = _imp.get_frozen_object(name) if _imp.is_frozen(name) else None
        elif not filename.startswith("<"):
            with open(filename, "rb") as source:
                top = compile(source.read(), filename, "exec", dont_inherit=True, optimize=-1)
    except (OSError, SyntaxError, ValueError, ImportError):
        top = None
    found = None
    if top is not None:
        found = {}
        for code in _codes(top):
            found.setdefault((code.co_name, code.co_firstlineno), []).append(code)
        found = {key: tuple(codes) for key, codes in found.items()}
    _TREES[filename] = found
    return found


def vouch(code):
    """Code the harness compiled under its own file's name (and the code nested in it)."""
    for inner in _codes(code):
        _VOUCHED[id(inner)] = inner
    return code


def genuine(code):
    """True when `code` is its file's own code (or the harness vouched for it)."""
    if _VOUCHED.get(id(code)) is code:
        return True
    hit = _SEEN.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    tree = _tree(code.co_filename)
    same = tree is not None and any(
        code == mine for mine in tree.get((code.co_name, code.co_firstlineno), ()))
    if len(_SEEN) >= 16384:
        _SEEN.clear()
    _SEEN[id(code)] = (code, same)
    return same


def reader_code(code):
    """True when `code` (a code object) is the reader's: by its file name (is_reader_code), or
    because it claims a file that is not the reader's without being that file's code."""
    return is_reader_code(code.co_filename) or not genuine(code)


def file_code(code, path):
    """True when `code` is the code of the file `path` (an absolute path), not a copy compiled
    under its name."""
    return os.path.abspath(code.co_filename) == path and genuine(code)


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
