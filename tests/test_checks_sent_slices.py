"""The within-layer splits' receive bound (helpers/checks/_core/moved.py), in
tests/check_cases.py's form: a whole weight sent to every device after arithmetic on it (`W * 1`,
a flip, a negation, the softmax scale folded in, a product with a constant) is still that
weight's data and fails; one packed transfer per device of exactly its slices passes."""
import math

import torch
from check_cases import other, parametrize_cases, shortcut
from torch.nn import functional as F

from helpers import copy_to_shards, reduce_from_shards
from helpers.checks._core.moved import received
from helpers.checks._core.observe import Recorder


def _cuts(n, k):
    return [n * i // k for i in range(k + 1)]


def _gated(X, W1, V, W2, devices, log, send):
    """The gated MLP with `send(W, device, dim, cols)` handing each device its slice."""
    k, Xs = len(devices), copy_to_shards(X, devices, log)
    cuts, partials = _cuts(W1.shape[1], len(devices)), []
    for Xi, d, lo, hi in zip(Xs, devices, cuts, cuts[1:][:k]):
        s = slice(lo, hi)
        W1i, Vi, W2i = send(W1, d, 1, s), send(V, d, 1, s), send(W2, d, 0, s)
        partials.append((F.silu(Xi @ W1i) * (Xi @ Vi)) @ W2i)
    return reduce_from_shards(partials, devices, log)


def _sliced(W, dim, s):
    return W[:, s] if dim else W[s]


WORDS = ["received", "elements of W1", "slice first"]


@shortcut("check_gated_mlp_column_then_row", "the whole weights times 1 sent, sliced there", WORDS)
def gated_whole_times_one(X, W1, V, W2, devices, log=None):
    return _gated(X, W1, V, W2, devices, log, lambda W, d, dim, s: _sliced((W * 1).to(d), dim, s))


@shortcut("check_gated_mlp_column_then_row", "the whole weights flipped, sent, flipped back",
          WORDS)
def gated_whole_flipped(X, W1, V, W2, devices, log=None):
    return _gated(X, W1, V, W2, devices, log,
                  lambda W, d, dim, s: _sliced(W.flip(0).to(d).flip(0), dim, s))


@shortcut("check_gated_mlp_column_then_row", "the whole weights negated, sent, negated back",
          WORDS)
def gated_whole_negated(X, W1, V, W2, devices, log=None):
    return _gated(X, W1, V, W2, devices, log, lambda W, d, dim, s: _sliced(-((-W).to(d)), dim, s))


@other("check_gated_mlp_column_then_row", "W1's, V's and W2's slices packed, one move each")
def gated_packed(X, W1, V, W2, devices, log=None):
    k, Xs = len(devices), copy_to_shards(X, devices, log)
    partials = []
    for Xi, d, a, v, w in zip(Xs, devices, W1.tensor_split(k, 1), V.tensor_split(k, 1),
                              W2.tensor_split(k, 0)):
        buf = torch.cat([a.reshape(-1), v.reshape(-1), w.reshape(-1)]).to(d)
        a_, v_, w_ = buf.split([a.numel(), v.numel(), w.numel()])
        a_, v_, w_ = a_.view(a.shape), v_.view(v.shape), w_.view(w.shape)
        partials.append((F.silu(Xi @ a_) * (Xi @ v_)) @ w_)
    return reduce_from_shards(partials, devices, log)


# ---- conv_split_in_channels ----------------------------------------------------------------
def _conv(X, W, b, devices, move):
    """Partial sums of the input channels' slices, `move(X, W, device, lo, hi)` handing each
    device its slices."""
    cuts, parts = _cuts(X.shape[1], len(devices)), []
    for d, lo, hi in zip(devices, cuts, cuts[1:]):
        parts.append(F.conv2d(*move(X, W, d, lo, hi)).to(devices[0]))
    return sum(parts[1:], parts[0]) + b.to(devices[0]).reshape(1, -1, 1, 1)


@shortcut("check_conv_split_in_channels", "the whole W flipped, sent, flipped back",
          ["received", "elements of W;", "slice first"])
def conv_whole_w_flipped(X, W, b, devices, log=None):
    return _conv(X, W, b, devices, lambda X, W, d, lo, hi: (
        X[:, lo:hi].to(d), W.flip(1).to(d).flip(1)[:, lo:hi]))


@shortcut("check_conv_split_in_channels", "the whole W times 1 sent, sliced there",
          ["received", "elements of W;"])
def conv_whole_w_times_one(X, W, b, devices, log=None):
    return _conv(X, W, b, devices, lambda X, W, d, lo, hi: (
        X[:, lo:hi].to(d), (W * 1).to(d)[:, lo:hi]))


def _packed(X, W, d, lo, hi):
    xs, ws = X[:, lo:hi], W[:, lo:hi]
    buf = torch.cat([xs.reshape(-1), ws.reshape(-1)]).to(d)
    return buf[:xs.numel()].view(xs.shape), buf[xs.numel():].view(ws.shape)


@other("check_conv_split_in_channels", "X's and W's slices packed, one move per device")
def conv_packed(X, W, b, devices, log=None):
    return _conv(X, W, b, devices, _packed)


@other("check_conv_split_in_channels", "every device's X and W slices in one buffer, in ranges")
def conv_one_buffer_in_ranges(X, W, b, devices, log=None):
    cuts = _cuts(X.shape[1], len(devices))
    xs = [X[:, lo:hi] for lo, hi in zip(cuts, cuts[1:])]
    ws = [W[:, lo:hi] for lo, hi in zip(cuts, cuts[1:])]
    buf = torch.empty(X.numel() + W.numel(), dtype=X.dtype, device=X.device)
    starts = [0]
    for x, w in zip(xs, ws):
        at = starts[-1]
        buf[at:at + x.numel()].copy_(x.reshape(-1))
        buf[at + x.numel():at + x.numel() + w.numel()].copy_(w.reshape(-1))
        starts.append(at + x.numel() + w.numel())
    parts = []
    for i, d in enumerate(devices):
        got = buf[starts[i]:starts[i + 1]].to(d)
        x, w = got.split([xs[i].numel(), ws[i].numel()])
        parts.append(F.conv2d(x.view(xs[i].shape), w.view(ws[i].shape)).to(devices[0]))
    return sum(parts[1:], parts[0]) + b.to(devices[0]).reshape(1, -1, 1, 1)


# ---- attention_by_heads --------------------------------------------------------------------
def _attention(X, Wq, Wk, Wv, Wo, heads, devices, log, folded_whole):
    """Attention split by heads with the softmax scale folded into Wq on the host: into the
    whole Wq then sent whole (`folded_whole`), or into each device's slice."""
    k, t, e = len(devices), X.shape[0], Wq.shape[1] // heads
    Xs = copy_to_shards(X, devices, log)
    scaled, partials, first = Wq / math.sqrt(e), [], 0
    for Xi, h, d in zip(Xs, map(len, torch.arange(heads).tensor_split(k)), devices):
        s = slice(first * e, (first + h) * e)
        first += h
        wq = scaled.to(d)[:, s] if folded_whole else (Wq[:, s] / math.sqrt(e)).to(d)
        Q, K, V = ((Xi @ W).reshape(t, h, e).transpose(0, 1)
                   for W in (wq, Wk[:, s].to(d), Wv[:, s].to(d)))
        A = torch.softmax(Q @ K.transpose(1, 2), dim=-1) @ V
        partials.append(A.transpose(0, 1).reshape(t, h * e) @ Wo[s].to(d))
    return reduce_from_shards(partials, devices, log)


@shortcut("check_attention_by_heads", "the scale folded into the whole Wq, sent whole",
          ["received", "elements of Wq", "slice first"])
def attention_scale_folded_whole(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    return _attention(X, Wq, Wk, Wv, Wo, heads, devices, log, folded_whole=True)


@other("check_attention_by_heads", "the scale folded into each device's slice of Wq")
def attention_scale_folded_slices(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    return _attention(X, Wq, Wk, Wv, Wo, heads, devices, log, folded_whole=False)


test_case = parametrize_cases(__name__)


# ---- received itself: what a product passes on ----------------------------------------------
def _received(fn, **tensors):
    with Recorder() as rec:
        fn(**tensors)
    return {name: dict(per) for name, per in received(rec, tensors).items() if per}


def test_a_product_with_a_constant_passes_its_operand_on():
    """`W @ ones` re-encodes W: moved, it is W's elements (a matmul is no laundering)."""
    W = torch.randn(6, 4)
    got = _received(lambda W: (W.reshape(-1, 1) @ torch.ones(1, 1)).to("meta"), W=W)
    assert got["W"] == {torch.device("meta"): 24}


def test_a_product_of_two_inputs_passes_neither_on():
    """A product of the layer's data (a partial sum) is moved by every right answer."""
    X, W = torch.randn(3, 6), torch.randn(6, 4)
    assert _received(lambda X, W: (X @ W).to("meta"), X=X, W=W) == {}


def test_a_packed_move_charges_each_name_its_own_elements():
    """cat of a 12-element slice of X and a 2-element slice of W, moved once."""
    X, W = torch.randn(3, 8), torch.randn(2, 4)
    got = _received(lambda X, W: torch.cat([X[:, :4].reshape(-1), W[:, :1].reshape(-1)])
                    .to("meta"), X=X, W=W)
    assert got == {"X": {torch.device("meta"): 12}, "W": {torch.device("meta"): 2}}


def test_a_range_of_a_packed_buffer_charges_what_was_written_there():
    """X and W copied into ranges of one buffer: a range moved carries only its own names."""
    def pack_and_send(X, W):
        buf = torch.empty(X.numel() + W.numel())
        buf[:24].copy_(X.reshape(-1))
        buf[24:].copy_(W.reshape(-1))
        buf[:12].to("meta")
        buf[24:28].to("meta")
    got = _received(pack_and_send, X=torch.randn(3, 8), W=torch.randn(2, 4))
    assert got == {"X": {torch.device("meta"): 12}, "W": {torch.device("meta"): 4}}


def test_an_overwritten_column_leaves_the_rest_charged():
    """Overwriting a strided view (a column) replaces only its elements, not the rows' span."""
    def zero_a_column_and_send(W):
        c = W.clone()
        c[:, 0].copy_(torch.zeros(4))
        c.to("meta")
    assert _received(zero_a_column_and_send, W=torch.randn(4, 6))["W"] == {
        torch.device("meta"): 24}
