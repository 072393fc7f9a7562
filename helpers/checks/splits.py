"""Checks for the exercises of Part I (the three ways to split training).

Every check runs on plain CPU tensors (several "devices" are all the CPU), on fresh random inputs.
"""
import math

import torch
from torch import nn
from torch.nn import functional as F

from ..costs import balanced_cuts
from ..splits import CommLog, dense_split_rows
from ._core import as_number, expect, fresh_generator, randint, run_check

__all__ = ["check_microbatches_for_bubble", "check_split_by_params", "check_partial_sum_bytes",
           "check_conv_split_in_channels", "check_mlp_column_then_row", "check_combine_mean_grads",
           "check_reduce_then_broadcast", "check_gpipe_time", "check_largest_batch_data_parallel"]

CPU = torch.device("cpu")


def _close(got, want, rtol=1e-4, atol=1e-5):
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.detach().float().cpu(), want.detach().float(), rtol=rtol, atol=atol))


def _tensor(value, call, shape):
    expect(isinstance(value, torch.Tensor), f"{call} returned {type(value).__name__}, expected a tensor")
    expect(tuple(value.shape) == tuple(shape),
           f"{call} returned shape {tuple(value.shape)}, expected {tuple(shape)}")
    return value


# ---- network split --------------------------------------------------------------------------------
def check_microbatches_for_bubble(fn):
    """fn(p, target): the fewest micro-batches m with bubble (p-1)/(m+p-1) <= target."""

    def body(fn):
        g = fresh_generator()
        cases = [(randint(g, 2, 8), randint(g, 2, 45) / 100) for _ in range(6)] + [(1, 0.1)]
        for p, target in cases:
            want = 1
            while (p - 1) / (want + p - 1) > target + 1e-12:
                want += 1
            got = as_number(fn(p, target), f"microbatches_for_bubble({p}, {target})")
            expect(got == want, f"microbatches_for_bubble({p}, {target}) returned {got:g}, expected "
                                f"{want}: with {want} micro-batches the bubble is "
                                f"{(p - 1) / (want + p - 1):.3f}" + (
                                    f", with {want - 1} it is {(p - 1) / (want + p - 2):.3f}"
                                    if want > 1 else ""))

    return run_check("microbatches_for_bubble", body, fn)


def check_split_by_params(fn):
    """fn(net, devices): len(devices) stages of the nn.Sequential `net`, copies, in order, the
    largest stage holding as few parameters as possible; together they compute net."""

    def body(fn):
        g = fresh_generator()
        for _ in range(3):
            widths = [randint(g, 2, 40) for _ in range(randint(g, 4, 7))]
            layers = []
            for a, b in zip(widths, widths[1:]):
                layers += [nn.Linear(a, b), nn.ReLU()]
            net = nn.Sequential(*layers[:-1])
            k = randint(g, 2, 4)
            devices = [CPU] * k
            stages = fn(net, devices)
            expect(isinstance(stages, (list, tuple)) and len(stages) == k,
                   f"expected a list of {k} stages, got {type(stages).__name__}"
                   + (f" of length {len(stages)}" if hasattr(stages, "__len__") else ""))
            for i, s in enumerate(stages):
                expect(isinstance(s, nn.Module) and len(list(s.children())) > 0,
                       f"stage {i} is empty: every device gets at least one layer")
            own = {p.data_ptr() for p in net.parameters()}
            expect(not any(p.data_ptr() in own for s in stages for p in s.parameters()),
                   "a stage shares its parameters with net: copy the layers (copy.deepcopy)")
            X = torch.randn(5, widths[0], generator=g)
            h = X
            for s in stages:
                h = s(h)
            expect(_close(h, net(X)), "the stages, run in order, do not compute what net computes")
            sizes = [sum(p.numel() for p in s.parameters()) for s in stages]
            per_layer = [sum(p.numel() for p in m.parameters()) for m in net]
            bounds = [0, *balanced_cuts(per_layer, k), len(per_layer)]
            best = max(sum(per_layer[a:b]) for a, b in zip(bounds, bounds[1:]))
            expect(max(sizes) == best, f"your largest stage holds {max(sizes)} parameters "
                                       f"(stages: {sizes}); a better cut gets it down to {best}")

    return run_check("split_by_params", body, fn)


# ---- within a layer ------------------------------------------------------------------------------
def check_partial_sum_bytes(fn):
    """fn(n, d_out, k): bytes of partial sums that dense_split_rows sends for n examples of
    d_out float32 outputs on k devices (counted from a real run)."""

    def body(fn):
        g = fresh_generator()
        for _ in range(5):
            n, d_in, d_out, k = randint(g, 1, 64), randint(g, 8, 32), randint(g, 1, 50), randint(g, 1, 8)
            log = CommLog()
            dense_split_rows(torch.randn(n, d_in), torch.randn(d_in, d_out), torch.randn(d_out),
                             [CPU] * k, log)
            want = log.total("partial sum")
            got = as_number(fn(n, d_out, k), f"partial_sum_bytes({n}, {d_out}, {k})")
            hint = " (the device that adds them up sends nothing)" if got == k * n * d_out * 4 else ""
            expect(got == want, f"partial_sum_bytes({n}, {d_out}, {k}) returned {got:g}, but the "
                                f"split sent {want} bytes of partial sums{hint}")

    return run_check("partial_sum_bytes", body, fn)


def check_conv_split_in_channels(fn):
    """fn(X, W, b, devices): conv2d(X, W, b) with the INPUT channels split over the devices."""

    def body(fn):
        g = fresh_generator()
        for _ in range(3):
            k, c_in, c_out = randint(g, 2, 4), randint(g, 4, 9), randint(g, 2, 6)
            X = torch.randn(2, c_in, 7, 7, generator=g)
            W = torch.randn(c_out, c_in, 3, 3, generator=g).requires_grad_()
            b = torch.randn(c_out, generator=g).requires_grad_()
            want = F.conv2d(X, W, b)
            call = f"conv_split_in_channels on {k} devices ({c_in} input channels)"
            got = _tensor(fn(X, W, b, [CPU] * k), call, want.shape)
            if not _close(got, want):
                diff = (got.detach() - want.detach()).mean(dim=(0, 2, 3))
                if torch.allclose(diff, -b.detach(), atol=1e-4):
                    expect(False, f"{call}: the bias is missing")
                if torch.allclose(diff, (k - 1) * b.detach(), atol=1e-4):
                    expect(False, f"{call}: the bias was added {k} times; add it once, after the sum")
                expect(False, f"{call}: the output differs from conv2d (is a shard's partial sum missing?)")
            expect(got.requires_grad, f"{call}: the output does not depend on W and b through "
                                      "autograd: slice them, do not detach them")
            gW, = torch.autograd.grad(got.sum(), W, allow_unused=True)
            expect(gW is not None and torch.allclose(gW, torch.autograd.grad(want.sum(), W)[0], atol=1e-4),
                   f"{call}: the gradient of W differs: compute from W's slices, not from copies")

    return run_check("conv_split_in_channels", body, fn)


def check_mlp_column_then_row(fn):
    """fn(X, W1, b1, W2, b2, devices) == relu(X @ W1 + b1) @ W2 + b2, W1 split by columns and W2
    by rows, with ONE sum of partial results (the relu runs on each device's own columns)."""

    def body(fn):
        g = fresh_generator()
        for _ in range(3):
            k, d, h, o, n = randint(g, 2, 4), randint(g, 3, 9), randint(g, 4, 12), randint(g, 2, 6), 5
            X = torch.randn(n, d, generator=g)
            W1, b1 = torch.randn(d, h, generator=g), torch.randn(h, generator=g)
            W2, b2 = torch.randn(h, o, generator=g), torch.randn(o, generator=g)
            want = F.relu(X @ W1 + b1) @ W2 + b2
            call = f"mlp_column_then_row on {k} devices"
            got = _tensor(fn(X, W1, b1, W2, b2, [CPU] * k), call, want.shape)
            if not _close(got, want):
                d_ = (got - want).mean(dim=0)
                if torch.allclose(d_, -b2, atol=1e-4):
                    expect(False, f"{call}: b2 is missing")
                if torch.allclose(d_, (k - 1) * b2, atol=1e-4):
                    expect(False, f"{call}: b2 was added {k} times; add it once, after the sum")
                expect(False, f"{call}: the output differs from relu(X @ W1 + b1) @ W2 + b2")

    return run_check("mlp_column_then_row", body, fn)


# ---- across the data -----------------------------------------------------------------------------
def check_combine_mean_grads(fn):
    """fn(grads, sizes): the full batch's mean-loss gradient from each shard's mean-loss gradient."""

    def body(fn):
        g = fresh_generator()
        for _ in range(3):
            k = randint(g, 2, 5)
            sizes = [randint(g, 1, 9) for _ in range(k)]
            while len(set(sizes)) == 1:
                sizes[0] += 1
            grads = [torch.randn(3, 2, generator=g) for _ in range(k)]
            want = sum(gr * s for gr, s in zip(grads, sizes)) / sum(sizes)
            got = _tensor(fn([gr.clone() for gr in grads], list(sizes)),
                          f"combine_mean_grads(…, sizes={sizes})", want.shape)
            if not _close(got, want):
                if _close(got, sum(grads) / k):
                    expect(False, f"with shard sizes {sizes} a plain average of the shard gradients "
                                  "overweights the small shards: weight each by its size")
                if _close(got, sum(grads)):
                    expect(False, "you summed the shard gradients: each is a mean over its shard, so "
                                  "weight it by the shard's size and divide by the batch size")
                expect(False, f"the result differs from the full batch's mean gradient (sizes {sizes})")

    return run_check("combine_mean_grads", body, fn)


def check_reduce_then_broadcast(fn):
    """fn(grads): steps 3 and 4, in place: afterwards every tensor in `grads` holds their sum."""

    def body(fn):
        g = fresh_generator()
        for _ in range(3):
            k = randint(g, 2, 5)
            grads = [torch.randn(4, 3, generator=g) for _ in range(k)]
            originals = list(grads)
            own = [gr.clone() for gr in grads]
            want = sum(own)
            fn(grads)
            for i, (gr, orig) in enumerate(zip(grads, originals)):
                if gr is not orig:
                    expect(torch.allclose(orig, want, atol=1e-5),
                           f"tensor {i} of the list was replaced by a new tensor; the device's own "
                           "gradient still holds its local value: write into it in place (copy_)")
                expect(torch.allclose(orig, want, atol=1e-5),
                       f"tensor {i} does not hold the sum of the {k} gradients" + (
                           " (it still holds its own gradient)" if torch.allclose(orig, own[i]) else ""))

    return run_check("reduce_then_broadcast", body, fn)


# ---- costs ---------------------------------------------------------------------------------------
def check_gpipe_time(fn):
    """fn(t_stage, p, m): the time of a GPipe step with p equal stages and m micro-batches, where
    t_stage is one stage's forward+backward time on the whole batch."""

    def body(fn):
        g = fresh_generator()
        for _ in range(6):
            t, p, m = randint(g, 1, 100) / 10, randint(g, 1, 8), randint(g, 1, 16)
            want = (m + p - 1) * t / m
            got = as_number(fn(t, p, m), f"gpipe_time({t}, {p}, {m})")
            expect(math.isclose(got, want, rel_tol=1e-9),
                   f"gpipe_time({t}, {p}, {m}) returned {got:g}, expected {want:g}: "
                   f"{m + p - 1} ticks of {t / m:g} s each")

    return run_check("gpipe_time", body, fn)


def check_largest_batch_data_parallel(fn):
    """fn(sizes, k, memory_bytes): the largest global batch whose data-parallel step fits in
    `memory_bytes` per device (split_costs' model), 0 if even one example per device does not."""

    def body(fn):
        g = fresh_generator()
        P = randint(g, 20000, 100000)     # more parameters than activations per example, as in
        acts = [randint(g, 10, 2000) for _ in range(4)]   # LeNet: forgetting the grads shows
        sizes = [dict(name="layer", params=P // 4, out=a, acts=a, weighted=[]) for a in acts]
        total_p = 4 * (P // 4)
        per_example = sum(acts) * 4
        for _ in range(4):
            k = randint(g, 1, 8)
            memory = 8 * total_p + randint(g, 0, 300) * per_example + randint(g, 0, per_example - 1)
            n = k * ((memory - 8 * total_p) // per_example)
            got = as_number(fn(sizes, k, memory), f"largest_batch_data_parallel(…, k={k}, …)")
            expect(got == n, f"on {k} devices with {memory} bytes each, the largest batch is {n}, "
                             f"you returned {got:g}" + (
                                 " (the batch is split over the devices)" if got * k == n else ""))
        expect(as_number(fn(sizes, 2, 8 * total_p - 1), "largest_batch_data_parallel") == 0,
               "when the parameters and gradients alone do not fit, the answer is 0")

    return run_check("largest_batch_data_parallel", body, fn)
