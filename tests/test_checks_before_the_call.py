"""Code of the reader's installed before a check (a dispatch or torch function mode entered in an
earlier cell, a hook for every module or optimizer, saved-tensor hooks) would run inside it: its
reference values, its comparisons, the answer's operations under the Recorder. hooks.py fails
only what the answer adds, so a check refuses to start while one is active (early_hooks.py),
naming what to remove, and leaves it in place; torch's own, or none, and the check runs."""
import functools
import operator

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import helpers.checks
from helpers.checks._core import fresh
from helpers.checks._core.early_hooks import early_hooks

FLAG = [False]
RESTART = "restart the kernel"


class _Allclose(TorchDispatchMode):
    """Answers the check's first aten.allclose after the answer with True."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if FLAG[0] and func is torch.ops.aten.allclose.default:
            FLAG[0] = False
            return True
        return func(*args, **(kwargs or {}))


class _AllcloseFn(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if FLAG[0] and func is torch.allclose:
            FLAG[0] = False
            return True
        return func(*args, **(kwargs or {}))


class _HiddenWork(TorchDispatchMode):
    """A library-looking mode fed the reader's callback (kept in its attributes)."""

    def __init__(self, callback):
        super().__init__()
        self.callback = callback

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def combine_mean_grads_plain(grads, sizes):
    FLAG[0] = True
    return sum(grads) / len(grads)             # wrong: overweights the small shards


def combine_mean_grads(grads, sizes):
    return sum(g * s for g, s in zip(grads, sizes, strict=True)) / sum(sizes)


KEPT, KEPT_BY = [], {}


def _keep(module, args, out):
    KEPT.append(module)


def _step(optimizer, args, kwargs):
    return None


def _dispatch():
    mode = _Allclose()
    mode.__enter__()
    return lambda: mode.__exit__(None, None, None)


def _function():
    mode = _AllcloseFn()
    mode.__enter__()
    return lambda: mode.__exit__(None, None, None)


def _library_mode():
    mode = _HiddenWork(_keep)
    mode.__enter__()
    return lambda: mode.__exit__(None, None, None)


def _module_hook():
    return torch.nn.modules.module.register_module_forward_hook(_keep).remove


def _module_pre_hook():
    return torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: None).remove


def _builtin_hook():
    """No code of the reader's runs: a builtin keeps each module in the reader's dict."""
    return torch.nn.modules.module.register_module_forward_pre_hook(
        functools.partial(operator.setitem, KEPT_BY)).remove


def _optimizer_hook():
    return register_optimizer_step_pre_hook(_step).remove


def _saved_hooks():
    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    hooks.__enter__()
    return lambda: hooks.__exit__(None, None, None)


INSTALLS = {_dispatch: "a dispatch mode of yours (_Allclose)",
            _function: "a torch function mode of yours (_AllcloseFn)",
            _library_mode: "a dispatch mode of yours (_HiddenWork)",
            _module_hook: "a hook of yours for every module (_keep",
            _module_pre_hook: "a hook of yours for every module",
            _builtin_hook: "a hook of yours for every module (setitem",
            _optimizer_hook: "a hook of yours for every optimizer (_step",
            _saved_hooks: "saved-tensor hooks of yours"}


@pytest.fixture(autouse=True)
def _not_grading(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    FLAG[0] = False
    KEPT.clear()
    KEPT_BY.clear()


@pytest.mark.parametrize("install", list(INSTALLS), ids=lambda f: f.__name__)
def test_a_check_refuses_to_start_under_the_readers_code(install):
    """The wrong answer fails, and so does the right one, naming what to remove; what was
    installed stays (the reader removes it), and nothing of it ran inside the check."""
    remove = install()
    try:
        for answer in (combine_mean_grads_plain, combine_mean_grads):
            result = helpers.checks.check_combine_mean_grads(answer)
            assert result.status == "failed", result
            assert INSTALLS[install] in result.message and RESTART in result.message, result
        assert early_hooks(), "the reader's code was removed: the reader's process changed"
    finally:
        remove()
    assert not KEPT and not KEPT_BY
    assert not early_hooks()
    assert helpers.checks.check_combine_mean_grads(combine_mean_grads).status == "passed"


def test_the_hook_that_kept_the_checks_module():
    """A global forward hook sees the check's reference BatchNorm, run before the answer is
    called: the answer cannot return the module's running stats as its own."""
    def update_running_stats(running_mean, running_var, mean, var, n, momentum):
        if not KEPT:
            return running_mean, running_var
        bn = KEPT.pop()
        return bn.running_mean.clone(), bn.running_var.clone()
    remove = _module_hook()
    try:
        result = helpers.checks.check_update_running_stats(update_running_stats)
    finally:
        remove()
    assert result.status == "failed" and "for every module" in result.message, result
    assert not KEPT


def test_regrade_refuses_too(monkeypatch):
    """The hidden tests' fresh import of the course refuses as the notebook's check does."""
    monkeypatch.setenv("COURSE_GRADING", "1")
    remove = _function()
    try:
        with pytest.raises(AssertionError, match="torch function mode of yours"):
            fresh.regrade("check_combine_mean_grads", combine_mean_grads_plain)
    finally:
        remove()


def test_torchs_own_mode_entered_earlier_is_no_reader_code():
    """A mode of torch's (no code of the reader's in it) does not stop a check."""
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    counter.__enter__()
    try:
        assert not early_hooks()
    finally:
        counter.__exit__(None, None, None)
