"""Natural wrong answers that once passed on some draws: each check now forces the case that
tells it apart into every call (a size where torch.chunk makes fewer pieces than tensor_split,
a bucket size between a total in MiB and in MB, a net a greedy cut splits wrongly, a padding
longer than the data, a remainder of 2 on 3 devices and one of 1 (torch.chunk's heads), an
index repeated after an entry that is not a number, the gradients left after a step the text
asks to clear them after, a batch whose best micro-batch count is the batch size itself). Each
shortcut fails on five replayed draws, and the right answers beside them pass."""
import copy
import math

import pytest
import torch
from check_cases import (  # noqa: F401
    CASES,
    not_grading,
    other,
    parametrize_cases,
    ring_over,
    shortcut,
    spread_over,
)

import helpers
from helpers import copy_to_shards, reduce_from_shards
from helpers.checks._core.inputs import replay_seeds


@shortcut("check_accumulated_step", "gradients left in .grad after the step",
          "clear the gradients")
def accumulated_step_not_cleared(net, params, X, y, num_micro, lr):
    for X_m, y_m in zip(X.tensor_split(num_micro), y.tensor_split(num_micro), strict=True):
        helpers.loss(net(X_m, params), y_m).sum().backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad / X.shape[0]


@other("check_accumulated_step", "gradients zeroed in place, not set to None")
def accumulated_step_zeroed(net, params, X, y, num_micro, lr):
    for X_m, y_m in zip(X.tensor_split(num_micro), y.tensor_split(num_micro), strict=True):
        helpers.loss(net(X_m, params), y_m).sum().backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad / X.shape[0]
            p.grad.zero_()


@other("check_accumulated_step", "gradients cleared first, before the backwards (zero_grad)")
def accumulated_step_cleared_first(net, params, X, y, num_micro, lr):
    for p in params:
        p.grad = None
    for X_m, y_m in zip(X.tensor_split(num_micro), y.tensor_split(num_micro), strict=True):
        helpers.loss(net(X_m, params), y_m).sum().backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad / X.shape[0]


@shortcut("check_pipeline_forward", "micro-batches by torch.chunk", "micro-batch")
def pipeline_forward_chunk(stage, comm, X, num_microbatches, batch_size, in_shape):
    r, p, m = comm.rank, comm.world, num_microbatches
    rows = [len(c) for c in torch.arange(batch_size).chunk(m)]
    outs = []
    with torch.no_grad():
        for j in range(len(rows)):
            h = X.chunk(m)[j] if r == 0 else comm.recv(r - 1, (rows[j], *in_shape), tag=j)
            out = stage(h)
            if r < p - 1:
                comm.send(out, r + 1, tag=j)
            outs.append(out)
    comm.wait()
    return torch.cat(outs) if r == p - 1 else None


@shortcut("check_sharded_server_step", "chunks by torch.chunk", [])   # raises or over a bound
def sharded_server_step_chunk(params, grads, devices, lr):
    k = len(devices)
    pc, gc = [p.chunk(k) for p in params], [g.chunk(k) for g in grads]
    for j in range(k):
        pc[j][j].sub_(lr * sum(gc[i][j].to(devices[j]) for i in range(k)))
    for i in range(k):
        for j in range(k):
            if i != j:
                pc[i][j].copy_(pc[j][j])


@shortcut("check_allreduce_spread", "chunks by torch.chunk", [])   # raises or over a bound
def allreduce_spread_chunk(data):
    spread_over([t.view(-1).chunk(len(data)) for t in data])


@shortcut("check_ring_allreduce", "chunks by torch.chunk", "raised")
def ring_allreduce_chunk(data):
    return ring_over(data, [t.view(-1).chunk(len(data)) for t in data])


@shortcut("check_bucket_params", "bucket_mb read as MB (10**6 bytes), not MiB",
          "bucket_mb MiB")
def bucket_params_megabytes(params, bucket_mb):
    limit = None if bucket_mb is None else bucket_mb * 1e6
    buckets, current, size, seen = [], [], 0, set()
    for p in reversed(list(params)):
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        current.append(p)
        size += p.numel() * p.element_size()
        if limit is None or size >= limit:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


@shortcut("check_split_by_params", "greedy cuts at a k-th of the total", "a better cut")
def split_by_params_greedy(net, devices):
    k, n = len(devices), len(net)
    sizes = [helpers.num_params(layer) for layer in net]
    target, cuts, run = sum(sizes) / k, [], 0
    for i, s in enumerate(sizes):
        run += s
        left_layers, left_stages = n - i - 1, k - 1 - len(cuts)
        if left_stages and (run >= target or left_layers == left_stages) \
                and left_layers >= left_stages:
            cuts.append(i + 1)
            run = 0
    bounds = [0, *cuts, n]
    return [copy.deepcopy(net[a:b]).to(d) for a, b, d in zip(bounds, bounds[1:], devices)]


@shortcut("check_sampler_shard", "padding by one copy of the permutation's start",
          "has 0 indices")
def sampler_shard_short_padding(n, rank, world_size, epoch, seed):
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    padded = perm + perm[:-(-n // world_size) * world_size - n]
    return padded[rank::world_size]


def _heads_in(counts, X, Wq, Wk, Wv, Wo, heads, devices, log):
    """Attention by heads, `counts[i]` consecutive heads on device i."""
    t, e = X.shape[0], Wq.shape[1] // heads
    first, partials = 0, []
    for Xi, d, h in zip(copy_to_shards(X, devices, log), devices, counts, strict=True):
        cols = slice(first * e, (first + h) * e)
        first += h
        Q, K, V = ((Xi @ W[:, cols].to(d)).reshape(t, h, e).transpose(0, 1) for W in (Wq, Wk, Wv))
        A = torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(e), dim=-1) @ V
        partials.append(A.transpose(0, 1).reshape(t, h * e) @ Wo[cols].to(d))
    return reduce_from_shards(partials, devices, log)


@shortcut("check_attention_by_heads", "heads // k each, the rest to the last device",
          "as many heads as tensor_split")
def attention_by_heads_rest_last(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    k = len(devices)
    counts = [heads // k] * (k - 1) + [heads - heads // k * (k - 1)]
    return _heads_in(counts, X, Wq, Wk, Wv, Wo, heads, devices, log)


def _remainder_first(n, k):
    """Chunk sizes with the whole remainder on the first device (q + r, then q each)."""
    return [n // k + n % k] + [n // k] * (k - 1)


@shortcut("check_attention_by_heads", "heads // k each, the rest to the first device",
          "as many heads as tensor_split")
def attention_by_heads_rest_first(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    counts = _remainder_first(heads, len(devices))
    return _heads_in(counts, X, Wq, Wk, Wv, Wo, heads, devices, log)


@shortcut("check_attention_by_heads", "heads given out by torch.chunk ([3, 3, 1] for 7 on 3)",
          "as many heads as tensor_split")
def attention_by_heads_chunk(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    counts = [len(c) for c in torch.arange(heads).chunk(len(devices))]
    counts += [0] * (len(devices) - len(counts))
    return _heads_in(counts, X, Wq, Wk, Wv, Wo, heads, devices, log)


@shortcut("check_sharded_server_step", "the remainder's elements all served by device 0",
          "tensor_split's chunk j")
def sharded_server_step_rest_first(params, grads, devices, lr):
    k = len(devices)
    sizes = _remainder_first(params[0].numel(), k)
    pc, gc = [p.split(sizes) for p in params], [g.split(sizes) for g in grads]
    for j in range(k):
        pc[j][j].sub_(lr * sum(gc[i][j].to(devices[j]) for i in range(k)))
    for i in range(k):
        for j in range(k):
            if i != j:
                pc[i][j].copy_(pc[j][j])


@shortcut("check_allreduce_spread", "the remainder's elements all summed by device 0",
          "tensor_split")
def allreduce_spread_rest_first(data):
    k = len(data)
    spread_over([t.view(-1).split(_remainder_first(t.numel(), k)) for t in data])


@shortcut("check_conv_split_in_channels", "partial sums added pairwise along a tree",
          ["to cuda:2", "through another device"])
def conv_split_tree(X, W, b, devices, log=None):
    k = len(devices)
    sums = [(i, torch.nn.functional.conv2d(Xi.to(devices[i]), Wi.to(devices[i]))) for i, (Xi, Wi)
            in enumerate(zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1)))]
    while len(sums) > 1:        # 1 -> 0 and 3 -> 2, then 2 -> 0: only 4 devices show it
        sums = [(i, P + sums[j + 1][1].to(devices[i])) if j + 1 < len(sums) else (i, P)
                for j, (i, P) in enumerate(sums) if j % 2 == 0]
    return sums[0][1] + b.to(devices[0]).reshape(1, -1, 1, 1)


@shortcut("check_microbatches_for", "range(1, n): the batch size itself left out as a count",
          "is accepted too")
def microbatches_below_batch(batch_size, wanted):
    ok = [m for m in range(1, batch_size) if batch_size % m == 0]
    return min(ok, key=lambda m: (abs(m - wanted), -m))


test_case = parametrize_cases(__name__)


@pytest.mark.parametrize("case", [c for cases in CASES.values() for c in cases["shortcuts"]
                                  if c.module == __name__], ids=repr)
def test_shortcut_fails_on_every_draw(case):
    """Each shortcut above, on five more replayed draws: the case that tells it apart is in
    every call, so no draw lets it pass."""
    for seed in range(5):
        replay_seeds(seed)
        case.judge()


def test_split_by_params_tells_greedy_cuts_apart_on_nets_they_split_right(monkeypatch):
    """Drawn nets of equal layers (every draw its lowest), which a greedy cut splits as well as
    the best cut: the greedy answer still fails, on the net fixed in every call."""
    import helpers.checks.network_split as module
    monkeypatch.setattr(module, "randint", lambda g, lo, hi: lo)
    result = helpers.checks.check_split_by_params(split_by_params_greedy)
    assert result.status == "failed" and "a better cut" in result.message, result
