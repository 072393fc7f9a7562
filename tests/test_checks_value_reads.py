"""Values an answer reads out of its own tensors by a route that runs no aten operation on CPU
tensors (`.tolist()`, `.numpy()`, `np.asarray`) are recorded on the CPU run and replayed on the
simulated GPUs, in order with the dispatched reads (`int(t)`, `.item()`): a right answer that
deals its chunks with `torch.arange(n).tensor_split(k)` and reads the bounds so does the same
work on both runs and passes. Branching on the device still fails, and a run whose reads could
not be replayed is the grader's limit, never the reader's failure (tests/check_cases.py's
form)."""
import math

import numpy as np
import torch
from check_cases import other, parametrize_cases, quiet, shortcut
from torch.nn import functional as F

import helpers.checks
from helpers import copy_to_shards, reduce_from_shards, send

BRANCHED = "other work on the simulated GPUs"


def _bounds(n, k, read):
    """(start, stop) of each of tensor_split's k chunks of range(n), read by `read(chunk)`."""
    return [(c[0], c[-1] + 1) for c in map(read, torch.arange(n).tensor_split(k))]


def _tolist(c):
    return c.tolist()


def _numpy(c):
    return c.numpy()


def _asarray(c):
    return np.asarray(c)


def _items_by_tolist(c):
    return [x.tolist() for x in c]       # iteration: 0-d tensors, each read by .tolist()


def _items_by_int(c):
    return [int(x) for x in c]           # iteration: 0-d tensors, each read by int()


# ---- attention_by_heads ---------------------------------------------------------------------
def _attention(X, Wq, Wk, Wv, Wo, heads, devices, log, read):
    k, t, e = len(devices), X.shape[0], Wq.shape[1] // heads
    Xs = copy_to_shards(X, devices, log)
    partials = []
    for Xi, d, (a, b) in zip(Xs, devices, _bounds(heads, k, read), strict=True):
        cols = slice(a * e, b * e)
        Q, K, V = ((Xi @ W[:, cols].to(d)).reshape(t, b - a, e).transpose(0, 1)
                   for W in (Wq, Wk, Wv))
        A = torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(e), dim=-1) @ V
        partials.append(A.transpose(0, 1).reshape(t, (b - a) * e) @ Wo[cols].to(d))
    return reduce_from_shards(partials, devices, log)


@other("check_attention_by_heads", "each device's heads read with .tolist()")
def attention_by_heads_tolist(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    return _attention(X, Wq, Wk, Wv, Wo, heads, devices, log, _tolist)


@other("check_attention_by_heads", "each device's heads read with .numpy()")
def attention_by_heads_numpy(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    return _attention(X, Wq, Wk, Wv, Wo, heads, devices, log, _numpy)


@other("check_attention_by_heads", "each device's heads iterated, each read with int()")
def attention_by_heads_iterated(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    return _attention(X, Wq, Wk, Wv, Wo, heads, devices, log, _items_by_int)


# ---- gated_mlp_column_then_row --------------------------------------------------------------
def _gated(X, W1, V, W2, devices, log, read):
    Xs = copy_to_shards(X, devices, log)
    parts = []
    for Xi, d, (a, b) in zip(Xs, devices, _bounds(W1.shape[1], len(devices), read), strict=True):
        parts.append((F.silu(Xi @ W1[:, a:b].to(d)) * (Xi @ V[:, a:b].to(d))) @ W2[a:b].to(d))
    return reduce_from_shards(parts, devices, log)


@other("check_gated_mlp_column_then_row", "each device's columns read with .tolist()")
def gated_mlp_tolist(X, W1, V, W2, devices, log=None):
    return _gated(X, W1, V, W2, devices, log, _tolist)


@other("check_gated_mlp_column_then_row", "each device's columns read with np.asarray")
def gated_mlp_asarray(X, W1, V, W2, devices, log=None):
    return _gated(X, W1, V, W2, devices, log, _asarray)


@other("check_gated_mlp_column_then_row", "each device's columns iterated, each .tolist()")
def gated_mlp_iterated(X, W1, V, W2, devices, log=None):
    return _gated(X, W1, V, W2, devices, log, _items_by_tolist)


# ---- sharded_server_step --------------------------------------------------------------------
def _server_step(params, grads, devices, lr, read, short=0):
    """The worked sharded server step, its chunk bounds read by `read` (each chunk's last
    `short` elements left out)."""
    bounds = [(a, b - short) for a, b in _bounds(params[0].numel(), len(devices), read)]
    for j, (a, b) in enumerate(bounds):
        params[j][a:b].sub_(lr * sum(g[a:b].to(devices[j]) for g in grads))
    for i, p in enumerate(params):
        for j, (a, b) in enumerate(bounds):
            if i != j:
                p[a:b].copy_(params[j][a:b])


@other("check_sharded_server_step", "each server's chunk bounds read with .tolist()")
def sharded_server_step_tolist(params, grads, devices, lr):
    _server_step(params, grads, devices, lr, _tolist)


@other("check_sharded_server_step", "each server's chunk iterated, each .tolist()")
def sharded_server_step_iterated(params, grads, devices, lr):
    _server_step(params, grads, devices, lr, _items_by_tolist)


@shortcut("check_sharded_server_step", "bounds read with .tolist(), each chunk's last left out",
          "differs from the step")
def sharded_server_step_tolist_short(params, grads, devices, lr):
    _server_step(params, grads, devices, lr, _tolist, short=1)


# ---- allreduce_spread -----------------------------------------------------------------------
def _spread_by_bounds(data, read, bounds=None):
    flat = [t.view(-1) for t in data]
    bounds = bounds or _bounds(flat[0].numel(), len(data), read)
    for i, (a, b) in enumerate(bounds):
        for j, x in enumerate(flat):
            if j != i:
                flat[i][a:b].add_(x[a:b].to(flat[i].device))
    for i, (a, b) in enumerate(bounds):
        for j, x in enumerate(flat):
            if j != i:
                x[a:b].copy_(flat[i][a:b])


@other("check_allreduce_spread", "each device's chunk bounds read with .tolist()")
def allreduce_spread_tolist(data):
    _spread_by_bounds(data, _tolist)


@other("check_allreduce_spread", "each device's chunk bounds read with .numpy()")
def allreduce_spread_numpy(data):
    _spread_by_bounds(data, _numpy)


@shortcut("check_allreduce_spread", "bounds read with .tolist(), the spread only on a GPU",
          BRANCHED)
def allreduce_spread_tolist_on_gpus_only(data):
    bounds = _bounds(data[0].numel(), len(data), _tolist)     # read on both runs alike
    if data[0].device.type == "cuda":
        _spread_by_bounds(data, None, bounds)
        return
    total = torch.stack(data).sum(0)
    for t in data:
        t.copy_(total)


# ---- conv_split_in_channels -----------------------------------------------------------------
def _conv(X, W, b, devices, log, read, bounds=None):
    out = None
    for i, (lo, hi) in enumerate(bounds or _bounds(X.shape[1], len(devices), read)):
        P = F.conv2d(send(X[:, lo:hi], 0, i, devices, log, "input"), W[:, lo:hi].to(devices[i]))
        P = send(P, i, 0, devices, log, "partial sum")
        out = P if out is None else out + P
    return out + b.to(devices[0]).reshape(1, -1, 1, 1)


@other("check_conv_split_in_channels", "each device's channels read with .tolist()")
def conv_split_tolist(X, W, b, devices, log=None):
    return _conv(X, W, b, devices, log, _tolist)


@other("check_conv_split_in_channels", "each device's channels read with .numpy()")
def conv_split_numpy(X, W, b, devices, log=None):
    return _conv(X, W, b, devices, log, _numpy)


@shortcut("check_conv_split_in_channels", "channels read with .tolist(), split only on a GPU",
          BRANCHED)
def conv_split_tolist_on_gpus_only(X, W, b, devices, log=None):
    bounds = _bounds(X.shape[1], len(devices), _tolist)       # read on both runs alike
    if X.device.type == "cuda":
        return _conv(X, W, b, devices, log, None, bounds)
    return F.conv2d(X, W, b)


test_case = parametrize_cases(__name__)


def conv_split_reads_on_gpus_only(X, W, b, devices, log=None):
    """The split, and the values it reads, only on the simulated GPUs: the CPU run read nothing
    to replay there, so they read placeholders (every chunk 0:1) before their work differed."""
    if X.device.type == "cuda":
        return _conv(X, W, b, devices, log, _tolist)
    return F.conv2d(X, W, b)


def test_other_work_after_unreplayed_reads_is_the_graders_limit():
    """A run on the simulated GPUs that read values it could not replay (placeholders) did work
    the answer's values did not decide: a difference from the CPU run's work is then the
    grader's limit (an error, never a pass), not the reader's failure (fake.py's promise)."""
    result = quiet(helpers.checks.check_conv_split_in_channels, conv_split_reads_on_gpus_only)
    assert result.status == "error", result
    assert "grader's limit" in result.message and "placeholder" in result.message, result


def test_numpy_of_a_simulated_gpu_tensor_raises_as_on_a_gpu():
    """On the simulated GPUs a GPU tensor's .numpy() raises TypeError as torch does on a real
    GPU (the CPU run's values are replayed only for tensors on the CPU)."""
    from helpers.checks._core.fake import FakeGPUs
    gpus = FakeGPUs(2)
    x = gpus.tensor(torch.arange(4.0), 1)
    with gpus.active():
        try:
            x.numpy()
        except TypeError as e:
            assert "cuda:1" in str(e) and ".cpu()" in str(e), e
        else:
            raise AssertionError("a simulated GPU tensor's .numpy() returned")
