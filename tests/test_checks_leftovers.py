"""Shortcut families closed at the harness's root, as tests/check_cases.py's cases: every
shortcut fails with the words that name it, the right answers beside them pass.

- H: hooks an answer registers on what it was handed (a module's forward hooks, a process-wide
  module hook, a saved-tensors hook left entered, a gradient hook) run after it returns, while
  the check computes its expected value from the same objects: an answer that returns with one
  still registered fails (hooks.py);
"""
import pytest
import torch
from check_cases import other, parametrize_cases, shortcut

import helpers
from helpers.checks._core import CheckFailed
from helpers.checks._core.declare import Answer

LEFT = "still registered"


# ---- H: hooks left on what the answer was handed ---------------------------------------------
def _off(module, args):
    torch._C._set_grad_enabled(False)


def _on(module, args, out):
    torch._C._set_grad_enabled(True)


@shortcut("check_saved_bytes", "forward hooks that switch autograd off in the check's forward",
          LEFT)
def saved_bytes_grad_off_hooks(net, X):
    net.register_forward_pre_hook(_off)       # the check's net(X) then saves nothing
    net.register_forward_hook(_on)
    return 0


@shortcut("check_saved_bytes", "a process-wide module hook that switches autograd off", LEFT)
def saved_bytes_global_hooks(net, X):
    from torch.nn.modules.module import (
                                         register_module_forward_hook,
                                         register_module_forward_pre_hook,
    )
    register_module_forward_pre_hook(_off)
    register_module_forward_hook(_on)
    return 0


@other("check_saved_bytes", "counted through hooks it removes before returning")
def saved_bytes_hooks_removed(net, X):
    params = {q.untyped_storage().data_ptr() for q in net.parameters()}
    seen = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params:
            seen[key] = t.untyped_storage().nbytes()
        return t
    handle = net.register_forward_pre_hook(lambda m, a: None)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(X)
    handle.remove()
    return sum(seen.values())


def _grad_hook(net, X):
    next(net.parameters()).register_hook(lambda g: g * 0)


def _post_accumulate(net, X):
    next(net.parameters()).register_post_accumulate_grad_hook(lambda p: None)


def _in_a_list(net, X):
    X[0].register_hook(lambda g: g)


def _optimizer(net, X):
    X.register_step_post_hook(lambda opt, args, kwargs: None)


def _saved_entered(net, X):
    torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t).__enter__()


def _backward_hook(net, X):
    net[0].register_full_backward_hook(lambda m, gi, go: None)


@pytest.mark.parametrize("leave", [_grad_hook, _post_accumulate, _in_a_list, _optimizer,
                                   _saved_entered, _backward_hook])
def test_hook_left_fails_and_is_removed(leave):
    """Every kind of hook left behind fails the answer, and the harness takes it away."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    X = {_in_a_list: [torch.ones(2, requires_grad=True)],
         _optimizer: torch.optim.SGD(net.parameters(), lr=0.1)}.get(leave, torch.ones(1, 3))
    top = torch._C._autograd._top_saved_tensors_default_hooks(False)
    with pytest.raises(CheckFailed, match=LEFT):
        Answer(leave, "x", [])(net, X)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) == top
    Answer(lambda net, X: None, "x", [])(net, X)      # nothing left over from the first call


def test_hook_kept_where_declared():
    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    Answer(_post_accumulate, "x", [], keeps_hooks=True)(net, None)
    assert next(net.parameters())._post_accumulate_grad_hooks


_ = helpers
test_case = parametrize_cases(__name__)
