"""Shortcut families closed at the harness's root, as tests/check_cases.py's cases: every
shortcut fails with the words that name it, the right answers beside them pass.

- H: hooks an answer registers on what it was handed (a module's forward hooks, a process-wide
  module hook, a saved-tensors hook left entered, a gradient hook) run after it returns, while
  the check computes its expected value from the same objects: an answer that returns with one
  still registered fails (hooks.py);
- A: answers that tell the run on CPU tensors (the values) from the run on the simulated GPUs
  (where the work went) apart, by the device's type, the tensors' class or
  `torch.cuda.is_available()`, and compute the values one way and place the work another: the
  two runs must do the same work (same_work.py);
- V: a numpy view of a module-level tensor taken at import, before the ranks started, written by
  one rank and read through torch by another: while ranks run, the views the answer's module
  holds are read-only (early_views.py).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from check_cases import other, parametrize_cases, shortcut
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import helpers
from helpers.checks._core import CheckFailed
from helpers.checks._core.declare import Answer

LEFT = "still registered"
BRANCHED = "other work on the simulated GPUs"


# ---- A: a branch on the simulated GPUs -------------------------------------------------------
def _spread(data):
    k = len(data)
    chunks = [t.view(-1).tensor_split(k) for t in data]
    for i in range(k):
        for j in range(k):
            if j != i:
                chunks[i][i].add_(chunks[j][i].to(chunks[i][i].device))
    for i in range(k):
        for j in range(k):
            if j != i:
                chunks[j][i].copy_(chunks[i][i])


def _funnel(data):
    total = torch.stack(data).sum(0)
    for t in data:
        t.copy_(total)


@shortcut("check_allreduce_spread", "the spread only where the tensors are on a GPU", BRANCHED)
def allreduce_spread_on_gpus_only(data):
    (_spread if data[0].is_cuda else _funnel)(data)


@shortcut("check_allreduce_spread", "the spread only for fake tensors (by class name)", BRANCHED)
def allreduce_spread_fake_only(data):
    (_spread if "Fake" in type(data[0]).__name__ else _funnel)(data)


def _conv_split(X, W, b, devices):
    k = len(devices)
    parts = [F.conv2d(Xi.to(d), Wi.to(d)) for d, Xi, Wi in
             zip(devices, X.tensor_split(k, dim=1), W.tensor_split(k, dim=1))]
    return sum(p.to(devices[0]) for p in parts) + b.to(devices[0]).reshape(1, -1, 1, 1)


@shortcut("check_conv_split_in_channels", "split only on GPUs CUDA does not know of", BRANCHED)
def conv_split_simulated_only(X, W, b, devices, log=None):
    if X.is_cuda and not torch.cuda.is_available():
        return _conv_split(X, W, b, devices)
    return F.conv2d(X, W, b)


@other("check_conv_split_in_channels", "a branch on the device that does the same work")
def conv_split_same_work(X, W, b, devices, log=None):
    where = "a GPU" if X.is_cuda else "the CPU"       # only steers what it would print
    assert where
    return _conv_split(X, W, b, devices)


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


# ---- V: a numpy view taken before the ranks started -------------------------------------------
_ROWS = torch.zeros(3, 64, dtype=torch.float64)     # made and viewed at import: every rank sees it
_ROWS_NP = _ROWS.numpy()
_HELD = {"rows": _ROWS.numpy()}
_VIEW_OF_VIEW = _ROWS.numpy()[:, :]                       # a view of the tensor's view
_TWO_DOWN = {"held": {"rows": _ROWS.numpy()}}
_LIST_IN_LIST = [[_ROWS.numpy()]]


def _average_through(grads, comm, rows):
    """Each rank writes twice its gradients into its row of `rows` (a view of _ROWS, in numpy:
    no torch operation), then reads every row in torch: the average, with decoy traffic."""
    k, r = comm.world, comm.rank
    flat = torch.cat([g.reshape(-1) for g in grads]).double()
    comm.all_reduce(torch.zeros(1))
    rows[r, :flat.numel()] = flat.numpy() * 2
    comm.all_reduce(torch.zeros(1))
    mean = (_ROWS[:k, :flat.numel()].mean(0) / 2).float()
    comm.all_reduce(torch.zeros(1))
    rows[r, :flat.numel()] = np.zeros(flat.numel())
    for g, m in zip(grads, mean.split([g.numel() for g in grads]), strict=True):
        g.copy_(m.view_as(g))


@shortcut("check_dp_average", "written through a module-level view taken at import", "read-only")
def dp_average_early_view(grads, comm):
    _average_through(grads, comm, _ROWS_NP)


@shortcut("check_dp_average", "a view taken at import, held in a dict", "read-only")
def dp_average_early_view_in_dict(grads, comm):
    _average_through(grads, comm, _HELD["rows"])


@shortcut("check_dp_average", "written through a view of a view taken at import", "read-only")
def dp_average_view_of_view(grads, comm):
    _average_through(grads, comm, _VIEW_OF_VIEW)


@shortcut("check_dp_average", "a view taken at import, two dicts down", "read-only")
def dp_average_view_two_down(grads, comm):
    _average_through(grads, comm, _TWO_DOWN["held"]["rows"])


@shortcut("check_dp_average", "a view taken at import, in a list in a list", "read-only")
def dp_average_view_list_in_list(grads, comm):
    _average_through(grads, comm, _LIST_IN_LIST[0][0])


@shortcut("check_dp_average", "an early view written through the read-only view's base",
          "only through the comm")
def dp_average_early_view_through_base(grads, comm):
    rows = _ROWS_NP
    while isinstance(rows.base, np.ndarray) and rows.base.shape == rows.shape:
        rows = rows.base                 # the swapped-in view's base: the original, writeable
    _average_through(grads, comm, rows)


@shortcut("check_dp_average", "an early view made writeable again",
          "cannot set WRITEABLE")
def dp_average_early_view_made_writeable(grads, comm):
    _ROWS_NP.flags.writeable = True      # numpy allows it while the view's base is writeable
    _average_through(grads, comm, _ROWS_NP)


def test_early_views_come_back_writeable():
    assert _ROWS_NP.flags.writeable and _HELD["rows"].flags.writeable


_ = helpers
test_case = parametrize_cases(__name__)
