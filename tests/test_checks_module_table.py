"""The table of imported modules (`sys.modules`) is the import system's: an answer that puts a
stand-in there, or removes an entry, under a name built at run time, would hand the check's own
later imports the reader's objects (`from helpers import TPBlock` measuring a TPBlock that never
communicates; `from ._core import Recorder` in a later check recording nothing). Answer fails
such an answer naming the entry, and puts the original back (patched.py); the harness binds what
it imports when it loads, so it never looks a module up there after an answer ran. Entries an
answer adds (its own imports) pass.
"""
import builtins
import copy
import importlib
import operator
import sys
import threading
import types

import pytest
import torch
from check_cases import parametrize_cases, shortcut

import helpers
from helpers.checks import check_lr_at, check_weight_grads

TABLE = "sys.modules"
_SYS = importlib.import_module("s" + "ys")
_TABLE = getattr(_SYS, "mod" + "ules")       # reached by a built name, as an answer would


def _lr(step, base_lr, base_batch, batch, warmup):
    peak = base_lr * batch / base_batch
    return peak * min(1.0, (step + 1) / warmup) if warmup else peak


def _wgrad(x, dy):
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    return dy2.T @ x2, dy2.sum(0)


def _facade():
    """A stand-in `helpers` whose TPBlock runs the block on one rank: no all-reduce, 0 bytes."""
    fake = types.ModuleType("help" + "ers")
    fake.__dict__.update({k: v for k, v in vars(helpers).items() if not k.startswith("__")})
    fake.TPBlock = lambda block, comm: copy.deepcopy(block)
    return fake


# ---- the façade the check imports after the call ------------------------------------------------
@shortcut("check_tp_ring_bytes", "a stand-in helpers in sys.modules whose TPBlock never "
          "all-reduces, and its 0 bytes", [TABLE, "['helpers']"])
def tp_bytes_facade_swapped(batch, seq, width, k):
    _TABLE["help" + "ers"] = _facade()
    return 0


@shortcut("check_tp_ring_bytes", "the stand-in's 0 bytes without the swap (the control)",
          "so expected")
def tp_bytes_stand_in_number(batch, seq, width, k):
    return 0


@shortcut("check_tp_ring_bytes", "the stand-in helpers put in sys.modules by a thread it starts "
          "and joins", [TABLE, "['helpers']"])
def tp_bytes_facade_swapped_in_thread(batch, seq, width, k):
    t = threading.Thread(target=_TABLE.__setitem__, args=("help" + "ers", _facade()))
    t.start()
    t.join()
    return 0


@shortcut("check_weight_grads", "a right answer that puts a stand-in torch.nn.functional in "
          "sys.modules", [TABLE, "['torch.nn.functional']"])
def wgrad_functional_swapped(x, dy):
    real = _TABLE["torch.nn." + "functional"]
    fake = types.ModuleType(real.__name__)
    fake.__dict__.update(vars(real), linear=lambda x, w, b=None: torch.zeros(()))
    _TABLE["torch.nn." + "functional"] = fake
    return _wgrad(x, dy)


@shortcut("check_lr_at", "a right answer that puts a stand-in harness module in sys.modules",
          [TABLE, "['helpers.checks._core.observe']"])
def lr_at_observe_swapped(step, base_lr, base_batch, batch, warmup):
    name = "helpers.checks._core." + "observe"
    _TABLE[name] = types.ModuleType(name)
    return _lr(step, base_lr, base_batch, batch, warmup)


@shortcut("check_lr_at", "a right answer that rebinds sys.modules to a copy holding a stand-in",
          [TABLE, "itself"])
def lr_at_table_rebound(step, base_lr, base_batch, batch, warmup):
    setattr(_SYS, "mod" + "ules", {**_TABLE, "help" + "ers": _facade()})
    return _lr(step, base_lr, base_batch, batch, warmup)


test_case = parametrize_cases(__name__)


@pytest.fixture(autouse=True)
def table():
    """sys.modules and sys.path as they were, put back after the test whatever the harness
    did (a failing test must not leave a stand-in for the tests after it)."""
    held, modules, path = sys.modules, dict(sys.modules), list(sys.path)
    try:
        yield
    finally:
        sys.modules = held
        sys.path[:] = path
        for key in [k for k in sys.modules if k.startswith(("helpers_real", "mine_"))]:
            del sys.modules[key]
        sys.modules.update(modules)         # real imports added meanwhile stay


def test_a_removed_facade_found_again_on_a_path_of_the_readers_fails(tmp_path):
    """Removing `helpers` and putting a directory with a stand-in first on sys.path: the check's
    next `from helpers import TPBlock` would import the reader's file."""
    where = tmp_path
    (where / ("help" + "ers")).mkdir()
    (where / ("help" + "ers") / "__init__.py").write_text(
        "import copy, sys\nreal = sys.modules.pop('helpers_real')\n"
        "globals().update({k: v for k, v in vars(real).items() if not k.startswith('__')})\n"
        "def TPBlock(block, comm):\n    return copy.deepcopy(block)\n")

    def answer(batch, seq, width, k):
        _TABLE["helpers_real"] = _TABLE.pop("help" + "ers")
        _SYS.path.insert(0, str(where))
        return 0

    from helpers.checks import check_tp_ring_bytes
    result = check_tp_ring_bytes(answer)
    assert result.status == "failed" and "sys.modules['helpers'] (removed)" in result.message, \
        result
    assert sys.modules["helpers"] is helpers


def test_a_stand_in_harness_left_for_a_later_check_fails_and_is_put_back():
    """A right answer that leaves a `helpers.checks._core` whose Recorder records nothing: the
    later check_weight_grads (which records the answer's operations) would pass an answer that
    runs the layer's forward again."""
    core = sys.modules["helpers.checks._" + "core"]

    class Blind:
        ops = []

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def right_and_swapping(step, base_lr, base_batch, batch, warmup):
        real = _TABLE["helpers.checks._" + "core"]
        fake = types.ModuleType(real.__name__)
        fake.__dict__.update(vars(real), Recorder=Blind)
        _TABLE["helpers.checks._" + "core"] = fake
        return _lr(step, base_lr, base_batch, batch, warmup)

    def forward_again(x, dy):
        w = torch.zeros(dy.shape[-1], x.shape[-1], requires_grad=True)
        b = torch.zeros(dy.shape[-1], requires_grad=True)
        return torch.autograd.grad(torch.nn.functional.linear(x, w, b), (w, b), dy)

    first = check_lr_at(right_and_swapping)
    assert first.status == "failed" and "sys.modules['helpers.checks._core']" in first.message, \
        first
    assert sys.modules["helpers.checks._core"] is core
    later = check_weight_grads(forward_again)
    assert later.status == "failed" and "forward again" in later.message, later


def _importing(where):
    """A right lr_at answer whose imports add entries: a module of its own (written in
    `where`), a library not yet loaded, one reloaded in place (the same module object)."""
    name = f"mine_{abs(hash(str(where)))}"
    (where / f"{name}.py").write_text("def peak(base_lr, base_batch, batch):\n"
                                      "    return base_lr * batch / base_batch\n")
    sys.path.insert(0, str(where))

    def answer(step, base_lr, base_batch, batch, warmup):
        mine = importlib.import_module(name)
        importlib.reload(importlib.import_module("colorsys"))
        importlib.import_module("xml.dom.minidom")
        peak = mine.peak(base_lr, base_batch, batch)
        return peak * min(1.0, (step + 1) / warmup) if warmup else peak
    return name, answer


def test_a_right_answer_that_imports_new_modules_passes(tmp_path):
    """Entries an answer adds are its own imports: a module of its own, a library not yet loaded,
    one reloaded in place (the same module object)."""
    name, answer = _importing(tmp_path)
    result = check_lr_at(answer)
    assert result.status == "passed", result
    assert name in sys.modules


def test_harness_files_stay_the_harness_after_an_answer_replaced_builtins(tmp_path):
    """Whose file a frame's code is (run.is_reader_code) is kept for the process: a harness file
    first judged while an answer had builtins replaced (pathlib reads len and map) stayed the
    reader's, and a later right answer failed as "inspects the running program (gc.get_referents,
    in proxied ...)". Emptying the kept verdicts puts every first judging in that window."""
    from helpers.checks._core import keys, run

    def replacing(step, base_lr, base_batch, batch, warmup):
        builtins.all, builtins.map = (lambda it: True), (lambda *a: ())
        builtins.len, operator.is_ = (lambda x: 0), (lambda a, b: True)
        return 0.0
    run._reader_file.cache_clear()
    try:
        first = check_lr_at(replacing)
        assert first.status == "failed" and "replaced" in first.message, first
        assert not run.is_reader_code(keys.proxied.__code__.co_filename)
        result = check_lr_at(_importing(tmp_path)[1])
        assert result.status == "passed", result
    finally:                # nothing judged in the replaced window is kept for later tests
        run._reader_file.cache_clear()
