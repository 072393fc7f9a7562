"""The Part I exercise checks: the reference solution passes, a stub is "not done", and wrong
answers fail with the message that says why."""
import copy

import torch
from torch.nn import functional as F

from helpers import balanced_cuts
from helpers import copy_to_shards, megatron_mlp, reduce_from_shards, send
from helpers.checks import (check_bytes_sent_naive_vs_ring, check_gated_mlp_column_then_row)
from helpers.checks.splits import check_mlp_column_then_row
from helpers.checks import (check_combine_mean_grads, check_conv_split_in_channels,
                            check_gpipe_time, check_largest_batch_data_parallel,
                            check_microbatches_for_bubble,
                            check_partial_sum_bytes, check_reduce_then_broadcast,
                            check_split_by_params)
from helpers.checks import check_order_1f1b, check_saved_bytes


def stub(*args):
    raise NotImplementedError()


def assert_fails(result, words):
    assert result.status == "failed", result
    assert words in result.message, result.message


# ---- reference solutions (the notebooks' solution cells) -----------------------------------------
def microbatches_for_bubble(p, target):
    m = 1
    while (p - 1) / (m + p - 1) > target:
        m += 1
    return m


def split_by_params(net, devices):
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in net]
    bounds = [0, *balanced_cuts(sizes, len(devices)), len(net)]
    return [copy.deepcopy(net[a:b]).to(d) for a, b, d in zip(bounds, bounds[1:], devices)]


def partial_sum_bytes(n, d_out, k, bytes_per_value=4):
    return (k - 1) * n * d_out * bytes_per_value


def conv_split_in_channels(X, W, b, devices, log=None):
    k = len(devices)
    partials = [F.conv2d(send(Xi, 0, i, devices, log, "input"), Wi.to(devices[i]))
                for i, (Xi, Wi) in enumerate(zip(X.tensor_split(k, dim=1),
                                                 W.tensor_split(k, dim=1)))]
    Y = sum(send(P, i, 0, devices, log, "partial sum") for i, P in enumerate(partials))
    return Y + b.to(devices[0]).reshape(1, -1, 1, 1)


mlp_column_then_row = megatron_mlp


def gated_mlp_column_then_row(X, W1, V, W2, devices, log=None):
    k = len(devices)
    Xs = copy_to_shards(X, devices, log)
    shards = zip(Xs, W1.tensor_split(k, dim=1), V.tensor_split(k, dim=1), W2.tensor_split(k),
                 devices)
    partials = [(F.silu(Xi @ W1i.to(d)) * (Xi @ Vi.to(d))) @ W2i.to(d)
                for Xi, W1i, Vi, W2i, d in shards]
    return reduce_from_shards(partials, devices, log)


def bytes_sent(nbytes, k):
    return (k - 1) * nbytes, 2 * (k - 1) / k * nbytes


def combine_mean_grads(grads, sizes):
    return sum(g * n for g, n in zip(grads, sizes)) / sum(sizes)


def reduce_then_broadcast(grads):
    total = sum(g.to(grads[0].device) for g in grads)
    for g in grads:
        g.copy_(total)


def gpipe_time(t_stage, p, m):
    return (m + p - 1) * t_stage / m


def largest_batch_data_parallel(sizes, k, memory_bytes, optimizer):
    state = {"sgd": 0, "momentum": 4, "adam": 8}[optimizer]
    P = sum(r["params"] for r in sizes)
    A = sum(r["acts"] for r in sizes)
    return k * max(0, (memory_bytes - (8 + state) * P) // (4 * A))


def order_1f1b(p, m):
    orders = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        ops = [("F", j) for j in range(warm)]
        for j in range(m - warm):
            ops += [("F", warm + j), ("B", j)]
        orders.append(ops + [("B", j) for j in range(m - warm, m)])
    return orders


def saved_bytes(net, X):
    seen, keep = {}, []
    params = {q.untyped_storage().data_ptr() for q in net.parameters()}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
            keep.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(X)
    return sum(seen.values())


# ---- the tests -----------------------------------------------------------------------------------
def test_microbatches_for_bubble():
    assert check_microbatches_for_bubble(microbatches_for_bubble)
    assert check_microbatches_for_bubble(stub).status == "not done"
    assert_fails(check_microbatches_for_bubble(lambda p, t: round((p - 1) / t)), "expected")
    assert_fails(check_microbatches_for_bubble(lambda p, t: 8), "expected")


def test_split_by_params():
    assert check_split_by_params(split_by_params)
    assert check_split_by_params(stub).status == "not done"
    def shares(net, devices):   # no copy
        bounds = [0, *balanced_cuts([sum(p.numel() for p in l.parameters()) for l in net],
                                    len(devices)), len(net)]
        return [net[a:b] for a, b in zip(bounds, bounds[1:])]
    assert_fails(check_split_by_params(shares), "shares its parameters")
    def even_layers(net, devices):   # as many layers per stage, not as many parameters
        k = len(devices)
        bounds = [round(i * len(net) / k) for i in range(k + 1)]
        return [copy.deepcopy(net[a:b]).to(d) for a, b, d in zip(bounds, bounds[1:], devices)]
    results = [check_split_by_params(even_layers) for _ in range(5)]
    assert any(r.status == "failed" and "a better cut" in r.message for r in results)
    def fresh_weights(net, devices):   # right cuts, but the layers re-initialised
        stages = split_by_params(net, devices)
        for s in stages:
            for layer in s:
                if hasattr(layer, "reset_parameters"):
                    layer.reset_parameters()
        return stages
    assert_fails(check_split_by_params(fresh_weights), "do not compute")
    def stays_put(net, devices):    # right cuts, copies, but never moved to the devices
        return [s.cpu() for s in split_by_params(net, [torch.device("cpu")] * len(devices))]
    assert_fails(check_split_by_params(stays_put), "move each stage to its device")


def test_partial_sum_bytes():
    assert check_partial_sum_bytes(partial_sum_bytes)
    assert check_partial_sum_bytes(stub).status == "not done"
    assert_fails(check_partial_sum_bytes(lambda n, d, k: k * n * d * 4), "sends nothing")
    assert_fails(check_partial_sum_bytes(lambda n, d, k: 516272), "partial sums")


def test_conv_split_in_channels():
    assert check_conv_split_in_channels(conv_split_in_channels)
    assert check_conv_split_in_channels(stub).status == "not done"
    def unsplit(X, W, b, devices, log):           # the plain convolution: right numbers, no split
        return F.conv2d(X, W, b)
    def local_sum(X, W, b, devices, log):         # split, but the partial sums never travel
        k = len(devices)
        return sum(F.conv2d(Xi, Wi) for Xi, Wi in
                   zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1))) + b.reshape(1, -1, 1, 1)
    def no_bias(X, W, b, devices, log):
        return conv_split_in_channels(X, W, torch.zeros_like(b), devices, log)
    def bias_each(X, W, b, devices, log):
        k = len(devices)
        return sum(send(F.conv2d(Xi, Wi, b), i, 0, devices, log) for i, (Xi, Wi) in
                   enumerate(zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1))))
    def detached(X, W, b, devices, log):
        return conv_split_in_channels(X, W.detach(), b.detach(), devices, log)
    assert_fails(check_conv_split_in_channels(unsplit), "saw all")
    assert_fails(check_conv_split_in_channels(local_sum), "not a plain sum")
    assert_fails(check_conv_split_in_channels(no_bias), "bias is missing")
    assert_fails(check_conv_split_in_channels(bias_each), "added")
    assert_fails(check_conv_split_in_channels(detached), "autograd")


def test_mlp_column_then_row():
    assert check_mlp_column_then_row(mlp_column_then_row)
    assert check_mlp_column_then_row(stub).status == "not done"
    def unsplit(X, W1, b1, W2, b2, devices, log):      # the review's counter-example
        return F.relu(X @ W1 + b1) @ W2 + b2
    def gather_hidden(X, W1, b1, W2, b2, devices, log):   # column split, then the whole W2
        k = len(devices)
        H = torch.cat([F.relu(X @ a + c) for a, c in
                       zip(W1.tensor_split(k, dim=1), b1.tensor_split(k))], dim=1)
        return H @ W2 + b2
    def local_sum(X, W1, b1, W2, b2, devices, log):    # split right, summed on one device, unsent
        k = len(devices)
        return sum(F.relu(X @ a + c) @ w for a, c, w in
                   zip(W1.tensor_split(k, dim=1), b1.tensor_split(k), W2.tensor_split(k))) + b2
    def no_f(X, W1, b1, W2, b2, devices, log):   # g but no f: the input gradient is not reduced
        k = len(devices)
        partials = [F.relu(X @ a + c) @ w for a, c, w in
                    zip(W1.tensor_split(k, dim=1), b1.tensor_split(k), W2.tensor_split(k))]
        return reduce_from_shards(partials, devices, log) + b2
    def bias_each(X, W1, b1, W2, b2, devices, log):
        k = len(devices)
        Xs = copy_to_shards(X, devices, log)
        partials = [F.relu(Xi @ a + c) @ w + b2 for Xi, a, c, w in
                    zip(Xs, W1.tensor_split(k, dim=1), b1.tensor_split(k), W2.tensor_split(k))]
        return reduce_from_shards(partials, devices, log)
    assert_fails(check_mlp_column_then_row(unsplit), "used the whole W1")
    assert_fails(check_mlp_column_then_row(gather_hidden), "hidden units at once")
    assert_fails(check_mlp_column_then_row(local_sum), "without any communication")
    assert_fails(check_mlp_column_then_row(no_f), "copy_to_shards (f)")
    assert_fails(check_mlp_column_then_row(bias_each), "added")


def test_gated_mlp_column_then_row():
    assert check_gated_mlp_column_then_row(gated_mlp_column_then_row)
    assert check_gated_mlp_column_then_row(stub).status == "not done"
    def unsplit(X, W1, V, W2, devices, log):
        return (F.silu(X @ W1) * (X @ V)) @ W2
    def local_sum(X, W1, V, W2, devices, log):
        k = len(devices)
        return sum((F.silu(X @ a) * (X @ v)) @ w for a, v, w in
                   zip(W1.tensor_split(k, dim=1), V.tensor_split(k, dim=1), W2.tensor_split(k)))
    def mismatched(X, W1, V, W2, devices, log):         # gate and value split at other columns
        k = len(devices)
        Xs = copy_to_shards(X, devices, log)
        partials = [(F.silu(Xi @ a) * (Xi @ v)) @ w for Xi, a, v, w in
                    zip(Xs, W1.tensor_split(k, dim=1), [V[:, i::k] for i in range(k)],
                        W2.tensor_split(k))]
        return reduce_from_shards(partials, devices, log)
    assert_fails(check_gated_mlp_column_then_row(unsplit), "used the whole W1")
    assert_fails(check_gated_mlp_column_then_row(local_sum), "without any communication")
    assert_fails(check_gated_mlp_column_then_row(mismatched), "same columns")


def test_bytes_sent_naive_vs_ring():
    assert check_bytes_sent_naive_vs_ring(bytes_sent)
    assert check_bytes_sent_naive_vs_ring(stub).status == "not done"
    assert_fails(check_bytes_sent_naive_vs_ring(
                     lambda n, k: (2 * (k - 1) * n, 2 * (k - 1) / k * n)),
                 "sends AND receives")
    assert_fails(check_bytes_sent_naive_vs_ring(lambda n, k: ((k - 1) * n, (k - 1) / k * n)),
                 "reduce-scatter alone")
    assert_fails(check_bytes_sent_naive_vs_ring(lambda n, k: (3 * n, 1.75 * n)), "")


def test_combine_mean_grads():
    assert check_combine_mean_grads(combine_mean_grads)
    assert check_combine_mean_grads(stub).status == "not done"
    assert_fails(check_combine_mean_grads(lambda g, s: sum(g) / len(g)), "plain average")
    assert_fails(check_combine_mean_grads(lambda g, s: sum(g)), "summed")


def test_reduce_then_broadcast():
    assert check_reduce_then_broadcast(reduce_then_broadcast)
    assert check_reduce_then_broadcast(stub).status == "not done"
    def rebinding(grads):
        total = sum(grads)
        for i in range(len(grads)):
            grads[i] = total.clone()
    def reduce_only(grads):
        for g in grads[1:]:
            grads[0].add_(g)
    assert_fails(check_reduce_then_broadcast(rebinding), "in place")
    assert_fails(check_reduce_then_broadcast(reduce_only), "still holds its own gradient")


def test_gpipe_time():
    assert check_gpipe_time(gpipe_time)
    assert check_gpipe_time(stub).status == "not done"
    assert_fails(check_gpipe_time(lambda t, p, m: t * p), "expected")
    assert_fails(check_gpipe_time(lambda t, p, m: (m + p) * t / m), "ticks")


def test_largest_batch_data_parallel():
    assert check_largest_batch_data_parallel(largest_batch_data_parallel)
    assert check_largest_batch_data_parallel(stub).status == "not done"
    def per_device(sizes, k, memory, optimizer):
        return largest_batch_data_parallel(sizes, k, memory, optimizer) // k
    def no_grads(sizes, k, memory, optimizer):   # forgets the gradients
        P, A = sum(r["params"] for r in sizes), sum(r["acts"] for r in sizes)
        return k * max(0, (memory - 4 * P) // (4 * A))
    def no_state(sizes, k, memory, optimizer):   # forgets the optimizer state
        return largest_batch_data_parallel(sizes, k, memory, "sgd")
    def state_sharded(sizes, k, memory, optimizer):   # as if the state were split k ways (ZeRO)
        P, A = sum(r["params"] for r in sizes), sum(r["acts"] for r in sizes)
        state = {"sgd": 0, "momentum": 4, "adam": 8}[optimizer]
        return k * max(0, int(memory - 8 * P - state * P / k) // (4 * A))
    assert_fails(check_largest_batch_data_parallel(per_device), "multiply by k")
    assert_fails(check_largest_batch_data_parallel(no_grads), "the largest batch is")
    assert_fails(check_largest_batch_data_parallel(no_state), "bytes of state per parameter")
    assert_fails(check_largest_batch_data_parallel(state_sharded), "the largest batch is")


def test_order_1f1b():
    assert check_order_1f1b(order_1f1b)
    assert check_order_1f1b(stub).status == "not done"
    def gpipe(p, m):     # all forwards, then all backwards: m live micro-batches
        return [[("F", j) for j in range(m)] + [("B", j) for j in reversed(range(m))]
                for _ in range(p)]
    def one_at_a_time(p, m):   # F then B for each micro-batch: no overlap between stages
        return [[op for j in range(m) for op in (("F", j), ("B", j))] for _ in range(p)]
    def backward_first(p, m):   # a backward before its forward: can never run
        return [[("B", 0), ("F", 0)] + [op for j in range(1, m) for op in (("F", j), ("B", j))]
                for _ in range(p)]
    def drops_one(p, m):        # the last micro-batch never runs
        return [ops[:-2] for ops in order_1f1b(p, m)]
    assert_fails(check_order_1f1b(gpipe), "micro-batches at once")
    assert_fails(check_order_1f1b(one_at_a_time), "ticks")
    assert_fails(check_order_1f1b(backward_first), "cannot run")
    assert_fails(check_order_1f1b(drops_one), "once for each micro-batch")
    assert_fails(check_order_1f1b(lambda p, m: None), "one per stage")


def test_saved_bytes():
    assert check_saved_bytes(saved_bytes)
    assert check_saved_bytes(stub).status == "not done"
    def leaf_outputs(net, X):   # what the layers output (the old layer_sizes estimate)
        sizes = []
        hooks = [m.register_forward_hook(lambda m, i, o: sizes.append(o.numel() * 4)) for m in net]
        net(X)
        for h in hooks:
            h.remove()
        return sum(sizes)
    def every_pack(net, X):     # no dedupe: a tensor saved by two layers counts twice
        total = [0]
        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            net(X)
        params = sum(q.numel() * 4 for q in net.parameters())
        return total[0] - params
    def with_params(net, X):    # the weights counted as activations
        return saved_bytes(net, X) + sum(q.numel() * 4 for q in net.parameters())
    assert_fails(check_saved_bytes(leaf_outputs), "what the layers output")
    assert_fails(check_saved_bytes(every_pack), "count each storage once")
    assert_fails(check_saved_bytes(with_params), "not activations")
