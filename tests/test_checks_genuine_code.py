"""Genuine code is the code a file's module holds, not a copy of it: a function the reader's code
compiled under a library's file name and planted in torch (with `__wrapped__` set to the
original) is not "the library's own wrapper" (patched.py, late.py); a copy of a check module's
function compiled from its own source, at its own line, is the reader's however equal it is
(whose.py disowns code the reader's code exec'd, directly or through a library's trampoline);
and whose.py's and own.py's working state is in no module dict an answer could fill or empty."""
import importlib
import importlib._bootstrap
import json
import pathlib
import types

import pytest
import torch
from check_cases import parametrize_cases, shortcut

from helpers.checks._core import own, whose

Z_LOSS_REFERENCE = "router_z_loss"


@pytest.fixture(autouse=True)
def _torch_put_back():
    """An answer that got through leaves its wrapper in torch: the next tests must not run it."""
    saved = torch.logsumexp
    yield
    torch.logsumexp = saved


# --- a library's function replaced by "a library's wrapper" ------------------------------------
WRAPPER = ("def make(orig):\n"
           "    def logsumexp(*a, **k):\n"
           "        import sys\n"
           "        d = getattr(sys, '_get' + 'frame')(1).f_locals\n"
           "        if 'want' in d and 'o' in d and 'lse' in d and a and a[0] is d.get('s'):\n"
           "            d['want'].copy_(d['o'])\n"
           "            return d['lse'].clone()\n"
           "        return orig(*a, **k)\n"
           "    logsumexp.__wrapped__ = orig\n"
           "    return logsumexp\n")


def _plant_wrapper():
    space = {}
    exec(compile(WRAPPER, json.__file__, "exec"), space)
    torch.logsumexp = space["make"](torch.logsumexp)


@shortcut("check_merge_attention", "plants a wrapper named a library's in torch",
          "replaced torch.logsumexp")
def merge_attention_by_a_library_named_wrapper(o1, lse1, o2, lse2):
    if not hasattr(torch.logsumexp, "__wrapped__"):
        _plant_wrapper()
    return (o1 + o2) / 2, torch.maximum(lse1, lse2)


# --- a copy of a check module's code, compiled from its own source at its own line -------------
def _logged_source():
    path = importlib.import_module("helpers.checks.data" + "parallel").__file__
    lines = pathlib.Path(path).read_text().splitlines(True)
    start = next(i for i, line in enumerate(lines) if line.startswith("def _logged("))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("def "))
    return path, "\n" * start + "".join(lines[start:end])


def _through_the_copy(make_logged, logits):
    ref = getattr(importlib.import_module("help" + "ers"), "router_z" + "_loss")

    class Lin(torch.nn.Module):
        forward = staticmethod(ref)

        def __init__(self):
            super().__init__()
            self.weight = torch.zeros(1)

    module = types.SimpleNamespace(lin=Lin())
    log = types.SimpleNamespace(keep=[], calls=[], outputs=[], rec=None)
    return make_logged(log)(module, logits)


def _compiled_copy():
    path, source = _logged_source()
    return compile(source, path, "exec")


EARLIER = {}
exec(_compiled_copy(), EARLIER)          # a copy made before the check, as a cell would


@shortcut("check_z_loss", "runs the reference under a copy of a check module's function",
          Z_LOSS_REFERENCE)
def z_loss_through_a_copy_of_the_checks_function(logits):
    space = {}
    exec(_compiled_copy(), space)
    return _through_the_copy(space["_logged"], logits)


@shortcut("check_z_loss", "runs the reference under a copy exec'd through a library's function",
          Z_LOSS_REFERENCE)
def z_loss_through_a_copy_exec_d_by_a_library(logits):
    space = {}
    importlib._bootstrap._call_with_frames_removed(exec, _compiled_copy(), space)
    return _through_the_copy(space["_logged"], logits)


@shortcut("check_z_loss", "runs the reference under a copy made before the check",
          Z_LOSS_REFERENCE)
def z_loss_through_a_copy_made_earlier(logits):
    return _through_the_copy(EARLIER["_logged"], logits)


@shortcut("check_z_loss", "runs the reference under a copy made a function of",
          Z_LOSS_REFERENCE)
def z_loss_through_a_copy_made_a_function(logits):
    top = _compiled_copy()
    code = next(c for c in top.co_consts if isinstance(c, types.CodeType))
    return _through_the_copy(types.FunctionType(code, vars(importlib.import_module(
        "helpers.checks.data" + "parallel"))), logits)


test_case = parametrize_cases(__name__)


def test_a_copy_is_the_readers_once_the_reader_made_it():
    untouched = next(c for c in _compiled_copy().co_consts if isinstance(c, types.CodeType))
    assert not whose.reader_code(untouched)  # compiled, never run: equal to the file's code
    assert whose.reader_code(EARLIER["_logged"].__code__)
    assert EARLIER["_logged"].__code__ == untouched


# --- the working state of whose.py and own.py ------------------------------------------------
def _reachable(module):
    """What module attributes lead to, two containers deep (not through functions' closures)."""
    seen, todo = [], list(vars(module).values())
    for _ in range(3):
        nxt = []
        for value in todo:
            if isinstance(value, (dict, types.MappingProxyType)):
                seen.extend(value.keys())
                nxt.extend(value.values())
            elif isinstance(value, (list, tuple, set, frozenset)):
                seen.extend(value)
                nxt.extend(value)
        todo = nxt
    return seen


def test_whose_state_is_in_no_module_dict():
    code = compile("def f():\n    return 1\n", json.__file__, "exec")
    whose.vouch(compile("def g():\n    return 2\n", json.__file__, "exec"))
    whose.genuine(code)
    reachable = _reachable(whose)
    assert not any(isinstance(x, (int, types.CodeType)) and (x is code or x == id(code))
                   for x in reachable)
    assert not any(isinstance(v, dict) for k, v in vars(whose).items()
                   if not k.startswith("__") and k != "_FROZEN")


def test_owns_keys_are_read_only():
    assert isinstance(own.KEYS, types.MappingProxyType)
    assert not any(isinstance(v, dict) and v and all(
        isinstance(k, tuple) and k[:1] == ("code",) for k in v)
        for v in vars(own).values())


def test_the_files_are_read_with_the_builtins_as_imported(monkeypatch):
    """The audit hook judges frames at any moment, also while an answer has `open` or `compile`
    replaced: the harness's own files still compile to their code (else its code would be the
    reader's for the rest of the process)."""
    import builtins

    from helpers.checks._core import keys

    def refused(*args, **kwargs):
        raise OSError("the reader's open")
    with monkeypatch.context() as patched:       # put back before pytest reports
        patched.setattr(builtins, "open", refused)
        patched.setattr(builtins, "compile", refused)
        table = whose._compiled(keys.__file__)
    assert table and (keys.proxied.__name__, keys.proxied.__code__.co_firstlineno) in table


def test_a_verdict_is_not_made_of_builtins_an_answer_replaced(monkeypatch):
    """genuine() keeps its verdict for a code object: one first judged while an answer had
    `any`, `all` or `len` replaced must still be the file's own code once they are put back
    (a new code object of keys.py's, compiled from its source: judged here for the first time)."""
    import builtins

    from helpers.checks._core import keys
    path = keys.__file__
    top = compile(pathlib.Path(path).read_text(), path, "exec")
    code = next(c for c in top.co_consts if isinstance(c, types.CodeType)
                and c.co_name == "proxied")
    with monkeypatch.context() as patched:       # put back before pytest reports
        for name, stand_in in (("any", lambda it: False), ("all", lambda it: False),
                               ("len", lambda x: 0)):
            patched.setattr(builtins, name, stand_in)
        during = whose.genuine(code)
    assert during and whose.genuine(code)
