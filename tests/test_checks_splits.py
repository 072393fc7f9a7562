"""The Part I exercise checks: the reference solution passes, a stub is "not done", and wrong
answers fail with the message that says why."""
import copy

import torch
from torch.nn import functional as F

from helpers import balanced_cuts
from helpers.checks import (check_combine_mean_grads, check_conv_split_in_channels,
                            check_gpipe_time, check_largest_batch_data_parallel,
                            check_microbatches_for_bubble, check_mlp_column_then_row,
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


def conv_split_in_channels(X, W, b, devices):
    k = len(devices)
    partials = [F.conv2d(Xi.to(d), Wi.to(d)) for Xi, Wi, d in
                zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1), devices)]
    return sum(P.to(devices[0]) for P in partials) + b.to(devices[0]).reshape(1, -1, 1, 1)


def mlp_column_then_row(X, W1, b1, W2, b2, devices):
    k = len(devices)
    partials = [F.relu(X.to(d) @ W1i.to(d) + b1i.to(d)) @ W2i.to(d) for W1i, b1i, W2i, d in
                zip(W1.tensor_split(k, dim=1), b1.tensor_split(k), W2.tensor_split(k), devices)]
    return sum(P.to(devices[0]) for P in partials) + b2.to(devices[0])


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
    def no_bias(X, W, b, devices):
        return conv_split_in_channels(X, W, torch.zeros_like(b), devices)
    def bias_each(X, W, b, devices):
        k = len(devices)
        return sum(F.conv2d(Xi, Wi, b) for Xi, Wi in
                   zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1)))
    def drop_shard(X, W, b, devices):
        k = len(devices)
        return sum(F.conv2d(Xi, Wi) for Xi, Wi in
                   list(zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1)))[:-1]) \
            + b.reshape(1, -1, 1, 1)
    def detached(X, W, b, devices):
        return conv_split_in_channels(X, W.detach(), b.detach(), devices)
    assert_fails(check_conv_split_in_channels(no_bias), "bias is missing")
    assert_fails(check_conv_split_in_channels(bias_each), "added")
    assert_fails(check_conv_split_in_channels(drop_shard), "partial sum")
    assert_fails(check_conv_split_in_channels(detached), "autograd")


def test_mlp_column_then_row():
    assert check_mlp_column_then_row(mlp_column_then_row)
    assert check_mlp_column_then_row(stub).status == "not done"
    def bias_each(X, W1, b1, W2, b2, devices):
        k = len(devices)
        return sum(F.relu(X @ a + c) @ w + b2 for a, c, w in
                   zip(W1.tensor_split(k, dim=1), b1.tensor_split(k), W2.tensor_split(k)))
    def relu_after_sum(X, W1, b1, W2, b2, devices):   # relu of the wrong thing
        return F.relu(X @ W1 @ W2 + b2)
    assert_fails(check_mlp_column_then_row(bias_each), "added")
    assert_fails(check_mlp_column_then_row(relu_after_sum), "differs")


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
