"""Answers a check once crashed on, misjudged or let through (tests/check_cases.py's form): a
loss with no graph back to the model fails with words (never an AttributeError of the check's),
torch.func.grad through the check's net and F.unfold per device are right, a gradient the
model came in with must survive accumulation, and the sorted names are judged as returned. An
exception out of the harness's own bookkeeping inside the answer's call is the check's error."""
import torch
import torch.nn.functional as F
from check_cases import other, parametrize_cases, shortcut

import helpers
from helpers import send

NO_GRAPH = "got no gradient from your loss"


# ---- a loss with no graph back to the model -----------------------------------------------------
@shortcut("check_rank_loss", "a new leaf of the right value", NO_GRAPH)
def rank_loss_new_leaf(losses, global_batch, world_size):
    return torch.tensor(losses.sum().item() * world_size / global_batch, requires_grad=True)


@shortcut("check_rank_loss", "detached, then made to require grad", NO_GRAPH)
def rank_loss_detached_requires_grad(losses, global_batch, world_size):
    return (losses.sum().detach() * world_size / global_batch).requires_grad_()


@shortcut("check_scratch_accumulate", "each loss detached, then made to require grad", NO_GRAPH)
def scratch_accumulate_detached(model, loss_fn, micro_batches):
    k = len(micro_batches)
    with model.no_sync():
        for X, y in micro_batches[:-1]:
            (loss_fn(model(X), y).detach() / k).requires_grad_().backward()
    X, y = micro_batches[-1]
    (loss_fn(model(X), y).detach() / k).requires_grad_().backward()
    model.finish_gradient_synchronization()


# ---- torch.func.grad through the check's net ----------------------------------------------------
@other("check_accumulated_step", "torch.func.grad per micro-batch, summed, SGD in place")
def accumulated_step_func_grad(net, params, X, y, num_micro, lr):
    def summed(ps, X_m, y_m):
        return helpers.loss(net(X_m, ps), y_m).sum()
    total = None
    for X_m, y_m in zip(X.tensor_split(num_micro), y.tensor_split(num_micro), strict=True):
        grads = torch.func.grad(summed)([p.detach() for p in params], X_m, y_m)
        total = grads if total is None else [a + b for a, b in zip(total, grads, strict=True)]
    with torch.no_grad():
        for p, g in zip(params, total, strict=True):
            p.sub_(lr * g / X.shape[0])


def _accumulated_step(net, params, X, y, num_micro, lr):
    for X_m, y_m in zip(X.tensor_split(num_micro), y.tensor_split(num_micro), strict=True):
        helpers.loss(net(X_m, params), y_m).sum().backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad / X.shape[0]
            p.grad = None


def _broken(*args):
    raise AttributeError("the harness's own slip")


def test_a_tap_that_fails_inside_the_answer_is_the_checks_error(monkeypatch):
    """The gradient taps run inside the answer's backward: their failure is not the answer's."""
    from helpers.checks._core import observe
    monkeypatch.setattr(observe.Recorder, "latest", _broken)
    result = helpers.checks.check_accumulated_step(_accumulated_step)
    assert result.status == "error" and "your code raised" not in result.message, result
    assert "tap on a gradient" in result.message and "harness's own slip" in result.message


def test_a_record_that_fails_inside_the_answer_is_the_checks_error(monkeypatch):
    """The Recorder notes each operation the answer runs: its own failure is not the answer's
    (here on the net's product, which only the answer's calls run)."""
    from helpers.checks._core import observe
    record = observe.Recorder._record

    def fails_on_products(self, func, *args):
        if func.__name__.startswith("mm"):
            _broken()
        return record(self, func, *args)
    monkeypatch.setattr(observe.Recorder, "_record", fails_on_products)
    result = helpers.checks.check_accumulated_step(_accumulated_step)
    assert result.status == "error" and "your code raised" not in result.message, result
    assert "the check's record of aten::" in result.message


# ---- F.unfold of each device's own channels -----------------------------------------------------
@other("check_conv_split_in_channels", "each device unfolds its own channels, then a matmul")
def conv_split_unfold(X, W, b, devices, log=None):
    k, (c_out, _, kh, kw) = len(devices), W.shape
    side = X.shape[-1] - kh + 1
    Y = b.to(devices[0]).view(1, -1, 1, 1)
    for i, (X_i, W_i) in enumerate(zip(X.tensor_split(k, 1), W.tensor_split(k, 1), strict=True)):
        cols = F.unfold(send(X_i, 0, i, devices, log), (kh, kw))      # im2col: a gather
        P = (W_i.to(devices[i]).reshape(c_out, -1) @ cols).reshape(X.shape[0], c_out, side, side)
        Y = Y + send(P, i, 0, devices, log)
    return Y


def test_unfold_per_device_passes_where_im2col_would_exceed_the_share(monkeypatch):
    """Every draw its lowest: 2 output channels, device 0 the larger share of 13 input
    channels on 4 devices, where counting im2col's copy as work put it over its bound."""
    import helpers.checks.within_layer as module
    monkeypatch.setattr(module, "randint", lambda g, lo, hi: lo)
    result = helpers.checks.check_conv_split_in_channels(conv_split_unfold)
    assert result.status == "passed", result


# ---- a gradient the model came in with ----------------------------------------------------------
@shortcut("check_accumulate_gradients", "zero_grad first (the text: do not zero them)",
          "it is gone")
def accumulate_gradients_zeroed_first(model, loss_fn, micro_batches):
    model.zero_grad()
    total = sum(len(y) for _, y in micro_batches)
    for i, (X, y) in enumerate(micro_batches):
        if i < len(micro_batches) - 1:
            with model.no_sync():
                (loss_fn(model(X), y) * len(y) / total).backward()
        else:
            (loss_fn(model(X), y) * len(y) / total).backward()


# ---- the sorted names, as returned --------------------------------------------------------------
def _unused(model, loss):
    seen, stack = set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        seen.add(getattr(node, "variable", None))
        stack += [f for f, _ in node.next_functions]
    return [n for n, p in model.named_parameters() if not any(p is v for v in seen)]


@shortcut("check_unused_parameters", "sorted the other way", "not in sorted order")
def unused_parameters_reversed(model, loss):
    return sorted(_unused(model, loss), reverse=True)


@shortcut("check_unused_parameters", "a set of the names", "expected a list")
def unused_parameters_set(model, loss):
    return set(_unused(model, loss))


@other("check_unused_parameters", "a tuple, sorted")
def unused_parameters_tuple(model, loss):
    return tuple(sorted(_unused(model, loss)))


test_case = parametrize_cases(__name__)
