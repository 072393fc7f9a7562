"""The Part I exercise checks (helpers/checks/{network_split,within_layer,data_parallel,costs}):
worked answers, shortcuts of different kinds (known cheats included, failing with
the message that names what it skipped), other right answers (tests/check_cases.py)."""
import copy
import math

import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut, worked
from torch.nn import functional as F

import helpers
from helpers import copy_to_shards, reduce_from_shards, send


# ---- network_split -------------------------------------------------------------------------------
@worked("check_microbatches_for_bubble")
def microbatches_for_bubble(p, target):
    m = 1
    while (p - 1) / (m + p - 1) > target:
        m += 1
    return m


@other("check_microbatches_for_bubble", "the closed form (rejected in 10% of draws)")
def microbatches_closed_form(p, target):
    return max(1, math.ceil((p - 1) * (1 - target) / target))


@shortcut("check_microbatches_for_bubble", "counts ticks", "number of clock ticks")
def microbatches_ticks(p, target):
    return microbatches_for_bubble(p, target) + p - 1


@shortcut("check_microbatches_for_bubble", "one too few", "is still")
def microbatches_one_short(p, target):
    return max(0, microbatches_for_bubble(p, target) - 1)


def _cuts(sizes, k):
    """Every way to cut len(sizes) layers into k non-empty stages; the best for the largest."""
    def ways(start, parts):
        if parts == 1:
            yield []
            return
        for c in range(start + 1, len(sizes) - parts + 2):
            for rest in ways(c, parts - 1):
                yield [c, *rest]
    return min(ways(0, k), key=lambda cuts: max(
        sum(sizes[a:b]) for a, b in zip([0, *cuts], [*cuts, len(sizes)])))


@worked("check_split_by_params")
def split_by_params(net, devices):
    sizes = [helpers.num_params(layer) for layer in net]
    bounds = [0, *_cuts(sizes, len(devices)), len(net)]
    return [copy.deepcopy(net[a:b]).to(d) for a, b, d in zip(bounds, bounds[1:], devices)]


@other("check_split_by_params", "layer by layer, moved after copying")
def split_by_params_layers(net, devices):
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in net]
    bounds = [0, *_cuts(sizes, len(devices)), len(net)]
    stages = []
    for a, b, d in zip(bounds, bounds[1:], devices):
        stage = torch.nn.Sequential(*[copy.deepcopy(net[i]) for i in range(a, b)])
        stages.append(stage.to(d))
    return stages


@shortcut("check_split_by_params", "the reference", "course's own answer")
def split_by_params_reference(net, devices):
    sizes = [helpers.num_params(layer) for layer in net]
    return helpers.split_sequential(net, helpers.balanced_cuts(sizes, len(devices)), devices)


@shortcut("check_split_by_params", "ignores devices", "move each stage to its device")
def split_by_params_no_move(net, devices):
    sizes = [helpers.num_params(layer) for layer in net]
    bounds = [0, *_cuts(sizes, len(devices)), len(net)]
    return [copy.deepcopy(net[a:b]) for a, b in zip(bounds, bounds[1:])]


@shortcut("check_split_by_params", "shares net's layers", "copy the layers")
def split_by_params_shared(net, devices):
    sizes = [helpers.num_params(layer) for layer in net]
    bounds = [0, *_cuts(sizes, len(devices)), len(net)]
    return [net[a:b].to(d) for a, b, d in zip(bounds, bounds[1:], devices)]


@shortcut("check_split_by_params", "equal layer counts", "a better cut")
def split_by_params_even(net, devices):
    cuts = [round(i * len(net) / len(devices)) for i in range(1, len(devices))]
    bounds = [0, *cuts, len(net)]
    return [copy.deepcopy(net[a:b]).to(d) for a, b, d in zip(bounds, bounds[1:], devices)]


@worked("check_order_1f1b")
def order_1f1b(p, m):
    orders = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        ops = [("F", j) for j in range(warm)]
        for j in range(m - warm):
            ops += [("F", warm + j), ("B", j)]
        orders.append(ops + [("B", j) for j in range(m - warm, m)])
    return orders


@other("check_order_1f1b", "lists, built by simulating the stage's queue")
def order_1f1b_lists(p, m):
    orders = []
    for s in range(p):
        todo_f, todo_b, ops = list(range(m)), list(range(m)), []
        while todo_f and len(ops) < p - 1 - s:
            ops.append(["F", todo_f.pop(0)])
        while todo_f or todo_b:
            if todo_f:
                ops.append(["F", todo_f.pop(0)])
            ops.append(["B", todo_b.pop(0)])
        orders.append(ops)
    return orders


@shortcut("check_order_1f1b", "the reference", "course's own answer")
def order_1f1b_reference(p, m):
    return helpers.one_f_one_b_order(p, m)


@shortcut("check_order_1f1b", "GPipe's order", "held")
def order_1f1b_gpipe(p, m):
    return helpers.gpipe_order(p, m)


@shortcut("check_order_1f1b", "one warm-up forward too many", "1F1B holds at most")
def order_1f1b_extra_warmup(p, m):
    orders = []
    for s in range(p):
        warm = min(p - s, m)
        ops = [("F", j) for j in range(warm)]
        for j in range(m - warm):
            ops += [("F", warm + j), ("B", j)]
        orders.append(ops + [("B", j) for j in range(m - warm, m)])
    return orders


# ---- within_layer --------------------------------------------------------------------------------
@worked("check_partial_sum_bytes")
def partial_sum_bytes(n, d_out, k):
    return (k - 1) * n * d_out * 4


@other("check_partial_sum_bytes", "numpy, in another order")
def partial_sum_bytes_numpy(n, d_out, k):
    return np.int64(4) * n * d_out * (k - 1)


@shortcut("check_partial_sum_bytes", "runs the reference and reads the log",
          "course's own answer")
def partial_sum_bytes_measured(n, d_out, k):
    log = helpers.ByteLog()
    helpers.dense_split_rows(torch.zeros(n, 8), torch.zeros(8, d_out), torch.zeros(d_out),
                             [torch.device("cpu")] * k, log)
    return log.wire_bytes("partial sum")


@shortcut("check_partial_sum_bytes", "counts the adding device", "the device that adds")
def partial_sum_bytes_all(n, d_out, k):
    return k * n * d_out * 4


@shortcut("check_partial_sum_bytes", "values, not bytes", "a float32 value is 4 bytes")
def partial_sum_bytes_values(n, d_out, k):
    return (k - 1) * n * d_out


@worked("check_conv_split_in_channels")
def conv_split_in_channels(X, W, b, devices, log=None):
    k = len(devices)
    shards = zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1))
    partials = [F.conv2d(send(Xi, 0, i, devices, log, "input"), Wi.to(devices[i]))
                for i, (Xi, Wi) in enumerate(shards)]
    Y = sum(send(P, i, 0, devices, log, "partial sum") for i, P in enumerate(partials))
    return Y + b.to(devices[0]).reshape(1, -1, 1, 1)


@other("check_conv_split_in_channels", "plain .to, no log, bias through conv2d on device 0")
def conv_split_plain_to(X, W, b, devices, log=None):
    k = len(devices)
    Y = None
    for i, (Xi, Wi) in enumerate(zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1))):
        P = F.conv2d(Xi.to(devices[i]), Wi.to(devices[i]), b.to(devices[i]) if i == 0 else None)
        Y = P.to(devices[0]) if Y is None else Y + P.to(devices[0])
    return Y


@shortcut("check_conv_split_in_channels", "unsplit", "saw all")
def conv_unsplit(X, W, b, devices, log=None):
    return F.conv2d(X, W, b)


@shortcut("check_conv_split_in_channels", "no device moves", "computed nothing")
def conv_no_moves(X, W, b, devices, log=None):
    k = len(devices)
    parts = [F.conv2d(Xi, Wi) for Xi, Wi in zip(X.tensor_split(k, dim=1),
                                                 W.tensor_split(k, dim=1))]
    for i, P in enumerate(parts):
        send(P, i, 0, devices, log, "partial sum")          # logged, never moved
    return sum(parts) + b.reshape(1, -1, 1, 1)


@shortcut("check_conv_split_in_channels", "einsum + decoy convs and sends",
          "multiply-adds")
def conv_einsum_decoys(X, W, b, devices, log=None):
    k = len(devices)
    for i, (Xi, Wi) in enumerate(zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1))):
        send(F.conv2d(Xi.to(devices[i]), Wi.to(devices[i])), i, 0, devices, log, "partial sum")
    patches = F.unfold(X, 3)                                  # (n, c_in*9, L)
    Y = torch.einsum("ncl,oc->nol", patches, W.reshape(W.shape[0], -1))
    side = X.shape[-1] - 2
    decoy = sum(F.conv2d(Xi.to(devices[i]), Wi.to(devices[i])).sum().to(devices[0]) * 0
                for i, (Xi, Wi) in enumerate(zip(X.tensor_split(k, dim=1),
                                                 W.tensor_split(k, dim=1))))
    return Y.reshape(X.shape[0], -1, side, side) + b.reshape(1, -1, 1, 1) + decoy


@shortcut("check_conv_split_in_channels", "bias on every device", "added")
def conv_bias_each(X, W, b, devices, log=None):
    k = len(devices)
    parts = [F.conv2d(Xi.to(d), Wi.to(d), b.to(d)) for Xi, Wi, d in
             zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1), devices)]
    return sum(P.to(devices[0]) for P in parts)


@shortcut("check_conv_split_in_channels", "the whole X and W to every device, sliced there",
          ["received", "elements of X", "slice first"])
def conv_whole_sent_sliced_there(X, W, b, devices, log=None):
    k, c = len(devices), X.shape[1]
    bounds = [c * i // k for i in range(k + 1)]
    parts = [F.conv2d(X.to(d)[:, lo:hi], W.to(d)[:, lo:hi]).to(devices[0])
             for d, lo, hi in zip(devices, bounds, bounds[1:])]
    return sum(parts) + b.to(devices[0]).reshape(1, -1, 1, 1)


@shortcut("check_conv_split_in_channels", "slices of X, the whole W to every device",
          ["received", "elements of W;"])
def conv_whole_w_sent(X, W, b, devices, log=None):
    k = len(devices)
    parts = [F.conv2d(Xi.to(d), W.to(d).tensor_split(k, dim=1)[i]).to(devices[0])
             for i, (Xi, d) in enumerate(zip(X.tensor_split(k, dim=1), devices))]
    return sum(parts) + b.to(devices[0]).reshape(1, -1, 1, 1)


@shortcut("check_conv_split_in_channels", "the whole X to the host, sliced there",
          ["the CPU received", "elements of X"])
def conv_whole_x_through_host(X, W, b, devices, log=None):
    k, host = len(devices), X.cpu()
    parts = [F.conv2d(Xi.to(d), Wi.to(d)).to(devices[0]) for Xi, Wi, d in
             zip(host.tensor_split(k, dim=1), W.tensor_split(k, dim=1), devices)]
    return sum(parts) + b.to(devices[0]).reshape(1, -1, 1, 1)


def _conv_partials(X, W, devices):
    """Each device's partial sum of the whole output, computed on that device."""
    k = len(devices)
    return [F.conv2d(Xi.to(d), Wi.to(d)) for Xi, Wi, d in
            zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1), devices)]


@shortcut("check_conv_split_in_channels", "partial sums added along a chain, the total sent to "
          "device 0", ["sent a partial sum of the whole output", "add them up there"])
def conv_split_chain_sum(X, W, b, devices, log=None):
    parts = _conv_partials(X, W, devices)
    total = parts[0]
    for i in range(1, len(devices)):
        total = total.to(devices[i]) + parts[i]
    return total.to(devices[0]) + b.to(devices[0]).reshape(1, -1, 1, 1)


@shortcut("check_conv_split_in_channels", "partial sums added up on the host, sent to device 0",
          ["to the CPU", "add them up there"])
def conv_split_host_sum(X, W, b, devices, log=None):
    total = sum(P.cpu() for P in _conv_partials(X, W, devices))
    return total.to(devices[0]) + b.to(devices[0]).reshape(1, -1, 1, 1)


@other("check_conv_split_in_channels", "partial sums copied into a buffer on device 0, summed")
def conv_split_buffer_sum(X, W, b, devices, log=None):
    parts = _conv_partials(X, W, devices)
    buf = torch.empty(len(parts), *parts[0].shape, device=devices[0])
    for i, P in enumerate(parts):
        buf[i].copy_(P)
    return buf.sum(0) + b.to(devices[0]).reshape(1, -1, 1, 1)


@worked("check_gated_mlp_column_then_row")
def gated_mlp_column_then_row(X, W1, V, W2, devices, log=None):
    k = len(devices)
    Xs = copy_to_shards(X, devices, log)
    shards = zip(Xs, W1.tensor_split(k, dim=1), V.tensor_split(k, dim=1), W2.tensor_split(k),
                 devices)
    partials = [(F.silu(Xi @ W1i.to(d)) * (Xi @ Vi.to(d))) @ W2i.to(d)
                for Xi, W1i, Vi, W2i, d in shards]
    return reduce_from_shards(partials, devices, log)


class _F(torch.autograd.Function):
    """An own f: X on every device forward, the sum of their gradients backward."""

    @staticmethod
    def forward(ctx, X, devices):
        ctx.home = X.device
        return tuple(X.to(d, copy=True) for d in devices)

    @staticmethod
    def backward(ctx, *grads):
        return sum(g.to(ctx.home) for g in grads), None


@other("check_gated_mlp_column_then_row", "its own autograd f, chunked splits")
def gated_own_f(X, W1, V, W2, devices, log=None):
    k = len(devices)
    Xs = _F.apply(X, devices)
    cols = torch.arange(W1.shape[1]).tensor_split(k)
    partials = [(F.silu(Xi @ W1[:, c].to(d)) * (Xi @ V[:, c].to(d))) @ W2[c].to(d)
                for Xi, c, d in zip(Xs, cols, devices)]
    return reduce_from_shards(partials, devices, log)


@other("check_gated_mlp_column_then_row", "W1's and V's slices moved as one tensor")
def gated_fused_move(X, W1, V, W2, devices, log=None):
    k = len(devices)
    Xs = copy_to_shards(X, devices, log)
    partials = []
    for Xi, W1i, Vi, W2i, d in zip(Xs, W1.tensor_split(k, dim=1), V.tensor_split(k, dim=1),
                                   W2.tensor_split(k), devices):
        gate, value = (Xi @ torch.cat([W1i, Vi], dim=1).to(d)).split(W1i.shape[1], dim=1)
        partials.append((F.silu(gate) * value) @ W2i.to(d))
    return reduce_from_shards(partials, devices, log)


@shortcut("check_gated_mlp_column_then_row", "the whole weights to every device, sliced there",
          ["received", "elements of W1", "slice first"])
def gated_whole_sent_sliced_there(X, W1, V, W2, devices, log=None):
    k, h = len(devices), W1.shape[1]
    bounds = [h * i // k for i in range(k + 1)]
    Xs = copy_to_shards(X, devices, log)
    partials = [(F.silu(Xi @ W1.to(d)[:, lo:hi]) * (Xi @ V.to(d)[:, lo:hi])) @ W2.to(d)[lo:hi]
                for Xi, d, lo, hi in zip(Xs, devices, bounds, bounds[1:])]
    return reduce_from_shards(partials, devices, log)


@shortcut("check_gated_mlp_column_then_row", "slices of W1 and V, the whole W2 to every device",
          ["received", "elements of W2"])
def gated_whole_w2_sent(X, W1, V, W2, devices, log=None):
    k = len(devices)
    Xs = copy_to_shards(X, devices, log)
    partials = [(F.silu(Xi @ W1i.to(d)) * (Xi @ Vi.to(d))) @ W2.to(d).tensor_split(k)[i]
                for i, (Xi, W1i, Vi, d) in enumerate(zip(Xs, W1.tensor_split(k, dim=1),
                                                          V.tensor_split(k, dim=1), devices))]
    return reduce_from_shards(partials, devices, log)


@shortcut("check_gated_mlp_column_then_row", "unsplit", "hidden units at once")
def gated_unsplit(X, W1, V, W2, devices, log=None):
    return (F.silu(X @ W1) * (X @ V)) @ W2


@shortcut("check_gated_mlp_column_then_row", "without f", "copy_to_shards (f)")
def gated_without_f(X, W1, V, W2, devices, log=None):
    k = len(devices)
    shards = zip(W1.tensor_split(k, dim=1), V.tensor_split(k, dim=1), W2.tensor_split(k), devices)
    partials = [(F.silu(X.to(d) @ W1i.to(d)) * (X.to(d) @ Vi.to(d))) @ W2i.to(d)
                for W1i, Vi, W2i, d in shards]
    return reduce_from_shards(partials, devices, log)


@shortcut("check_gated_mlp_column_then_row", "weights never moved", "computed nothing")
def gated_no_moves(X, W1, V, W2, devices, log=None):
    k = len(devices)
    Xs = copy_to_shards(X, [X.device] * k, log)
    partials = [(F.silu(Xi @ W1i) * (Xi @ Vi)) @ W2i for Xi, W1i, Vi, W2i in
                zip(Xs, W1.tensor_split(k, dim=1), V.tensor_split(k, dim=1), W2.tensor_split(k))]
    return reduce_from_shards(partials, [X.device] * k, log)


@shortcut("check_gated_mlp_column_then_row", "V's columns mismatched", "same columns")
def gated_mismatched(X, W1, V, W2, devices, log=None):
    k = len(devices)
    Xs = copy_to_shards(X, devices, log)
    Vs = V.flip(1).tensor_split(k, dim=1)
    partials = [(F.silu(Xi @ W1i.to(d)) * (Xi @ Vi.to(d))) @ W2i.to(d) for Xi, W1i, Vi, W2i, d in
                zip(Xs, W1.tensor_split(k, dim=1), Vs, W2.tensor_split(k), devices)]
    return reduce_from_shards(partials, devices, log)


test_case = parametrize_cases(__name__)
