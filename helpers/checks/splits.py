"""Checks for the exercises of Part I (the three ways to split training).

Every check runs on plain CPU tensors (several "devices" are all the CPU), on fresh random inputs.
"""
import copy
import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from ..costs import OPTIMIZER_STATE_BYTES, balanced_cuts, saved_per_layer
from .. import (CommLog, all_close, check_orders, clock_ticks, dense_split_rows, peak_live,
                ring_all_reduce, run_schedule, send)
from ._core import CheckFailed, as_number, expect, fresh_generator, randint, run_check

__all__ = ["check_microbatches_for_bubble", "check_split_by_params", "check_partial_sum_bytes",
           "check_conv_split_in_channels", "check_combine_mean_grads",
           "check_reduce_then_broadcast", "check_gpipe_time", "check_largest_batch_data_parallel"]
__all__ += ["check_order_1f1b", "check_saved_bytes"]     # network_split and costs

CPU = torch.device("cpu")


def _close(got, want, rtol=1e-4, atol=1e-5):
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.detach().float().cpu(), want.detach().float(),
                               rtol=rtol, atol=atol))


def _tensor(value, call, shape):
    expect(isinstance(value, torch.Tensor),
           f"{call} returned {type(value).__name__}, expected a tensor")
    expect(tuple(value.shape) == tuple(shape),
           f"{call} returned shape {tuple(value.shape)}, expected {tuple(shape)}")
    return value


# ---- network split -------------------------------------------------------------------------------
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
            expect(got == want, f"microbatches_for_bubble({p}, {target}) returned {got:g}, "
                                f"expected {want}: with {want} micro-batches the bubble is "
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
            # placement: stage i lives on devices[i] (meta devices stand in for GPUs: no memory)
            mixed = [torch.device("meta") if i % 2 else CPU for i in range(k)]
            for i, s in enumerate(fn(net, mixed)):
                where = {str(p.device) for p in s.parameters()}
                expect(where <= {str(mixed[i])},
                       f"stage {i}'s parameters are on {sorted(where)}, "
                       f"expected {mixed[i]}: move each stage to its device")
            sizes = [sum(p.numel() for p in s.parameters()) for s in stages]
            per_layer = [sum(p.numel() for p in m.parameters()) for m in net]
            bounds = [0, *balanced_cuts(per_layer, k), len(per_layer)]
            best = max(sum(per_layer[a:b]) for a, b in zip(bounds, bounds[1:]))
            expect(max(sizes) == best, f"your largest stage holds {max(sizes)} parameters "
                                       f"(stages: {sizes}); a better cut gets it down to {best}")

    return run_check("split_by_params", body, fn)


def _mlp_stages(g, p):
    """p stages of a small random MLP (its copy unsplit) and a batch for them."""
    widths = [randint(g, 3, 12) for _ in range(p + 1)]
    layers = [nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in zip(widths, widths[1:])]
    with torch.no_grad():
        for layer in layers:
            for q in layer.parameters():
                q.copy_(torch.randn(q.shape, generator=g) * 0.5)
    return nn.Sequential(*layers), widths


def check_order_1f1b(fn):
    """fn(p, m): per stage, the list of ("F", j) / ("B", j) that 1F1B runs. The check RUNS the
    order (helpers.run_schedule) on fresh stages: same loss and gradients as the unsplit model,
    GPipe's 2(m+p-1) ticks, and at most p - s live micro-batches on stage s, counted from the
    run."""

    def body(fn):
        g = fresh_generator()
        cases = [(randint(g, 2, 4), 0) for _ in range(3)] + [(2, 1), (3, 2)]
        for p, m in cases:
            m = m or randint(g, p + 1, 8)       # more micro-batches than stages: GPipe keeps m
            call = f"order_1f1b({p}, {m})"
            orders = fn(p, m)
            expect(isinstance(orders, (list, tuple)) and len(orders) == p,
                   f"{call} should return {p} lists, one per stage, got {type(orders).__name__}"
                   + (f" of length {len(orders)}" if hasattr(orders, "__len__") else ""))
            orders = [[tuple(op) for op in ops] for ops in orders]
            try:
                got_m = check_orders(orders)
            except (ValueError, TypeError, IndexError) as e:
                raise CheckFailed(f"{call}: {e}") from None
            expect(got_m == m, f"{call}: stage 0 runs {got_m} forwards, expected {m}")
            try:
                ticks = 1 + max(clock_ticks(orders).values())
            except ValueError as e:
                raise CheckFailed(f"{call} cannot run: {e}") from None
            net, widths = _mlp_stages(g, p)
            X = torch.randn(2 * m, widths[0], generator=g)
            y = torch.randn(2 * m, widths[-1], generator=g)
            mse = lambda out, t: ((out - t) ** 2).sum(dim=1)
            want = mse(net(X), y).mean()
            want.backward()
            stages = [copy.deepcopy(layer) for layer in net]
            for st in stages:
                st.zero_grad()
            total, schedule = run_schedule(stages, X, y, mse, [CPU] * p, orders)
            grads = [q.grad for st in stages for q in st.parameters()]
            expect(abs(total - want.item()) <= 1e-4 * max(1.0, abs(want.item()))
                   and all_close(grads, [q.grad for q in net.parameters()]),
                   f"{call}: the step's loss or gradients differ from the unsplit model's")
            expect(ticks == 2 * (m + p - 1),
                   f"{call} takes {ticks} ticks; 1F1B keeps GPipe's 2(m+p-1) = {2 * (m + p - 1)}"
                   " (start each stage with the forwards that fill the pipeline)")
            live = peak_live(schedule)
            for s_, n_live in enumerate(live):
                expect(n_live <= p - s_,
                       f"{call}: stage {s_} held {n_live} micro-batches at once (peaks counted "
                       f"from the run: {live}); 1F1B holds at most p - s = {p - s_}: run a "
                       "backward as soon as one can run")

    return run_check("order_1f1b", body, fn)


# ---- within a layer ------------------------------------------------------------------------------
def check_partial_sum_bytes(fn):
    """fn(n, d_out, k): bytes of partial sums that dense_split_rows sends for n examples of
    d_out float32 outputs on k devices (counted from a real run)."""

    def body(fn):
        g = fresh_generator()
        for _ in range(5):
            n, d_in, d_out, k = (randint(g, 1, 64), randint(g, 8, 32), randint(g, 1, 50),
                                 randint(g, 1, 8))
            log = CommLog()
            dense_split_rows(torch.randn(n, d_in), torch.randn(d_in, d_out), torch.randn(d_out),
                             [CPU] * k, log)
            want = log.total("partial sum")
            got = as_number(fn(n, d_out, k), f"partial_sum_bytes({n}, {d_out}, {k})")
            hint = (" (the device that adds them up sends nothing)"
                    if got == k * n * d_out * 4 else "")
            expect(got == want, f"partial_sum_bytes({n}, {d_out}, {k}) returned {got:g}, but the "
                                f"split sent {want} bytes of partial sums{hint}")

    return run_check("partial_sum_bytes", body, fn)


# The within-layer checks watch what the answer computes (a TorchFunctionMode sees every torch call
# of its forward) and what it sends (a CommLog): an unsplit computation, or partial sums added up
# without any communication, compute the right numbers but skip the split.
__all__ += ["check_gated_mlp_column_then_row", "check_bytes_sent_naive_vs_ring"]

_MOVES = {"to", "tensor_split", "chunk", "split", "narrow", "__getitem__", "view", "reshape", "t",
          "transpose", "contiguous", "detach", "clone", "size", "dim", "numel", "element_size",
          "__get__", "requires_grad_", "data_ptr", "unbind", "view_as", "reshape_as", "cpu",
          "cuda", "__len__", "__iter__", "__format__", "__repr__", "__bool__", "is_floating_point",
          "get_device", "__hash__", "__eq__", "__setstate__", "__reduce_ex__", "__deepcopy__",
          "permute", "unsqueeze", "squeeze", "expand", "flatten", "movedim", "swapaxes"}


class _Watch(TorchFunctionMode):
    """Records (op name, shapes of its tensor arguments) for every computing torch call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name not in _MOVES:
            shapes = []
            for a in [*args, *kwargs.values()]:
                for t in (a if isinstance(a, (list, tuple)) else [a]):
                    if isinstance(t, torch.Tensor):
                        shapes.append(tuple(t.shape))
            self.calls.append((name, shapes))
        return func(*args, **kwargs)


def _watched(fn, *args):
    """fn(*args) under a _Watch; returns (result, watch)."""
    with _Watch() as watch:
        out = fn(*args)
    return out, watch


def _first_call_with(watch, test):
    """The first recorded (name, shapes) with a shape for which test(shape) holds, or None."""
    for name, shapes in watch.calls:
        for sh in shapes:
            if test(sh):
                return name, sh
    return None


def _upstream(Y, g):
    return torch.randn(Y.shape, generator=g)


def _grads_match(call, got, want, tensors, names, g):
    """Backward through both with one random upstream gradient; every gradient must agree."""
    R = _upstream(want, g)
    gw = torch.autograd.grad((want * R).sum(), tensors, allow_unused=True)
    expect(got.requires_grad, f"{call}: the output does not depend on the inputs through autograd: "
                              "slice the tensors, do not detach them")
    gg = torch.autograd.grad((got * R).sum(), tensors, allow_unused=True)
    for name, a, b in zip(names, gg, gw):
        expect(a is not None, f"{call}: the output does not depend on {name} through autograd: "
                              "slice it, do not detach it")
        expect(torch.allclose(a, b, rtol=1e-4, atol=1e-4),
               f"{call}: the gradient of {name} differs from the unsplit layer's")


def check_conv_split_in_channels(fn):
    """fn(X, W, b, devices, log): conv2d(X, W, b) with the INPUT channels split over the devices:
    device i convolves its channels of X with its slice of every filter (a partial sum of the whole
    output), and the partial sums travel (logged in `log`) to be added up; the bias once."""

    def body(fn):
        g = fresh_generator()
        for _ in range(3):
            k = randint(g, 2, 4)
            c_in = randint(g, 3, 5) * k + randint(g, 1, k - 1)   # 7..23, never a shard's width
            c_out, n, hw = randint(g, 2, 4), 2, 6
            X = torch.randn(n, c_in, hw, hw, generator=g).requires_grad_()
            W = torch.randn(c_out, c_in, 3, 3, generator=g).requires_grad_()
            b = torch.randn(c_out, generator=g).requires_grad_()
            want = F.conv2d(X, W, b)
            call = f"conv_split_in_channels on {k} devices ({c_in} input channels)"
            log = CommLog()
            got, watch = _watched(fn, X, W, b, [CPU] * k, log)
            got = _tensor(got, call, want.shape)
            whole = _first_call_with(watch, lambda sh, c=c_in: len(sh) == 4 and sh[1] == c)
            expect(whole is None, f"{call}: {whole and whole[0]} saw all {c_in} input channels at "
                                  f"once (shape {whole and whole[1]}): device i convolves only its "
                                  "slice of the input channels, with the matching slice of W")
            convs = [c for c in watch.calls if "conv" in c[0]]
            expect(len(convs) >= k, f"{call}: {len(convs)} convolutions ran, expected one per "
                                    f"device ({k})")
            if not _close(got, want):
                diff = (got.detach() - want.detach()).mean(dim=(0, 2, 3))
                if torch.allclose(diff, -b.detach(), atol=1e-4):
                    expect(False, f"{call}: the bias is missing")
                if torch.allclose(diff, (k - 1) * b.detach(), atol=1e-4):
                    expect(False,
                           f"{call}: the bias was added {k} times; add it once, after the sum")
                expect(False, f"{call}: the output differs from conv2d (is a shard's partial "
                              "sum missing?)")
            out_bytes = want.numel() * 4
            expect(log.total() >= (k - 1) * out_bytes,
                   f"{call}: {log.total()} bytes were sent, but the {k - 1} other devices each "
                   f"hold a partial sum of {out_bytes} bytes that must travel to be added up: "
                   "move them with send(P, i, 0, devices, log) (or an all-reduce), not a plain sum")
            _grads_match(call, got, want, [X, W, b], ["X", "W", "b"], g)

    return run_check("conv_split_in_channels", body, fn)


def _check_column_then_row(name, fn, gated):
    """Shared body of the two MLP checks: watch the hidden units, count the all-reduces."""

    def body(fn):
        g = fresh_generator()
        for _ in range(3):
            k = randint(g, 2, 4)
            h = randint(g, 5, 6) * k + randint(g, 1, k - 1)      # never a shard's width
            n, d, o = 3, 2 * randint(g, 1, 2), randint(g, 2, 3)   # d != n: shapes tell X from W1
            X = torch.randn(n, d, generator=g).requires_grad_()
            W1 = torch.randn(d, h, generator=g).requires_grad_()
            W2 = torch.randn(h, o, generator=g).requires_grad_()
            if gated:
                V = torch.randn(d, h, generator=g).requires_grad_()
                args, names = [X, W1, V, W2], ["X", "W1", "V", "W2"]
                want = (F.silu(X @ W1) * (X @ V)) @ W2
                formula = "(silu(X @ W1) * (X @ V)) @ W2"
            else:
                b1 = torch.randn(h, generator=g).requires_grad_()
                b2 = torch.randn(o, generator=g).requires_grad_()
                args, names = [X, W1, b1, W2, b2], ["X", "W1", "b1", "W2", "b2"]
                want = F.relu(X @ W1 + b1) @ W2 + b2
                formula = "relu(X @ W1 + b1) @ W2 + b2"
            call = f"{name} on {k} devices ({h} hidden units)"
            log = CommLog()
            got, watch = _watched(fn, *args, [CPU] * k, log)
            got = _tensor(got, call, want.shape)
            whole = _first_call_with(watch, lambda sh, h=h: h in sh)
            if whole is not None:
                op, sh = whole
                which = (("the whole W1 or V" if gated else "the whole W1") if sh == (d, h)
                         else "the whole W2" if sh == (h, o)
                         else f"all {h} hidden units")
                expect(False, f"{call}: {op} used {which} at once (shape {sh}): device i holds "
                              "only its columns of W1" + (" and V" if gated else "")
                              + " and the matching rows of W2, so no step ever sees every hidden "
                              "unit")
            fwd = log.total()
            out_bytes = want.numel() * 4
            expect(fwd > 0, f"{call}: the partial outputs were added up without any communication "
                            "(nothing was logged): each device holds a partial sum; combine them "
                            "with reduce_from_shards (g), an all-reduce")
            expect(fwd >= (k - 1) * out_bytes,
                   f"{call}: the forward sent {fwd} bytes, but adding up {k} partial outputs of "
                   f"{out_bytes} bytes needs at least {(k - 1) * out_bytes}")
            if not _close(got, want):
                if not gated:
                    d_ = (got - want).detach().mean(dim=0)
                    if torch.allclose(d_, (k - 1) * b2.detach(), atol=1e-4):
                        expect(False, f"{call}: b2 was added {k} times; add it once, after the sum")
                    if torch.allclose(d_, -b2.detach(), atol=1e-4):
                        expect(False, f"{call}: b2 is missing")
                expect(False, f"{call}: the output differs from {formula}" + (
                    " (split W1 and V at the same columns: a hidden unit's gate and value must be "
                    "on the same device)" if gated else ""))
            _grads_match(call, got, want, args, names, g)
            bwd = log.total() - fwd
            in_bytes = X.numel() * 4
            expect(bwd >= (k - 1) * in_bytes,
                   f"{call}: backward sent {bwd} bytes: each device's shard of W1 contributes a "
                   f"part of the gradient of X ({in_bytes} bytes), and these parts must be "
                   "all-reduced: start with copy_to_shards (f), whose backward does it")

    return run_check(name, body, fn)


def check_mlp_column_then_row(fn):
    """fn(X, W1, b1, W2, b2, devices, log) == relu(X @ W1 + b1) @ W2 + b2 with W1 split by columns
    and W2 by the matching rows: no step sees all hidden units, one all-reduce forward (g), one
    backward (f), all gradients right. The Megatron MLP is a section of within_layer now, not an
    exercise, so this check is not exported (tests and teachers import it from here); the
    exercise is its gated variant, check_gated_mlp_column_then_row."""
    return _check_column_then_row("mlp_column_then_row", fn, gated=False)


def check_gated_mlp_column_then_row(fn):
    """fn(X, W1, V, W2, devices, log) == (silu(X @ W1) * (X @ V)) @ W2, Megatron-style: W1 and V
    split by the same columns, W2 by the matching rows, one all-reduce forward and one backward."""
    return _check_column_then_row("gated_mlp_column_then_row", fn, gated=True)


# ---- across the data -----------------------------------------------------------------------------
def check_combine_mean_grads(fn):
    """fn(grads, sizes): the full batch's mean-loss gradient from each shard's mean-loss
    gradient."""

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
                    expect(False,
                           f"with shard sizes {sizes} a plain average of the shard gradients "
                           "overweights the small shards: weight each by its size")
                if _close(got, sum(grads)):
                    expect(False,
                           "you summed the shard gradients: each is a mean over its shard, so "
                           "weight it by the shard's size and divide by the batch size")
                expect(False,
                       f"the result differs from the full batch's mean gradient (sizes {sizes})")

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
                           " (it still holds its own gradient)"
                           if torch.allclose(orig, own[i]) else ""))

    return run_check("reduce_then_broadcast", body, fn)


def _naive_allreduce(xs, devices, log):
    """Reduce to device 0, then broadcast from it (steps 3 and 4 of data_parallel), logged."""
    total = sum(send(x, i, 0, devices, log, "reduce") for i, x in enumerate(xs))
    return [send(total, 0, i, devices, log, "broadcast") for i in range(len(xs))]


def check_bytes_sent_naive_vs_ring(fn):
    """fn(nbytes, k) -> (bytes device 0 sends when it reduces and broadcasts, bytes each device
    sends in a ring all-reduce), for a gradient of nbytes on k devices; counted from real runs."""

    def body(fn):
        g = fresh_generator()
        seen = set()
        for _ in range(5):
            k = randint(g, 2, 8)
            n = k * randint(g, 1, 200)               # elements: a multiple of k, equal chunks
            nbytes = 4 * n
            xs = [torch.randn(n, generator=g) for _ in range(k)]
            log_naive, log_ring = CommLog(), CommLog()
            _naive_allreduce(xs, [CPU] * k, log_naive)
            ring_all_reduce(xs, [CPU] * k, log_ring)
            naive, ring = log_naive.sent_by(0), log_ring.sent_by(0)
            call = f"bytes_sent({nbytes}, {k})"
            got = fn(nbytes, k)
            expect(isinstance(got, (tuple, list)) and len(got) == 2,
                   f"{call} returned {got!r}: expected a pair (naive device 0, ring per device)")
            got_naive, got_ring = (as_number(v, call) for v in got)
            seen.add((got_naive, got_ring))
            if got_naive != naive:
                expect(got_naive != 2 * naive, f"{call}: device 0 sends {naive} bytes, you "
                       f"returned {got_naive:g}, its sends AND receives: count only what it sends")
                expect(got_naive != nbytes * k, f"{call}: device 0 sends {naive} bytes: the "
                       f"sum goes to the {k - 1} OTHER devices, not to itself")
                expect(False, f"{call}: device 0 sends {naive} bytes when it reduces then "
                              f"broadcasts, you returned {got_naive:g}")
            if not math.isclose(got_ring, ring, rel_tol=1e-9):
                expect(not math.isclose(got_ring, ring / 2, rel_tol=1e-9),
                       f"{call}: in the ring each device sends {ring} bytes, you returned "
                       f"{got_ring:g}: that is the reduce-scatter alone; the all-gather sends as "
                       "much again")
                expect(False, f"{call}: in the ring each device sends {ring} bytes "
                              f"(counted), you returned {got_ring:g}")
        expect(len(seen) > 1, "bytes_sent returned the same pair for every input")

    return run_check("bytes_sent_naive_vs_ring", body, fn)


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
    """fn(sizes, k, memory_bytes, optimizer): the largest global batch whose data-parallel step
    fits in `memory_bytes` per device (split_costs' model: float32 parameters and gradients, the
    optimizer's state, activations of the largest shard), 0 if one example per device does not."""

    def body(fn):
        g = fresh_generator()
        P = randint(g, 20000, 100000)     # more parameters than activations per example, as in
        acts = [randint(g, 10, 2000) for _ in range(4)]   # LeNet: forgetting the grads shows
        sizes = [dict(name="layer", params=P // 4, out=a, acts=a, weighted=[]) for a in acts]
        total_p = 4 * (P // 4)
        per_example = sum(acts) * 4
        names = ["momentum", "adam", "sgd", "adam", "momentum"]
        for optimizer in names:
            k = randint(g, 2, 8)
            fixed = (8 + OPTIMIZER_STATE_BYTES[optimizer]) * total_p
            memory = fixed + randint(g, 1, 300) * per_example + randint(g, 0, per_example - 1)
            want = k * ((memory - fixed) // per_example)
            call = f"largest_batch_data_parallel(…, k={k}, …, {optimizer!r})"
            got = as_number(fn(sizes, k, memory, optimizer), call)
            hint = ""
            if got * k == want:
                hint = " (the batch is split over the devices: multiply by k)"
            elif got == k * ((memory - 8 * total_p) // per_example) != want:
                hint = f" ({optimizer} keeps {OPTIMIZER_STATE_BYTES[optimizer]} bytes of state " \
                       "per parameter on every device)"
            expect(got == want, f"{call} with {memory} bytes per device: the largest batch is "
                                f"{want}, you returned {got:g}{hint}")
        small = (8 + OPTIMIZER_STATE_BYTES["adam"]) * total_p - 1
        expect(as_number(fn(sizes, 2, small, "adam"), "largest_batch_data_parallel") == 0,
               "when the parameters, gradients and optimizer state alone do not fit, the answer "
               "is 0")

    return run_check("largest_batch_data_parallel", body, fn)


def _random_net(g):
    """A small random conv net with a view (Flatten), pooling and ReLUs."""
    c1, c2, hidden = randint(g, 2, 6), randint(g, 2, 6), randint(g, 4, 16)
    pool = nn.MaxPool2d(2) if randint(g, 0, 1) else nn.AvgPool2d(2)
    side = randint(g, 8, 12)
    net = nn.Sequential(nn.Conv2d(1, c1, 3), nn.ReLU(), pool, nn.Conv2d(c1, c2, 3), nn.ReLU(),
                        nn.Flatten(), nn.Linear(c2 * ((side - 2) // 2 - 2) ** 2, hidden),
                        nn.ReLU(), nn.Linear(hidden, 3))
    return net, torch.randn(randint(g, 1, 4), 1, side, side, generator=g)


def check_saved_bytes(fn):
    """fn(net, X): the bytes of activations autograd saves for backward in net(X), each storage
    once, parameters left out (as helpers.saved_per_layer measures them)."""

    def body(fn):
        g = fresh_generator()
        for _ in range(4):
            net, X = _random_net(g)
            want = sum(saved_per_layer(net, X))
            call = f"saved_bytes on a batch of {X.shape[0]}"
            got = as_number(fn(net, X), call)
            outputs = []
            hooks = [m.register_forward_hook(lambda m, i, o: outputs.append(o.numel() * 4))
                     for m in net]
            with torch.no_grad():
                net(X)
            for h in hooks:
                h.remove()
            params = sum(q.numel() * 4 for q in net.parameters())
            hint = ""
            if got in (sum(outputs), sum(outputs) + X.numel() * 4):
                hint = " (that is what the layers output; autograd keeps other tensors: count " \
                       "what saved_tensors_hooks packs)"
            elif got == want + params:
                hint = " (the weights are parameters, not activations: leave them out)"
            elif got > want:
                hint = " (a tensor saved twice, or a view of a saved one, takes its memory " \
                       "once: count each storage once, and no parameters)"
            expect(got == want, f"{call}: autograd saved {want} bytes of activations, you "
                                f"returned {got:g}{hint}")

    return run_check("saved_bytes", body, fn)
