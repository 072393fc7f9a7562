"""The checks of which GPUs a link joins (gpus), interleaving's costs (network_split), a
data-parallel step's seconds (costs) and Part I's device exercises (checks/within_layer.py,
data_parallel.py):
worked answers pass, shortcuts of different kinds fail naming what they
skipped, other right answers pass (tests/check_cases.py)."""
import fractions
import math

import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut, worked
from torch.nn import functional as F

import helpers
from helpers import copy_to_shards, reduce_from_shards


# ---- gpus: link_between ------------------------------------------------------------------------
@worked("check_link_between")
def link_between(topo, visible, i, j):
    if visible is None:
        gpus = list(range(len(topo)))
    else:
        parsed = []
        for entry in visible.split(","):
            if not entry.strip().isdigit():
                break                       # CUDA ignores the rest
            parsed.append(int(entry))
        gpus = [] if len(set(parsed)) < len(parsed) else parsed
        gpus = gpus[:next((k for k, g in enumerate(gpus) if g >= len(topo)), len(gpus))]
    if max(i, j) >= len(gpus):
        raise ValueError(f"only {len(gpus)} GPUs are visible")
    return topo[gpus[i]][gpus[j]]


@other("check_link_between", "a dict of visible -> physical, KeyError")
def link_between_dict(topo, visible, i, j):
    entries = [str(g) for g in range(len(topo))] if visible is None else visible.split(",")
    numbers = []
    for entry in entries:
        try:
            gpu = int(entry)
        except ValueError:
            break
        if gpu < 0:
            break
        if gpu in numbers:
            return {}[i]                    # a repeat: nothing visible, KeyError
        numbers.append(gpu)
    physical = {}
    for gpu in numbers:
        if gpu >= len(topo):
            break
        physical[len(physical)] = gpu
    return topo[physical[i]][physical[j]]


@shortcut("check_link_between", "ignores a repeated index", "an index listed twice")
def link_between_keeps_repeats(topo, visible, i, j):
    entries = range(len(topo)) if visible is None else visible.split(",")
    gpus = []
    for entry in entries:
        if not str(entry).strip().isdigit() or int(entry) >= len(topo):
            break
        gpus.append(int(entry))
    return topo[gpus[i]][gpus[j]]


@shortcut("check_link_between", "stops at a missing GPU before looking for repeats",
          "an index listed twice")
def link_between_count_first(topo, visible, i, j):
    gpus = list(range(len(topo))) if visible is None else []
    for entry in [] if visible is None else visible.split(","):
        if not entry.strip().isdigit() or int(entry) >= len(topo):
            break
        if int(entry) in gpus:
            gpus = []
            break
        gpus.append(int(entry))
    if max(i, j) >= len(gpus):
        raise ValueError(f"only {len(gpus)} GPUs are visible")
    return topo[gpus[i]][gpus[j]]


@shortcut("check_link_between", "a repeat anywhere makes none visible, even after an entry "
          "that is not a number", "raised")
def link_between_repeat_anywhere(topo, visible, i, j):
    entries = [] if visible is None else [e.strip() for e in visible.split(",")]
    gpus = list(range(len(topo))) if visible is None else []
    if len(set(entries)) == len(entries):
        for entry in entries:
            if not entry.isdigit() or int(entry) >= len(topo):
                break
            gpus.append(int(entry))
    if max(i, j) >= len(gpus):
        raise ValueError(f"only {len(gpus)} GPUs are visible")
    return topo[gpus[i]][gpus[j]]


@shortcut("check_link_between", "physical numbering (ignores CUDA_VISIBLE_DEVICES)",
          "nvidia-smi numbers the physical GPUs")
def link_between_physical(topo, visible, i, j):
    return topo[i][j]


@shortcut("check_link_between", "skips an invalid entry instead of stopping",
          "up to the first invalid entry")
def link_between_skips(topo, visible, i, j):
    entries = range(len(topo)) if visible is None else visible.split(",")
    gpus = [int(e) for e in entries if str(e).strip().isdigit() and int(e) < len(topo)]
    return topo[gpus[i]][gpus[j]]


# ---- network_split: interleaved_costs ------------------------------------------------------------
@worked("check_interleaved_costs")
def interleaved_costs(p, m, v):
    return (p - 1) / (v * m + p - 1), 2 * (v * p - 1)


@other("check_interleaved_costs", "fractions, numpy")
def interleaved_costs_fractions(p, m, v):
    return fractions.Fraction(p - 1, v * m + p - 1), np.int64(2 * v * p - 2)


@shortcut("check_interleaved_costs", "counted on the check's own clock", "course's own answer")
def interleaved_costs_counted(p, m, v):
    ticks = 1 + max(helpers.interleaved_ticks(helpers.interleaved_order(p, m, v), v).values())
    return (ticks - 2 * m * v) / ticks, 2 * (v * p - 1)


@shortcut("check_interleaved_costs", "GPipe's bubble", "GPipe's (p-1)/(m+p-1)")
def interleaved_costs_gpipe(p, m, v):
    return (p - 1) / (m + p - 1), 2 * (v * p - 1)


@shortcut("check_interleaved_costs", "hand-offs of one lap", "chunk boundary")
def interleaved_costs_one_lap(p, m, v):
    return (p - 1) / (v * m + p - 1), 2 * (p - 1)


@shortcut("check_interleaved_costs", "the reference", "course's own answer")
def interleaved_costs_reference(p, m, v):
    return helpers.interleaved_bubble(p, m, v), 2 * (v * p - 1)


# ---- costs: dp_step_seconds --------------------------------------------------------------------
@worked("check_dp_step_seconds")
def dp_step_seconds(compute_s, k, comm_s):
    backward = 2 / 3 * compute_s / k
    return compute_s / k + max(0.0, comm_s - backward)


@other("check_dp_step_seconds", "max of the two, numpy")
def dp_step_seconds_max(compute_s, k, comm_s):
    forward = np.float64(compute_s / k / 3)
    return forward + np.maximum(2 * forward, comm_s)


@shortcut("check_dp_step_seconds", "no overlap", "outlasts the backward")
def dp_step_seconds_serial(compute_s, k, comm_s):
    return compute_s / k + comm_s


@shortcut("check_dp_step_seconds", "overlap not capped", "cannot make the step shorter")
def dp_step_seconds_uncapped(compute_s, k, comm_s):
    return compute_s / k + comm_s - 2 / 3 * compute_s / k


@shortcut("check_dp_step_seconds", "compute not divided", "1/k of the batch")
def dp_step_seconds_whole(compute_s, k, comm_s):
    return compute_s + max(0.0, comm_s - 2 / 3 * compute_s)


# ---- within_layer: attention_by_heads ----------------------------------------------------------
def _heads(X, Wq, Wk, Wv, Wo, e):
    t = X.shape[0]
    Q, K, V = ((X @ W).reshape(t, -1, e).transpose(0, 1) for W in (Wq, Wk, Wv))
    A = torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(e), dim=-1) @ V
    return A.transpose(0, 1).reshape(t, -1) @ Wo


@worked("check_attention_by_heads")
def attention_by_heads(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    k, t, e = len(devices), X.shape[0], Wq.shape[1] // heads
    Xs = copy_to_shards(X, devices, log)                               # f
    q, r = divmod(heads, k)
    first, partials = 0, []
    for i, (Xi, d) in enumerate(zip(Xs, devices)):
        h = q + (i < r)                       # whole heads, as tensor_split
        cols = slice(first * e, (first + h) * e)
        first += h
        Q, K, V = ((Xi @ W[:, cols].to(d)).reshape(t, h, e).transpose(0, 1)
                   for W in (Wq, Wk, Wv))                      # heads first
        A = torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(e), dim=-1) @ V
        partials.append(A.transpose(0, 1).reshape(t, h * e) @ Wo[cols].to(d))
    return reduce_from_shards(partials, devices, log)                  # g


@other("check_attention_by_heads", "index tensors per head")
def attention_by_heads_indexed(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    k, e = len(devices), Wq.shape[1] // heads
    Xs = copy_to_shards(X, devices, log)                                # f
    cols = [idx * e + torch.arange(e) for idx in torch.arange(heads)]
    partials = []
    for Xi, hs, d in zip(Xs, torch.arange(heads).tensor_split(k), devices):
        c = torch.cat([cols[h] for h in hs.tolist()])
        partials.append(_heads(Xi, Wq[:, c].to(d), Wk[:, c].to(d), Wv[:, c].to(d),
                               Wo[c].to(d), e))
    return reduce_from_shards(partials, devices, log)                   # g


@other("check_attention_by_heads", "sdpa and contiguous head ranges")
def attention_by_heads_sdpa(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    k, e, t = len(devices), Wq.shape[1] // heads, X.shape[0]
    Xs = copy_to_shards(X, devices, log)
    sizes = [len(s) for s in torch.arange(heads).tensor_split(k)]
    partials, first = [], 0
    for Xi, h, d in zip(Xs, sizes, devices):
        s = slice(first * e, (first + h) * e)
        first += h
        Q, K, V = ((Xi @ W[:, s].to(d)).reshape(t, h, e).transpose(0, 1) for W in (Wq, Wk, Wv))
        A = F.scaled_dot_product_attention(Q, K, V)
        partials.append(A.transpose(0, 1).reshape(t, h * e) @ Wo[s].to(d))
    return reduce_from_shards(partials, devices, log)


@shortcut("check_attention_by_heads", "the whole weights to every device, sliced there",
          ["received", "elements of Wq", "slice first"])
def attention_by_heads_whole_sent(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    k, e = len(devices), Wq.shape[1] // heads
    Xs = copy_to_shards(X, devices, log)
    partials, first = [], 0
    for Xi, h, d in zip(Xs, [len(s) for s in torch.arange(heads).tensor_split(k)], devices):
        s = slice(first * e, (first + h) * e)
        first += h
        partials.append(_heads(Xi, Wq.to(d)[:, s], Wk.to(d)[:, s], Wv.to(d)[:, s],
                               Wo.to(d)[s], e))
    return reduce_from_shards(partials, devices, log)


@shortcut("check_attention_by_heads", "splits the columns, not the heads", "split by whole heads")
def attention_by_heads_columns(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    k = len(devices)
    Xs = copy_to_shards(X, devices, log)
    parts = zip(Xs, Wq.tensor_split(k, 1), Wk.tensor_split(k, 1), Wv.tensor_split(k, 1),
                Wo.tensor_split(k), devices)
    partials = [_heads(Xi, q.to(d), kk.to(d), v.to(d), o.to(d), q.shape[1])   # a slice: 1 head
                for Xi, q, kk, v, o, d in parts]
    return reduce_from_shards(partials, devices, log)


@shortcut("check_attention_by_heads", "unsplit on one device", "used the columns of all")
def attention_by_heads_unsplit(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    return _heads(X, Wq, Wk, Wv, Wo, Wq.shape[1] // heads)


@shortcut("check_attention_by_heads", "no f: X copied plainly", "copy_to_shards (f)")
def attention_by_heads_no_f(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    k, e = len(devices), Wq.shape[1] // heads
    partials, first = [], 0
    for h, d in zip([len(s) for s in torch.arange(heads).tensor_split(k)], devices):
        s = slice(first * e, (first + h) * e)
        first += h
        partials.append(_heads(X.to(d), Wq[:, s].to(d), Wk[:, s].to(d), Wv[:, s].to(d),
                               Wo[s].to(d), e))
    return reduce_from_shards(partials, devices, log)


# ---- data_parallel: sharded_server_step ----------------------------------------------------------
@worked("check_sharded_server_step")
def sharded_server_step(params, grads, devices, lr):
    k = len(devices)
    p_chunks = [p.tensor_split(k) for p in params]
    g_chunks = [g.tensor_split(k) for g in grads]
    for j in range(k):                       # server j: push, sum, update
        total = sum(g_chunks[i][j].to(devices[j]) for i in range(k))
        p_chunks[j][j].sub_(lr * total)
    for i in range(k):                       # pull
        for j in range(k):
            if i != j:
                p_chunks[i][j].copy_(p_chunks[j][j])


@other("check_sharded_server_step", "stacked sum into a buffer, add_ with alpha")
def sharded_server_step_stacked(params, grads, devices, lr):
    k = len(devices)
    for j, d in enumerate(devices):
        pushed = torch.stack([g.tensor_split(k)[j].to(d) for g in grads]).sum(0)
        params[j].tensor_split(k)[j].add_(pushed, alpha=-lr)
    for i, p in enumerate(params):
        for j in range(k):
            if j != i:
                p.tensor_split(k)[j].copy_(params[j].tensor_split(k)[j])


@shortcut("check_sharded_server_step", "all-reduce, then every device updates",
          "the update is the server's")
def sharded_server_step_allreduce(params, grads, devices, lr):
    helpers.allreduce(grads)
    for p, g in zip(params, grads):
        p.sub_(lr * g)


@shortcut("check_sharded_server_step", "one server for everything",
          "never pulled parameters from device")
def sharded_server_step_one_server(params, grads, devices, lr):
    total = sum(g.to(devices[0]) for g in grads)
    params[0].sub_(lr * total)
    for p in params[1:]:
        p.copy_(params[0])


@shortcut("check_sharded_server_step", "whole gradients pushed, whole parameters pulled",
          ["received", "not whole tensors"])
def sharded_server_step_whole_moves(params, grads, devices, lr):
    k = len(devices)
    for j, d in enumerate(devices):
        total = sum(g.to(d).tensor_split(k)[j] for g in grads)
        params[j].tensor_split(k)[j].sub_(lr * total)
    for i, d in enumerate(devices):
        for j in range(k):
            if j != i:
                params[i].tensor_split(k)[j].copy_(params[j].to(d).tensor_split(k)[j])


@shortcut("check_sharded_server_step", "rebinds the replicas", "in place")
def sharded_server_step_rebind(params, grads, devices, lr):
    total = sum(g.to(devices[0]) for g in grads)
    new = params[0] - lr * total
    for i, d in enumerate(devices):
        params[i] = new.to(d)


# ---- data_parallel: accumulated_step -------------------------------------------------------
@worked("check_accumulated_step")
def accumulated_step(net, params, X, y, num_micro, lr):
    for X_m, y_m in zip(X.tensor_split(num_micro), y.tensor_split(num_micro)):
        helpers.loss(net(X_m, params), y_m).sum().backward()   # .grad adds up
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad / X.shape[0]
            p.grad = None


@other("check_accumulated_step", "autograd.grad, summed by hand, mean losses weighted")
def accumulated_step_grad(net, params, X, y, num_micro, lr):
    total = [torch.zeros_like(p) for p in params]
    for X_m, y_m in zip(X.tensor_split(num_micro), y.tensor_split(num_micro)):
        l = helpers.loss(net(X_m, params), y_m).mean() * len(y_m) / len(y)
        for t, g in zip(total, torch.autograd.grad(l, params)):
            t += g
    with torch.no_grad():
        for p, t in zip(params, total):
            p.sub_(lr * t)


@shortcut("check_accumulated_step", "the whole batch at once", "one call")
def accumulated_step_whole(net, params, X, y, num_micro, lr):
    helpers.loss(net(X, params), y).mean().backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad


@shortcut("check_accumulated_step", "zeroes .grad between micro-batches", "do not zero it")
def accumulated_step_zeroed(net, params, X, y, num_micro, lr):
    for X_m, y_m in zip(X.tensor_split(num_micro), y.tensor_split(num_micro)):
        for p in params:
            p.grad = None
        helpers.loss(net(X_m, params), y_m).sum().backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad / X.shape[0]


@shortcut("check_accumulated_step", "averages the micro-batches' means", "divide by the whole")
def accumulated_step_mean_of_means(net, params, X, y, num_micro, lr):
    for X_m, y_m in zip(X.tensor_split(num_micro), y.tensor_split(num_micro)):
        (helpers.loss(net(X_m, params), y_m).mean() / num_micro).backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad


test_case = parametrize_cases(__name__)
