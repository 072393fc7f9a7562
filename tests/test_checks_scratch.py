"""The Part II exercise checks (helpers/checks/scratch.py): worked answers, shortcuts of
different kinds (known cheats included), other right answers (tests/check_cases.py)."""
import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut, worked

import helpers
from helpers import get_params, split_batch


# ---- shard_sizes -------------------------------------------------------------------------------
@worked("check_shard_sizes")
def shard_sizes(n, k):
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


@other("check_shard_sizes", "one row at a time, numpy ints (agreeing with split_batch)")
def shard_sizes_dealt(n, k):
    sizes = [np.int64(0)] * k
    for i in range(n):
        sizes[i % k] += 1
    return sizes


@other("check_shard_sizes", "a tuple of floats")
def shard_sizes_floats(n, k):
    return tuple(float(n // k + (i < n % k)) for i in range(k))


@shortcut("check_shard_sizes", "measures a split", "with arithmetic")
def shard_sizes_measured(n, k):
    return [len(s) for s in torch.arange(n).tensor_split(k)]


@shortcut("check_shard_sizes", "the reference", "course's own answer")
def shard_sizes_split_batch(n, k):
    X = torch.zeros(n, 1)
    return [len(s) for s in split_batch(X, X, [torch.device("cpu")] * k)[0]]


@shortcut("check_shard_sizes", "torch.chunk's sizes", "expected")
def shard_sizes_chunk(n, k):
    q = -(-n // k) if n else 0
    return [max(0, min(q, n - i * q)) for i in range(k)]


@shortcut("check_shard_sizes", "raises for n < k (the old policy)", "leaves the last")
def shard_sizes_raises(n, k):
    if n < k:
        raise ValueError("fewer examples than devices")
    return shard_sizes(n, k)


@shortcut("check_shard_sizes", "smaller shards first", "larger shards first")
def shard_sizes_small_first(n, k):
    return sorted(shard_sizes(n, k))


# ---- allreduce_spread --------------------------------------------------------------------------
@worked("check_allreduce_spread")
def allreduce_spread(data):
    k = len(data)
    chunks = [t.view(-1).tensor_split(k) for t in data]
    for i in range(k):
        owner = chunks[i][i]
        for j in range(k):
            if j != i:
                owner.add_(chunks[j][i].to(owner.device))
    for i in range(k):
        for j in range(k):
            if j != i:
                chunks[j][i].copy_(chunks[i][i])


@other("check_allreduce_spread", "a ring: pass chunks to the next device")
def allreduce_ring(data):
    k = len(data)
    chunks = [t.view(-1).tensor_split(k) for t in data]
    for step in range(k - 1):
        for i in range(k):
            c, dst = (i - step) % k, (i + 1) % k
            chunks[dst][c].add_(chunks[i][c].to(chunks[dst][c].device))
    for step in range(k - 1):
        for i in range(k):
            c, dst = (i + 1 - step) % k, (i + 1) % k
            chunks[dst][c].copy_(chunks[i][c])


@shortcut("check_allreduce_spread", "Part II's funnel", "spread them")
def allreduce_funnel(data):
    helpers.allreduce(data)


@shortcut("check_allreduce_spread", "stack and sum", "raises on real GPUs")
def allreduce_stack(data):
    total = torch.stack(data).sum(0)
    for t in data:
        t.copy_(total)


@shortcut("check_allreduce_spread", "an op outside a list of additions (a bypass)",
          "additions")
def allreduce_matmul(data):
    home = data[0].device
    flat = torch.stack([t.reshape(-1).to(home) for t in data])   # (k, n) on device 0
    total = (torch.ones(1, len(data), device=home) @ flat).reshape(data[0].shape)
    for t in data:
        t.copy_(total)


@shortcut("check_allreduce_spread", "rebinds the list", "in place")
def allreduce_rebind(data):
    total = sum(t.to(data[0].device) for t in data)
    for i in range(len(data)):
        data[i] = total.to(data[i].device)


@shortcut("check_allreduce_spread", "a 2-D tensor cut by rows (shares unequal by a row)",
          "t.view(-1).tensor_split(k), not of its rows")
def allreduce_spread_rows(data):
    k = len(data)
    chunks = [t.tensor_split(k) for t in data]
    for i in range(k):
        for j in range(k):
            if j != i:
                chunks[i][i].add_(chunks[j][i].to(data[i].device))
    for i in range(k):
        for j in range(k):
            if j != i:
                chunks[j][i].copy_(chunks[i][i])


@other("check_allreduce_spread", "own.add_(sum(others)): Python's sum() starts from 0")
def allreduce_sum_from_zero(data):
    k = len(data)
    chunks = [t.view(-1).tensor_split(k) for t in data]
    for i in range(k):
        own = chunks[i][i]
        own.add_(sum(chunks[j][i].to(own.device) for j in range(k) if j != i))
    for i in range(k):
        for j in range(k):
            if j != i:
                chunks[j][i].copy_(chunks[i][i])


@other("check_allreduce_spread", "each sum starts from a tensor of zeros (zeros + g is a copy)")
def allreduce_sum_from_zeros(data):
    k = len(data)
    chunks = [t.view(-1).tensor_split(k) for t in data]
    for i in range(k):
        own = chunks[i][i]
        own.add_(sum((chunks[j][i].to(own.device) for j in range(k) if j != i),
                     torch.zeros_like(own)))
    for i in range(k):
        for j in range(k):
            if j != i:
                chunks[j][i].copy_(chunks[i][i])


def test_the_exercise_says_the_tensor_is_flattened():
    """The check counts chunks of the flattened tensor: the exercise's text says so."""
    import json
    import pathlib
    nb = pathlib.Path(__file__).resolve().parent.parent / "book" / "part2" / "scratch.ipynb"
    cells = ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"]
             if c["cell_type"] == "markdown"]
    text = next(c for c in cells if "allreduce_spread(data)" in c)
    assert "t.view(-1).tensor_split(len(data))" in text


# ---- evaluate_accuracy_multi -------------------------------------------------------------------
@worked("check_evaluate_accuracy_multi")
def evaluate_accuracy_multi(net, params, data_iter, devices):
    replicas = [get_params(params, d) for d in devices]
    correct = [torch.zeros((), device=d) for d in devices]
    total = 0
    with torch.no_grad():
        for X, y in data_iter:
            X_shards, y_shards = split_batch(X, y, devices)
            for i, (W, X_s, y_s) in enumerate(zip(replicas, X_shards, y_shards)):
                correct[i] += (net(X_s, W).argmax(dim=1) == y_s).sum()
            total += y.numel()
    return sum(c.item() for c in correct) / total


@other("check_evaluate_accuracy_multi", "counts as Python ints, shards by tensor_split")
def evaluate_accuracy_multi_ints(net, params, data_iter, devices):
    replicas = [[p.detach().to(d, copy=True) for p in params] for d in devices]
    correct = total = 0
    for X, y in data_iter:
        for W, X_s, y_s, d in zip(replicas, X.tensor_split(len(devices)),
                                  y.tensor_split(len(devices)), devices):
            with torch.no_grad():
                correct += int((net(X_s.to(d), W).argmax(1) == y_s.to(d)).sum())
        total += len(y)
    return correct / total


@other("check_evaluate_accuracy_multi", "each replica's shard in a thread pool's map")
def evaluate_accuracy_multi_pool(net, params, data_iter, devices):
    from concurrent.futures import ThreadPoolExecutor
    replicas = [get_params(params, d) for d in devices]
    correct = total = 0

    def count(W, X_s, y_s):
        with torch.no_grad():
            return (net(X_s, W).argmax(dim=1) == y_s).sum().item()
    with ThreadPoolExecutor(len(devices)) as pool:
        for X, y in data_iter:
            correct += sum(pool.map(count, replicas, *split_batch(X, y, devices)))
            total += y.numel()
    return correct / total


@shortcut("check_evaluate_accuracy_multi", "nothing split", "whole batches")
def evaluate_accuracy_unsplit(net, params, data_iter, devices):
    correct = total = 0
    for X, y in data_iter:
        correct += (net(X, params).argmax(1) == y).sum().item()
        total += len(y)
    return correct / total


@shortcut("check_evaluate_accuracy_multi", "the original parameters", "original")
def evaluate_accuracy_original_params(net, params, data_iter, devices):
    correct = total = 0
    for X, y in data_iter:
        for X_s, y_s in zip(*split_batch(X, y, devices)):
            correct += (net(X_s, params).argmax(1) == y_s).sum().item()
        total += len(y)
    return correct / total


@shortcut("check_evaluate_accuracy_multi", "no device moves", "evaluated nothing")
def evaluate_accuracy_no_moves(net, params, data_iter, devices):
    replicas = [[p.detach().clone() for p in params] for _ in devices]
    correct = total = 0
    for X, y in data_iter:
        for W, X_s, y_s in zip(replicas, X.tensor_split(len(devices)),
                               y.tensor_split(len(devices))):
            correct += (net(X_s, W).argmax(1) == y_s).sum().item()
        total += len(y)
    return correct / total


test_case = parametrize_cases(__name__)
