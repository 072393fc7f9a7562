"""What the receive bounds follow through products and concatenations (helpers/checks/_core/flow.py,
values.py), in tests/check_cases.py's form:
- a whole weight re-encoded by a product with an operand made from the inputs that carries no
  more than a constant (`W @ (x / x)`, `x.sum() / x.sum()`, `x * zeros + 1`, recomputed or
  copied ratios, `x ** 0`, an outer product) is still that weight's data, sent whole: it fails;
- a concatenation holds each operand's elements at its own place, so one flat buffer of every
  gradient reduced bucket by bucket in ranges (Megatron's), a fused QKV weight whose head columns
  go to the devices, and a fused gate-and-up weight of the gated MLP pass."""
import math

import pytest
import torch
from check_cases import other, parametrize_cases, shortcut
from torch.nn import functional as F

import helpers
from helpers import copy_to_shards, reduce_from_shards, unflatten_into
from helpers.checks._core.moved import received
from helpers.checks._core.observe import Recorder


def _cuts(n, k):
    return [n * i // k for i in range(k + 1)]


def _first(T, n=1):
    return T.detach().reshape(-1)[:n]       # detached: the constants' gradients are not zero


def _eye(T, c):
    return torch.eye(c, dtype=T.dtype, device=T.device)


# a c x c operand made from T that equals eye(c): each a product's second operand
ONES = {
    "x / x": lambda T, c: _eye(T, c) * (_first(T, c * c) / _first(T, c * c)).reshape(c, c),
    "x - x + 1": lambda T, c: _eye(T, c) * (_first(T, c) - _first(T, c) + 1),
    "x * zeros + 1": lambda T, c: _eye(T, c) * (
        _first(T, c) * torch.zeros(c, dtype=T.dtype, device=T.device) + 1),
    "x.sum() / x.sum()": lambda T, c: _eye(T, c) * (T.detach().sum() / T.detach().sum()),
    "x.sum(0) / x.sum(0), computed twice": lambda T, c: torch.diag(
        T.detach().reshape(-1, c).sum(0) / T.detach().reshape(-1, c).sum(0)),
    "x / x.clone()": lambda T, c: _eye(T, c) * (_first(T, c) / _first(T, c).clone()),
    "x ** 0": lambda T, c: _eye(T, c) * _first(T, c) ** 0,
}


def _launder(T, one, c, src=None):
    """T's elements through a product with `one(src, c)` (eye(c), made from src or T): T
    itself, made by a product."""
    return (T.reshape(-1, c) @ one(T if src is None else src, c)).reshape(T.shape)


# ---- conv_split_in_channels: the whole W re-encoded, sent, sliced there ---------------------
def _conv_whole_w(one, c):
    def conv(X, W, b, devices, log=None):
        cuts, parts, L = _cuts(X.shape[1], len(devices)), [], _launder(W, one, c)
        for d, lo, hi in zip(devices, cuts, cuts[1:]):
            parts.append(F.conv2d(X[:, lo:hi].to(d), L.to(d)[:, lo:hi]).to(devices[0]))
        return sum(parts[1:], parts[0]) + b.to(devices[0]).reshape(1, -1, 1, 1)
    return conv


for _name, _one in ONES.items():
    _fn = _conv_whole_w(_one, 3)
    _fn.__name__ = "conv_whole_w_times_" + "".join(ch if ch.isalnum() else "_" for ch in _name)
    shortcut("check_conv_split_in_channels", f"the whole W times eye(3) made as {_name}, sent",
             ["received", "elements of W;"])(_fn)


@shortcut("check_conv_split_in_channels", "the whole W times (x / x) as a 1x1 matrix, sent",
          ["received", "elements of W;"])
def conv_whole_w_outer_x_over_x(X, W, b, devices, log=None):
    return _conv_whole_w(lambda T, c: (_first(T) / _first(T)).reshape(1, 1), 1)(
        X, W, b, devices, log)


@shortcut("check_conv_split_in_channels", "the whole W times (x * 0 + 1) as a 1x1 matrix, sent",
          ["received", "elements of W;"])
def conv_whole_w_outer_times_zero_plus_one(X, W, b, devices, log=None):
    return _conv_whole_w(lambda T, c: (_first(T) * 0 + 1).reshape(1, 1), 1)(
        X, W, b, devices, log)


# ---- gated_mlp_column_then_row: the whole W1 re-encoded by an outer product ------------------
def _gated_whole_w1(one):
    def gated(X, W1, V, W2, devices, log=None):
        k, Xs = len(devices), copy_to_shards(X, devices, log)
        cuts, partials = _cuts(W1.shape[1], k), []
        L = (W1.reshape(-1, 1) @ one(W1)).reshape(W1.shape)
        for Xi, d, lo, hi in zip(Xs, devices, cuts, cuts[1:]):
            s = slice(lo, hi)
            partials.append((F.silu(Xi @ L.to(d)[:, s]) * (Xi @ V[:, s].to(d))) @ W2[s].to(d))
        return reduce_from_shards(partials, devices, log)
    return gated


GATED_WORDS = ["received", "elements of W1"]


@shortcut("check_gated_mlp_column_then_row", "the whole W1 times (x / x), sent", GATED_WORDS)
def gated_whole_w1_x_over_x(X, W1, V, W2, devices, log=None):
    return _gated_whole_w1(lambda T: (_first(T) / _first(T)).reshape(1, 1))(
        X, W1, V, W2, devices, log)


@shortcut("check_gated_mlp_column_then_row", "the whole W1 times (x * zeros + 1), sent",
          GATED_WORDS)
def gated_whole_w1_times_zeros_plus_one(X, W1, V, W2, devices, log=None):
    return _gated_whole_w1(lambda T: (_first(T) * torch.zeros(1, device=T.device) + 1)
                           .reshape(1, 1))(X, W1, V, W2, devices, log)


@shortcut("check_gated_mlp_column_then_row", "the whole W1 times x.sum() / x.sum(), sent",
          GATED_WORDS)
def gated_whole_w1_sum_over_sum(X, W1, V, W2, devices, log=None):
    return _gated_whole_w1(lambda T: (T.detach().sum() / T.detach().sum()).reshape(1, 1))(
        X, W1, V, W2, devices, log)


@other("check_gated_mlp_column_then_row", "one fused gate-and-up weight, its columns sliced")
def gated_fused_gate_up(X, W1, V, W2, devices, log=None):
    k, h, Xs = len(devices), W1.shape[1], copy_to_shards(X, devices, log)
    WV, cuts, partials = torch.cat([W1, V], dim=1), _cuts(W1.shape[1], k), []
    for Xi, d, lo, hi in zip(Xs, devices, cuts, cuts[1:]):
        mine = torch.cat([WV[:, lo:hi], WV[:, h + lo:h + hi]], dim=1).to(d)
        gate, up = (Xi @ mine).split(hi - lo, dim=1)
        partials.append((F.silu(gate) * up) @ W2[lo:hi].to(d))
    return reduce_from_shards(partials, devices, log)


# ---- attention_by_heads: a fused QKV weight -------------------------------------------------
def _heads(Xi, Q, K, V, t, h, e):
    Q, K, V = (W.reshape(t, h, e).transpose(0, 1) for W in (Q, K, V))
    A = torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(e), dim=-1) @ V
    return A.transpose(0, 1).reshape(t, h * e)


@other("check_attention_by_heads", "one fused QKV weight (cat of Wq, Wk, Wv), head columns sent")
def attention_fused_qkv(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    k, t, e = len(devices), X.shape[0], Wq.shape[1] // heads
    width, Wqkv = heads * e, torch.cat([Wq, Wk, Wv], dim=1)
    partials, first = [], 0
    for Xi, h, d in zip(copy_to_shards(X, devices, log),
                        map(len, torch.arange(heads).tensor_split(k)), devices):
        a, b = first * e, (first + h) * e
        first += h
        mine = torch.cat([Wqkv[:, j * width + a:j * width + b] for j in range(3)], dim=1).to(d)
        partials.append(_heads(Xi, *(Xi @ mine).split(h * e, dim=1), t, h, e) @ Wo[a:b].to(d))
    return reduce_from_shards(partials, devices, log)


@other("check_attention_by_heads", "Wq, Wk, Wv stacked per head, each device's heads sent")
def attention_stacked_qkv(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    k, t, e = len(devices), X.shape[0], Wq.shape[1] // heads
    Wqkv = torch.stack([Wq, Wk, Wv], dim=1).view(X.shape[1], 3, heads, e)
    partials, first = [], 0
    for Xi, h, d in zip(copy_to_shards(X, devices, log),
                        map(len, torch.arange(heads).tensor_split(k)), devices):
        mine = Wqkv[:, :, first:first + h].to(d)
        a, b = first * e, (first + h) * e
        first += h
        qkv = [Xi @ mine[:, j].reshape(-1, h * e) for j in range(3)]
        partials.append(_heads(Xi, *qkv, t, h, e) @ Wo[a:b].to(d))
    return reduce_from_shards(partials, devices, log)


# ---- bucket_allreduce: one flat buffer of all gradients, reduced in buckets ------------------
def _bucket_ranges(grads, bucket_bytes, past=False):
    """(first, end) of each bucket in the flat buffer; `past`: closed only past bucket_bytes."""
    out, start, end, size = [], 0, 0, 0
    for i, g in enumerate(grads[0]):
        end, size = end + g.numel(), size + g.numel() * g.element_size()
        if (size > bucket_bytes if past else size >= bucket_bytes) or i == len(grads[0]) - 1:
            out.append((start, end))
            start, size = end, 0
    return out


def _flat_in_ranges(grads, ranges):
    flats = [torch.cat([t.reshape(-1) for t in r]) for r in grads]
    for a, b in ranges:
        for f in flats[1:]:
            flats[0][a:b] += f[a:b].to(flats[0].device)
        for f in flats[1:]:
            f[a:b].copy_(flats[0][a:b])
    for f, r in zip(flats, grads, strict=True):
        unflatten_into(f, r)


@other("check_bucket_allreduce", "one flat buffer of all gradients, reduced bucket by bucket")
def bucket_allreduce_flat_buffer_in_ranges(grads, bucket_bytes):
    _flat_in_ranges(grads, _bucket_ranges(grads, bucket_bytes))


@other("check_bucket_allreduce", "one flat buffer of all gradients, a ring per bucket's range")
def bucket_allreduce_flat_buffer_ring(grads, bucket_bytes):
    flats = [torch.cat([t.reshape(-1) for t in r]) for r in grads]
    for a, b in _bucket_ranges(grads, bucket_bytes):
        helpers.ring_allreduce([f[a:b] for f in flats])
    for f, r in zip(flats, grads, strict=True):
        unflatten_into(f, r)


@shortcut("check_bucket_allreduce", "one flat buffer of all, ranges closed past bucket_bytes",
          "parts of 2 buckets")
def bucket_allreduce_flat_buffer_past(grads, bucket_bytes):
    _flat_in_ranges(grads, _bucket_ranges(grads, bucket_bytes, past=True))


test_case = parametrize_cases(__name__)


# ---- received itself ------------------------------------------------------------------------
def _received(fn, **tensors):
    with Recorder() as rec:
        fn(**tensors)
    return {name: dict(per) for name, per in received(rec, tensors).items() if per}


META = torch.device("meta")


@pytest.mark.parametrize("one", list(ONES), ids=str)
def test_a_product_with_a_constant_made_from_an_input_passes_the_other_on(one):
    """W times a 3 x 3 identity made from x: W's elements, charged whole when moved."""
    got = _received(lambda W, x: _launder(W, ONES[one], 3, x).to("meta"),
                    W=torch.randn(4, 6), x=torch.randn(5, 3))
    assert got["W"] == {META: 24}


def test_a_product_with_one_number_made_from_the_inputs_passes_the_other_on():
    """eye(3) * (x.sum() / x.mean()): one number's worth of x, whatever it holds (no constant
    the operations show), is fewer elements than the 3 terms the product sums."""
    got = _received(lambda W, x: (W.reshape(-1, 3) @ (torch.eye(3) * (x.sum() / x.mean())))
                    .to("meta"), W=torch.randn(4, 6), x=torch.randn(5, 3))
    assert got["W"] == {META: 24}


def test_an_outer_product_passes_both_operands_on():
    """A product of one term per element re-encodes both operands (no partial sums)."""
    got = _received(lambda a, b: (a.reshape(-1, 1) @ b.reshape(1, -1)).to("meta"),
                    a=torch.randn(4), b=torch.randn(3))
    assert got == {"a": {META: 4}, "b": {META: 3}}


def test_a_ratio_of_two_different_powers_is_no_constant():
    """x ** 3 / x ** 2 is x: the operations' numbers tell them apart."""
    assert _received(lambda x: (x.pow(3) / x.pow(2)).to("meta"), x=torch.randn(6)) == {
        "x": {META: 6}}


def test_a_range_of_a_concatenation_charges_its_own_operands():
    """cat along dim 0: a range moved carries the operands it covers, each its elements."""
    got = _received(lambda a, b, c: torch.cat([a.reshape(-1), b.reshape(-1), c])[10:20]
                    .to("meta"), a=torch.randn(2, 4), b=torch.randn(3), c=torch.randn(12))
    assert got == {"b": {META: 1}, "c": {META: 9}}


@pytest.mark.parametrize("how", ["cat", "stack"])
def test_columns_of_a_concatenation_along_dim_1_charge_their_operand(how):
    """cat or stack along dim 1, then one operand's columns (a strided view) moved."""
    def send(a, b, c):
        if how == "cat":
            torch.cat([a, b, c], dim=1)[:, 6:8].to("meta")
        else:
            torch.stack([a, b, c], dim=1)[:, 1, :2].to("meta")
    got = _received(send, a=torch.randn(5, 4), b=torch.randn(5, 4), c=torch.randn(5, 4))
    assert got == {"b": {META: 10}}
