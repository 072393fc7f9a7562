"""Nothing an answer registers acts after it returns (hooks.py): a hook left on what the answer
was handed (a module's forward hooks, a process-wide module hook, a saved-tensors hook or a
torch function or dispatch mode left entered, a gradient hook) or on an autograd node (handed,
deeper in its graph, or on the result) fails the answer and is removed, since the check computes
its expected value from the same objects; hooks removed inside the call, and those an exercise
declares (`keeps_hooks=True`), pass (tests/check_cases.py's form).
"""
import pytest
import torch
from check_cases import other, parametrize_cases, shortcut
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import helpers
from helpers.checks._core import CheckFailed
from helpers.checks._core.declare import Answer

LEFT = "still registered"
NODE = "autograd node"


# ---- hooks left on what the answer was handed -----------------------------------------------
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


def _saved_entered_twice(net, X):
    _saved_entered(net, X)
    _saved_entered(net, X)


def _backward_hook(net, X):
    net[0].register_full_backward_hook(lambda m, gi, go: None)


class _Halve(TorchDispatchMode):
    """Every aten operation's float result halved: left entered, it bends the check's forward."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out / 2 if isinstance(out, torch.Tensor) and out.is_floating_point() else out


class _Zeros(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 0 if isinstance(out, torch.Tensor) and out.is_floating_point() else out


class _CallersFunctionMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _CallersDispatchMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _dispatch_mode_entered(net, X):
    _Halve().__enter__()


def _function_modes_entered(net, X):
    _Zeros().__enter__()
    _Zeros().__enter__()


def _stacks():
    return (torch._C._autograd._top_saved_tensors_default_hooks(False),
            list(_get_current_dispatch_mode_stack()), list(_get_current_function_mode_stack()))


@pytest.mark.parametrize("leave", [_grad_hook, _post_accumulate, _in_a_list, _optimizer,
                                   _saved_entered, _saved_entered_twice, _backward_hook,
                                   _dispatch_mode_entered, _function_modes_entered])
def test_hook_left_fails_and_is_removed(leave):
    """Every kind of hook left behind fails the answer, and the harness takes it away: a
    saved-tensor hook or a torch function or dispatch mode left entered is popped back to the
    stack as it was, the mode entered before the answer kept."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    X = {_in_a_list: [torch.ones(2, requires_grad=True)],
         _optimizer: torch.optim.SGD(net.parameters(), lr=0.1)}.get(leave, torch.ones(1, 3))
    with _CallersFunctionMode(), _CallersDispatchMode():      # the caller's own, kept
        before = _stacks()
        with pytest.raises(CheckFailed, match=LEFT):
            Answer(leave, "x", [])(net, X)
        assert _stacks() == before
        Answer(lambda net, X: None, "x", [])(net, X)      # nothing left over from the first call
    assert torch.equal(torch.ones(2) + 1, torch.full((2,), 2.0))


def test_hook_kept_where_declared():
    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    Answer(_post_accumulate, "x", [], keeps_hooks=True)(net, None)
    assert next(net.parameters())._post_accumulate_grad_hooks


# ---- hooks left on autograd nodes --------------------------------------------------------------
def _prehook(X):
    X.grad_fn.register_prehook(lambda g: tuple(x * 0 for x in g))


def _hook(X):
    X.grad_fn.register_hook(lambda gi, go: None)


def _deeper(X):
    X.grad_fn.next_functions[0][0].register_hook(lambda gi, go: None)


def _on_the_result(X):
    out = X * 2
    out.grad_fn.register_prehook(lambda g: g)
    return out


@pytest.mark.parametrize("leave", [_prehook, _hook, _deeper, _on_the_result])
def test_node_hook_left_fails_and_is_removed(leave):
    """A hook left on any autograd node (handed, deeper in its graph, or on the result) fails
    the answer, and the harness takes it away: the check's backward runs none of it."""
    w = torch.ones(3, requires_grad=True)
    X = w * 3
    with pytest.raises(CheckFailed, match=NODE):
        Answer(leave, "x", [])(X)
    X.sum().backward()
    assert torch.equal(w.grad, torch.full((3,), 3.0))


def test_node_hook_removed_inside_passes_and_kept_where_declared():
    w = torch.ones(3, requires_grad=True)
    X = w * 3

    def removed(X):
        handle = X.grad_fn.register_prehook(lambda g: g)
        handle.remove()
    Answer(removed, "x", [])(X)
    Answer(_hook, "x", [], keeps_hooks=True)(X)


_ = helpers
test_case = parametrize_cases(__name__)
