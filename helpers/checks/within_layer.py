"""Checks for the exercises of Part I's within-layer chapter: counting partial-sum bytes, a
convolution split by input channels, a gated MLP split column-then-row (Megatron), attention
split by heads.

The device exercises run twice: on CPU tensors for the values and gradients, and on FakeGPUs
(cuda:0..k-1) where the harness sees which device ran each operation, what crossed between
devices, and what flowed into the output; the answer's own log is not trusted.
"""
import math

import torch
from torch.nn import functional as F

from .. import ByteLog, dense_split_rows
from ._core import (
    CheckFailed,
    FakeGPUs,
    as_int,
    check,
    describe_device,
    expect,
    fresh_generator,
    randint,
    tensor_close,
)
from ._core.inputs import expect_unchanged, kept
from ._core.moved import expect_slices_received

# check_mlp_column_then_row has no exercise now (tests use it)
__all__ = ["check_partial_sum_bytes", "check_conv_split_in_channels",
           "check_gated_mlp_column_then_row", "check_attention_by_heads"]

CPU = torch.device("cpu")


def _close(got, want, rtol=1e-4, atol=1e-5):
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and tensor_close(got.detach().float().cpu(), want.detach().float(),
                               rtol=rtol, atol=atol))


def _tensor(value, call, shape):
    expect(isinstance(value, torch.Tensor),
           f"{call} returned {type(value).__name__}, expected a tensor")
    expect(tuple(value.shape) == tuple(shape),
           f"{call} returned shape {tuple(value.shape)}, expected {tuple(shape)}")
    return value


# ---- counting bytes --------------------------------------------------------------------------
@check("partial_sum_bytes", references=["dense_split_rows"], observes=[
    "the number returned against the bytes of partial sums a run of dense_split_rows sends "
    "(counted by the check); dense_split_rows itself is unavailable to the answer"])
def check_partial_sum_bytes(fn):
    """fn(n, d_out, k): bytes of partial sums that dense_split_rows sends for n examples of
    d_out float32 outputs on k devices (counted from a real run)."""
    g = fresh_generator()
    for _ in range(5):
        n, d_in, d_out, k = (randint(g, 1, 64), randint(g, 8, 32), randint(g, 1, 50),
                             randint(g, 2, 8))
        call = f"partial_sum_bytes({n}, {d_out}, {k})"
        got = as_int(fn(n, d_out, k), call)
        log = ByteLog()
        dense_split_rows(torch.randn(n, d_in), torch.randn(d_in, d_out), torch.randn(d_out),
                         [CPU] * k, log)
        want = log.wire_bytes("partial sum")
        hint = ""
        if got == k * n * d_out * 4:
            hint = " (the device that adds them up sends nothing)"
        elif got * 4 == want:
            hint = " (that counts values; a float32 value is 4 bytes)"
        expect(got == want, f"{call} returned {got}, but the split sent {want} bytes of partial "
                            f"sums{hint}")


# ---- what the fake run shows -----------------------------------------------------------------
def _macs_by_device(ops):
    total = {}
    for op in ops:
        if op.flops is not None and op.device is not None:
            total[op.device] = total.get(op.device, 0) + op.flops // 2
    return total


def _spread(call, rec, Y, devices, whole, what):
    """The output's ancestry: every device computed its part, none did (much) more than a
    device's share of the multiply-adds `whole` of the unsplit layer."""
    ancestry = rec.ancestors(Y)
    macs = _macs_by_device(ancestry)
    k = len(devices)
    for d in devices:
        expect(macs.get(d, 0) > 0, f"{call}: {describe_device(d)} computed nothing that reaches "
                                   f"the output: move its slice of {what} to it and compute "
                                   "there (.to(devices[i]))")
    share = whole / k
    for d, m in sorted(macs.items(), key=lambda x: -x[1]):
        expect(m <= 1.6 * share + 8,
               f"{call}: {describe_device(d)} did {m} of the {whole} multiply-adds of the layer "
               f"(a device's share is about {share:.0f}): each device computes only its slice")
    return ancestry


# ---- a convolution split by input channels ----------------------------------------------------
@check("conv_split_in_channels", simulated=True, observes=[
    "values and gradients on CPU tensors, against F.conv2d (bias once)",
    "on k simulated GPUs (4 in one case): every device ran a convolution on its slice of the "
    "input channels that reaches the output, no device did more than its share of the "
    "multiply-adds, the output is on device 0, every other device's partial sum travelled "
    "straight to device 0 and none left it (they are added up there), no operation mixed "
    "devices, and no device (the host included) received more of X or W than its slice (the "
    "whole sent and sliced there) or b twice"])
def check_conv_split_in_channels(fn):
    """fn(X, W, b, devices, log): conv2d(X, W, b) with the INPUT channels split over the devices:
    device i convolves its channels of X with its slice of every filter (a partial sum of the whole
    output), and the partial sums travel to device 0 to be added up; the bias once."""
    g = fresh_generator()
    four = randint(g, 0, 2)     # forced, in a fresh case: 4 devices, where a tree of sums shows
    for case in range(3):
        k = 4 if case == four else randint(g, 2, 4)
        c_in = randint(g, 3, 5) * k + randint(g, 1, k - 1)   # 7..23, never a shard's width
        c_out, n, hw = randint(g, 2, 4), 2, 6
        X = torch.randn(n, c_in, hw, hw, generator=g).requires_grad_()
        W = torch.randn(c_out, c_in, 3, 3, generator=g).requires_grad_()
        b = torch.randn(c_out, generator=g).requires_grad_()
        call = f"conv_split_in_channels on {k} devices ({c_in} input channels)"
        copies = kept(X, W, b)
        got = _tensor(fn(X, W, b, [CPU] * k, ByteLog()), call, (n, c_out, hw - 2, hw - 2))
        expect_unchanged(call, copies, [X, W, b], ["X", "W", "b"])
        want = F.conv2d(X, W, b)        # after the answer: nothing to read while it runs
        if not _close(got, want):
            diff = (got.detach() - want.detach()).mean(dim=(0, 2, 3))
            expect(not tensor_close(diff, -b.detach(), atol=1e-4), f"{call}: the bias is missing")
            expect(not tensor_close(diff, (k - 1) * b.detach(), atol=1e-4),
                   f"{call}: the bias was added {k} times; add it once, after the sum")
            expect(False, f"{call}: the output differs from conv2d (is a shard's partial sum "
                          "missing?)")
        _grads_match(call, got, want, [X, W, b], ["X", "W", "b"], g)
        gpus = FakeGPUs(k)
        fX, fW, fb = (gpus.tensor(t, 0) for t in (X, W, b))
        Y, rec = gpus.run(fn, fX, fW, fb, gpus.devices, ByteLog(), what=call)
        expect(Y.device == gpus.devices[0], f"{call}: the output is on {describe_device(Y.device)}"
                                            "; the partial sums are added up on device 0")
        for op in rec.ancestors(Y):
            if op.name == "convolution":
                expect(op.reads[0].shape[1] < c_in,
                       f"{call}: a convolution on {describe_device(op.device)} saw all {c_in} "
                       "input channels at once: device i convolves only its slice of the input "
                       "channels, with the matching slice of W")
        ancestry = _spread(call, rec, Y, gpus.devices, want.numel() * c_in * 9,
                           "the input channels and of W")
        _partial_sums(call, ancestry, rec, Y, gpus.devices, want.numel() * c_in * 9)
        expect_slices_received(call, rec, gpus.devices, {"X": (fX, 1), "W": (fW, 1)}, {"b": fb})


def _partial_sums(call, ancestry, rec, Y, devices, whole):
    """By data flow: a full-size partial sum of the output travels from every other device
    straight to device 0, and none leaves device 0, where they are added up (the exercise's
    rule; a split of the output's pixels sends pieces, not partial sums), and no device, the host
    included, did more than its share of the work counted over every operation (elementwise
    products included; im2col, F.unfold's gather of patches, is a copy, as observe.py counts
    it), beside adding the partial sums up."""
    sums = [op for op in ancestry if op.is_transfer
            and op.reads[-1 if op.name == "copy_" else 0].numel == Y.numel()]
    to = {op: (op.writes or op.outputs)[0].device for op in sums}
    for op in sums:
        expect(to[op] == devices[0],
               f"{call}: {describe_device(op.src_device)} sent a partial sum of the whole "
               f"output ({list(Y.shape)}) to {describe_device(to[op])}: send every device's "
               "partial sum to device 0 and add them up there (not along a chain, nor "
               "through another device)")
    for d in devices[1:]:
        moved = [op for op in sums if op.src_device == d]
        expect(moved, f"{call}: no partial sum of the whole output ({list(Y.shape)}) travelled "
                      f"from {describe_device(d)} to device 0: in this split every device "
                      "convolves ALL output pixels with its input channels, and device 0 adds "
                      "the partial sums up (splitting the pixels is another split)")
    share = whole / len(devices)
    work = rec.work_by_device(ancestry)
    for d, w in sorted(work.items(), key=lambda x: -x[1]):
        expect(w <= 1.6 * share + (len(devices) + 2) * Y.numel() + 8,
               f"{call}: {describe_device(d)} computed {w} elements of work (every operation "
               f"counted; a device's share of the layer is about {share:.0f} multiply-adds): "
               "each device computes only its slice")


def _grads_match(call, got, want, tensors, names, g):
    """Backward through both with one random upstream gradient; every gradient must agree."""
    R = torch.randn(want.shape, generator=g)
    gw = torch.autograd.grad((want * R).sum(), tensors, allow_unused=True)
    expect(got.requires_grad, f"{call}: the output does not depend on the inputs through "
                              "autograd: slice the tensors, do not detach them")
    gg = torch.autograd.grad((got * R).sum(), tensors, allow_unused=True)
    for name, a, b in zip(names, gg, gw, strict=True):
        expect(a is not None, f"{call}: the output does not depend on {name} through autograd: "
                              "slice it, do not detach it")
        expect(tensor_close(a, b, rtol=1e-4, atol=1e-4),
               f"{call}: the gradient of {name} differs from the unsplit layer's")


# ---- column, then row ------------------------------------------------------------------------
def _graph(Y):
    """Every autograd node behind Y, with the nodes each one feeds into."""
    nodes, users, todo = set(), {}, [Y.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in nodes:
            continue
        nodes.add(node)
        for nxt, _ in node.next_functions:
            if nxt is not None:
                users.setdefault(nxt, []).append(node)
                todo.append(nxt)
    return nodes, users


def _custom(node):
    """A node of an autograd.Function the answer (or the course: f, g) wrote."""
    return isinstance(node, torch.autograd.function.BackwardCFunction)


def _output_devices(node):
    """The devices of what an autograd.Function's forward returned (its node's inputs), or None
    where torch does not say."""
    try:
        return {str(m.device) for m in node._input_metadata}
    except (AttributeError, RuntimeError):
        return None


def _megatron_structure(call, Y, X, k):
    """f: X enters the devices through an autograd.Function (identity forward, all-reduce
    backward) whose forward itself puts X on every device; g: the k partial outputs leave
    through one (an all-reduce forward)."""
    nodes, users = _graph(Y)
    leaf = next((n for n in nodes if getattr(n, "variable", None) is X), None)
    expect(leaf is not None, f"{call}: the output does not depend on X")
    entries = users.get(leaf, [])
    expect(entries and all(_custom(u) for u in entries),
           f"{call}: X reaches the devices by plain copies, so backward only sums its gradient "
           "back on one device; start with copy_to_shards (f), whose backward all-reduces it")
    made = [_output_devices(u) for u in entries]         # judged by what f does
    made = None if None in made else set().union(*made)
    if made is not None and len(made) < k:
        raise CheckFailed(f"{call}: f's forward put X on {', '.join(sorted(made))} only, and "
                          f"plain copies took it to the {k} devices: f itself copies X to every "
                          "device (one output per device), so that its backward gathers their "
                          "gradients")
    gathers = [n for n in nodes if _custom(n) and sum(1 for m, _ in n.next_functions
                                                      if m is not None) >= k]
    expect(gathers, f"{call}: the {k} partial outputs are not combined by an all-reduce: add "
                    "them with reduce_from_shards (g)")


def _check_column_then_row(fn, gated):
    g = fresh_generator()
    for _ in range(3):
        k = randint(g, 2, 4)
        h = randint(g, 5, 6) * k + randint(g, 1, k - 1)      # never a shard's width
        n, d, o = 3, 2 * randint(g, 1, 2), randint(g, 2, 3)
        X = torch.randn(n, d, generator=g).requires_grad_()
        W1 = torch.randn(d, h, generator=g).requires_grad_()
        W2 = torch.randn(h, o, generator=g).requires_grad_()
        if gated:
            V = torch.randn(d, h, generator=g).requires_grad_()
            args, names = [X, W1, V, W2], ["X", "W1", "V", "W2"]
            formula, macs = "(silu(X @ W1) * (X @ V)) @ W2", n * h * (2 * d + o)
        else:
            b1 = torch.randn(h, generator=g).requires_grad_()
            b2 = torch.randn(o, generator=g).requires_grad_()
            args, names = [X, W1, b1, W2, b2], ["X", "W1", "b1", "W2", "b2"]
            formula, macs = "relu(X @ W1 + b1) @ W2 + b2", n * h * (d + o)
        name = "gated_mlp_column_then_row" if gated else "mlp_column_then_row"
        call = f"{name} on {k} devices ({h} hidden units)"
        copies = kept(*args)
        got = _tensor(fn(*args, [CPU] * k, ByteLog()), call, (n, o))
        expect_unchanged(call, copies, args, names)
        want = ((F.silu(X @ W1) * (X @ V)) @ W2 if gated     # after the answer ran
                else F.relu(X @ W1 + b1) @ W2 + b2)
        if not _close(got, want):
            if not gated:
                d_ = (got - want).detach().mean(dim=0)
                expect(not tensor_close(d_, (k - 1) * b2.detach(), atol=1e-4),
                       f"{call}: b2 was added {k} times; add it once, after the sum")
                expect(not tensor_close(d_, -b2.detach(), atol=1e-4), f"{call}: b2 is missing")
            expect(False, f"{call}: the output differs from {formula}" + (
                " (split W1 and V at the same columns: a hidden unit's gate and value must be "
                "on the same device)" if gated else ""))
        _grads_match(call, got, want, args, names, g)
        gpus = FakeGPUs(k)
        fakes = [gpus.tensor(t, 0) for t in args]
        Y, rec = gpus.run(fn, *fakes, gpus.devices, ByteLog(), what=call)
        for op in rec.ancestors(Y):
            if op.flops is not None:
                expect(all(h not in r.shape for r in op.reads),
                       f"{call}: {op.name} on {describe_device(op.device)} used all {h} hidden "
                       "units at once: device i holds only its columns of W1" +
                       (" and V" if gated else "") + " and the matching rows of W2")
        _spread(call, rec, Y, gpus.devices, macs, "the weights' columns (W1" +
                (", V" if gated else "") + ") and rows (W2)")
        _megatron_structure(call, Y, fakes[0], k)
        named = dict(zip(names, fakes, strict=True))
        expect_slices_received(call, rec, gpus.devices, {
            n: (named[n], 0 if n in ("W2", "b1") else 1) for n in names if n not in ("X", "b2")},
            {n: named[n] for n in ("X", "b2") if n in named})


@check("mlp_column_then_row", simulated=True,
       observes=["as check_gated_mlp_column_then_row, with biases"])
def check_mlp_column_then_row(fn):
    """fn(X, W1, b1, W2, b2, devices, log) == relu(X @ W1 + b1) @ W2 + b2, Megatron-style. Not an
    exercise any more (a section of within_layer): tests and teachers use it."""
    _check_column_then_row(fn, gated=False)


@check("gated_mlp_column_then_row", simulated=True, observes=[
    "values and all gradients on CPU tensors, against the unsplit block",
    "on k simulated GPUs: each device computed its share of the multiply-adds, no product saw "
    "all hidden units, no operation mixed devices, no device (the host included) received more "
    "of W1, V or W2 than its slice (the whole sent and sliced there)",
    "the autograd graph: X enters the devices through an autograd.Function (f) whose forward "
    "puts it on every device (no plain copies after it), and the k partial outputs leave "
    "through one (g)"])
def check_gated_mlp_column_then_row(fn):
    """fn(X, W1, V, W2, devices, log) == (silu(X @ W1) * (X @ V)) @ W2, Megatron-style: W1 and V
    split by the same columns, W2 by the matching rows, f before and g after."""
    _check_column_then_row(fn, gated=True)


# ---- within_layer: attention, split by heads -------------------------------------------------
def attention(X, Wq, Wk, Wv, Wo, heads):
    """Unsplit multi-head self-attention of one sequence X (t, d), no biases, no mask."""
    t, e = X.shape[0], Wq.shape[1] // heads
    Q, K, V = ((X @ W).reshape(t, heads, e).transpose(0, 1) for W in (Wq, Wk, Wv))
    A = torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(e), dim=-1) @ V
    return A.transpose(0, 1).reshape(t, heads * e) @ Wo


@check("attention_by_heads", simulated=True, observes=[
    "values and all gradients on CPU tensors, against unsplit multi-head attention (a number of "
    "heads the devices do not divide; 3 devices with heads % 3 == 2 and with heads % 3 == 1 "
    "in every call)",
    "on k simulated GPUs: each device computed its share of the multiply-adds (at most its "
    "tensor_split count of heads'), no product saw the columns of all heads, no operation "
    "mixed devices, no device (the host included) received more of Wq, Wk, Wv or Wo than its "
    "slice (the whole sent and sliced there)",
    "the autograd graph: X enters the devices through an autograd.Function (f) whose forward "
    "puts it on every device (no plain copies after it), and the k partial outputs leave "
    "through one (g)"])
def check_attention_by_heads(fn):
    """fn(X, Wq, Wk, Wv, Wo, heads, devices, log) == attention(X, ...): device i holds whole
    heads (their columns of Wq, Wk, Wv and their rows of Wo), f before, g after."""
    g = fresh_generator()
    forced = randint(g, 0, 2)      # two of the three cases, forced, in a fresh order
    for case in range(3):
        # 3 devices and heads % 3 == 2, where a remainder given whole to one device differs
        # from tensor_split's (the first heads % k devices one more each), and heads % 3 == 1,
        # where torch.chunk's ([3, 3, 1] for 7) does too; the third drawn (never divided evenly)
        rest = {forced: 2, (forced + 1) % 3: 1}.get(case)
        k = 3 if rest else randint(g, 2, 3)
        heads = k * randint(g, 2, 3) + (rest or randint(g, 1, k - 1))
        e, t, d = randint(g, 2, 3), randint(g, 3, 5), 2 * randint(g, 2, 3)
        X = torch.randn(t, d, generator=g).requires_grad_()
        Ws = [(torch.randn(*s, generator=g) / 2).requires_grad_()
              for s in [(d, heads * e)] * 3 + [(heads * e, d)]]
        call = f"attention_by_heads on {k} devices ({heads} heads of width {e})"
        copies = kept(X, *Ws)
        got = _tensor(fn(X, *Ws, heads, [CPU] * k, ByteLog()), call, (t, d))
        expect_unchanged(call, copies, [X, *Ws], ["X", "Wq", "Wk", "Wv", "Wo"])
        want = attention(X, *Ws, heads)
        expect(_close(got, want), f"{call}: the output differs from unsplit attention (split by "
               "whole heads: a head's columns of Wq, Wk and Wv, and its rows of Wo, stay together "
               "on one device; tensor_split the heads, not the columns)")
        _grads_match(call, got, want, [X, *Ws], ["X", "Wq", "Wk", "Wv", "Wo"], g)
        gpus = FakeGPUs(k)
        fakes = [gpus.tensor(x, 0) for x in (X, *Ws)]
        Y, rec = gpus.run(fn, *fakes, heads, gpus.devices, ByteLog(), what=call)
        width = heads * e
        for op in rec.ancestors(Y):
            if op.flops is not None:
                expect(all(width not in r.shape for r in op.reads),
                       f"{call}: {op.name} on {describe_device(op.device)} used the columns of "
                       f"all {heads} heads at once: device i holds only its heads")
        macs = 3 * t * d * width + 2 * t * t * width + t * width * d
        ancestry = _spread(call, rec, Y, gpus.devices, macs,
                           "the heads (Wq, Wk, Wv columns, Wo rows)")
        done = _macs_by_device(ancestry)
        for d, count in zip(gpus.devices, map(len, torch.arange(heads).tensor_split(k)),
                            strict=True):
            did = done.get(d, 0) / (macs / heads)        # in heads' worth of multiply-adds
            expect(did <= count + 0.5, f"{call}: {describe_device(d)} computed {did:.1f} "
                   f"heads' multiply-adds, expected {count}: give each device as many heads as "
                   "tensor_split gives it (the first heads % k devices get one more)")
        _megatron_structure(call, Y, fakes[0], k)
        expect_slices_received(call, rec, gpus.devices, {
            n: (w, 0 if n == "Wo" else 1) for n, w in zip(("Wq", "Wk", "Wv", "Wo"), fakes[1:],
                                                       strict=True)}, {"X": fakes[0]})
