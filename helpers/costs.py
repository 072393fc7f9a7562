"""Part I: what each of the three splits costs per training step, from a real model's sizes.

Sizes are measured, not typed: parameters by counting, activations as the tensors autograd saves
for backward (torch.autograd.graph.saved_tensors_hooks). The model is an nn.Sequential (LeNet and
ResNet-18 of helpers.models are).
"""
import copy
import functools
from itertools import pairwise
from typing import NotRequired, TypedDict

import torch
from torch import nn

from .activations import saved_tensor_bytes

__all__ = ["SPLITS", "layer_sizes", "saved_per_layer", "balanced_cuts", "ring_pass_bytes",
           "ring_bytes_per_device", "split_costs", "plot_costs", "OPTIMIZER_STATE_BYTES",
           "SHARDING_STAGES", "sharding_costs", "ZERO_ROWS", "network_cuts", "BACKWARD_SHARE"]

SPLITS = ("data", "network", "within layer")
ZERO_ROWS = ("ZeRO-1", "ZeRO-2", "ZeRO-3")
# A step's compute: forward 2 FLOPs per multiply-add, backward twice the forward; so the backward
# is 2/3 of it (the time a gradient all-reduce can hide behind).
BACKWARD_SHARE = 2 / 3


class SplitCost(TypedDict):
    """One row of split_costs (a plain dict; the keys a notebook reads). Bytes per step on the
    busiest / fullest device; seconds of its sending in the alpha-beta model."""
    sent: float                  # bytes the busiest device sends
    params: float                # bytes of the fullest device's memory, by kind
    grads: float
    optim: float
    acts: float
    memory: float                # their sum
    collectives: int             # collectives in a step
    handoffs: int                # point-to-point hand-offs in a step
    messages: int                # messages the busiest device sends
    seconds_latency: float       # messages * latency
    seconds_bandwidth: float     # sent / bandwidth
    seconds: float               # their sum
    cuts: NotRequired[list[int]]            # network: the layers each stage starts at
    microbatches: NotRequired[int]          # network
    seconds_compute: NotRequired[float]     # with tflops=
    seconds_exposed: NotRequired[float]
    seconds_step: NotRequired[float]


class ShardingCost(TypedDict):
    """sharding_costs' result (a plain dict): bytes per rank, held and sent per step."""
    params_bytes: float
    grads_bytes: float
    optim_bytes: float
    total_bytes: float
    sent_bytes: float


def saved_per_layer(net, X):
    """Bytes of the tensors autograd saves for backward while each top-level layer of `net` runs
    on X (activations.saved_tensor_bytes, the course's one measure): every storage counted
    once, in the first layer that saves it (a view such as Flatten's output adds nothing), the
    parameters left out. Works on the meta device too (no memory is used there)."""
    seen, per_layer, h = {}, [], X
    for layer in net:
        n, h = saved_tensor_bytes(layer, h, params=net.parameters(), seen=seen)
        per_layer.append(n)
    return per_layer


def layer_sizes(net, input_shape):
    """One dict per top-level layer of `net`: its parameters, its output size per example
    (what a network split sends on), the activations autograd saves for its backward per example
    (in float32 values: saved bytes / 4, measured as the difference between batches of 4 and 2,
    in training mode on a copy of net), and (inputs, outputs) per example of each conv or dense
    layer inside it (what a within-layer split exchanges), and its multiply-adds per example
    (`macs`: convolutions and dense layers; the compute the step-time model divides)."""
    children, rows, hooks = list(net), [], []
    for child in children:
        rows.append(dict(name=type(child).__name__,
                         params=sum(p.numel() for p in child.parameters()),
                         out=0, acts=0, weighted=[], macs=0))

    def on_child(i, module, inputs, output):
        rows[i]["out"] = output[0].numel()

    def on_leaf(i, module, inputs, output):
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            rows[i]["weighted"].append((inputs[0][0].numel(), output[0].numel()))
            fan_in = (module.in_features if isinstance(module, nn.Linear) else
                      module.in_channels // module.groups * module.weight[0, 0].numel())
            rows[i]["macs"] += output[0].numel() * fan_in

    for i, child in enumerate(children):
        hooks.append(child.register_forward_hook(functools.partial(on_child, i)))
        leaves = [m for m in child.modules() if not list(m.children())]
        for leaf in leaves:
            hooks.append(leaf.register_forward_hook(functools.partial(on_leaf, i)))
    device = next(net.parameters()).device
    was_training = net.training
    try:
        net.eval()
        with torch.no_grad():   # one example is enough: we record sizes per example
            net(torch.zeros((1, *input_shape), device=device))
    finally:
        net.train(was_training)
        for h in hooks:
            h.remove()
    twin = copy.deepcopy(net).train()    # training mode (BatchNorm saves what it uses), own buffers
    two, four = (saved_per_layer(twin, torch.zeros((n, *input_shape), device=device))
                 for n in (2, 4))
    for row, a, b in zip(rows, two, four, strict=True):
        row["acts"] = round((b - a) / 2 / 4)
    return rows


def balanced_cuts(weights, k):
    """Cut points that split `weights` (any iterable: per-layer parameters, seconds, ...) into k
    contiguous, non-empty groups whose largest sum is as small as possible (how a network split
    places layers on devices)."""
    weights = list(weights)
    n = len(weights)
    if not 1 <= k <= n:
        raise ValueError(f"cannot place {n} layers on {k} devices: use 1 to {n} devices")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)

    @functools.cache
    def best(i, parts):   # (largest group sum, cuts) for weights[i:] in `parts` groups
        if parts == 1:
            return prefix[n] - prefix[i], ()
        return min((max(prefix[j] - prefix[i], best(j, parts - 1)[0]), (j, *best(j, parts - 1)[1]))
                   for j in range(i + 1, n - parts + 2))

    return list(best(0, k)[1])


def network_cuts(memory, sent, k):
    """Where a network split cuts: among the placements of the layers on k devices (contiguous,
    none empty) whose fullest device holds the least (`memory[i]`: bytes of layer i, or any other
    weight to balance, such as its multiply-adds), the one whose busiest device sends the least;
    `sent[i]`: bytes that cross a cut right after layer i (its
    output forward, the gradient back). A cut before a lone ReLU balances memory as well as a
    cut after it, and sends a large activation twice: the second criterion avoids it."""
    n = len(memory)
    if not 1 <= k <= n:
        raise ValueError(f"cannot place {n} layers on {k} devices: use 1 to {n} devices")
    if k == 1:
        return []
    bounds = [0, *balanced_cuts(memory, k), n]
    fullest = max(sum(memory[a:b]) for a, b in pairwise(bounds))
    prefix = [0]
    for w in memory:
        prefix.append(prefix[-1] + w)

    @functools.cache
    def best(i, parts):   # (max bytes a device sends, cuts) for layers i.. in `parts` stages
        if parts == 1:
            if prefix[n] - prefix[i] > fullest:
                return float("inf"), ()
            return (sent[i - 1] if i > 0 else 0), ()
        options = []
        for j in range(i + 1, n - parts + 2):
            if prefix[j] - prefix[i] > fullest:
                break
            rest = best(j, parts - 1)
            if rest[0] == float("inf"):
                continue
            here = (sent[i - 1] if i > 0 else 0) + sent[j - 1]
            options.append((max(here, rest[0]), (j, *rest[1])))
        return min(options) if options else (float("inf"), ())

    return list(best(0, k)[1])


def ring_bytes_per_device(nbytes, k):
    """Bytes each of k devices sends in a ring all-reduce of `nbytes`: 2 (k-1)/k of them
    (reduce-scatter, then all-gather). THE ring volume (within_layer.ipynb builds it): every
    cost and count uses this one, or its half, ring_pass_bytes."""
    if k < 1:
        raise ValueError(f"k must be at least 1 device, got {k}")
    return 2 * (k - 1) / k * nbytes


def ring_pass_bytes(nbytes, k):
    """Bytes each of k devices sends in one pass around a ring over `nbytes` (a reduce-scatter,
    or an all-gather of the whole): half of the all-reduce's ring_bytes_per_device."""
    return ring_bytes_per_device(nbytes, k) / 2



def split_costs(sizes, k, batch_size, bandwidth_gbs, num_microbatches=1, bytes_per_value=4,
                optimizer="sgd", latency_us=0.0, zero=False, tflops=None
                ) -> dict[str, SplitCost]:
    """Per training step, the cost of each split in SPLITS (and ZERO_ROWS when zero=True): the
    busiest device's bytes, messages and sending seconds (alpha-beta), the fullest device's memory,
    the collectives and hand-offs; with `tflops`, the step's seconds too."""
    # data: every device holds the model, its optimizer state and 1/k of the batch; one ring
    #   all-reduce of the gradients (2(k-1) messages per device).
    # network: contiguous layers per device (network_cuts: the fullest device as small as it can
    #   be, then the busiest sender), the whole batch passes through each; the activation at each
    #   cut goes forward, its gradient back, once per micro-batch.
    # within layer: every conv/dense layer is split k ways by output channels/units; its outputs
    #   are all-gathered right after it (forward), before any ReLU or pooling that follows (the
    #   within_layer chapter's gather-first variant); backward, each layer's input gradient is
    #   reduce-scattered (the adjoint of the all-gather: a device needs only its own channels'
    #   slice, and the ReLU and pooling act on each channel alone); each device keeps the
    #   gathered, full activations.
    # ZeRO-1/2/3: data parallelism with the optimizer state, then the gradients, then the
    #   parameters sharded k ways (sharding_costs); ZeRO-3 gathers each layer's parameters for its
    #   forward and again for its backward.
    #
    # With `tflops` (a device's speed, in 10^12 FLOP/s) each row also gets the seconds of a step:
    # `seconds_compute` (6 FLOPs per multiply-add per example, divided as the split divides it),
    # `seconds_exposed` (the communication that does not overlap with compute) and
    # `seconds_step`, their sum. data, ZeRO-1/2: the all-reduce can hide behind the backward (2/3
    # of the compute), at best: the last bucket is ready only when the backward ends, so a real
    # step exposes at least its all-reduce (`helpers.bucket_timeline` lays the buckets
    # out); ZeRO-3 behind the whole step (prefetched gathers); within layer: none (every
    # collective sits between two layers); network: GPipe over the stages' compute
    # (((m-1) max + sum) / m), exposed: one micro-batch's hand-offs through every cut and back.
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer must be one of {tuple(OPTIMIZER_STATE_BYTES)}, "
                         f"not {optimizer!r}")
    b, n, m = bytes_per_value, batch_size, num_microbatches
    ob = OPTIMIZER_STATE_BYTES[optimizer]
    P = sum(r["params"] for r in sizes)
    A = sum(r["acts"] for r in sizes)
    costs = {}

    shard = -(-n // k)    # the largest shard of the batch
    costs["data"] = dict(sent=ring_bytes_per_device(P * b, k), params=P * b, grads=P * b,
                         optim=P * ob, acts=shard * A * b, collectives=int(k > 1), handoffs=0,
                         messages=2 * (k - 1))

    costs["network"], stages = _network_costs(sizes, k, n, m, b, ob)

    layers = [io for r in sizes for io in r["weighted"]]
    weighted = sum(r["params"] for r in sizes if r["weighted"])
    p_dev = -(-weighted // k) + (P - weighted)    # conv/dense weights split, the rest replicated
    sent = sum(ring_pass_bytes(n * o * b, k) for _, o in layers)                  # all-gathers
    sent += sum(ring_pass_bytes(n * i * b, k) for i, _ in layers[1:])          # reduce-scatters
    L = len(layers) if k > 1 else 0
    costs["within layer"] = dict(sent=sent, params=p_dev * b, grads=p_dev * b, optim=p_dev * ob,
                                 acts=n * A * b, collectives=max(0, 2 * L - 1), handoffs=0,
                                 messages=(k - 1) * (2 * L - 1) if L else 0)
    if zero:
        with_params = sum(1 for r in sizes if r["params"]) if k > 1 else 0
        for row, stage in zip(ZERO_ROWS, SHARDING_STAGES[1:], strict=True):
            z = sharding_costs(P, k, stage, optimizer, b)
            coll = 3 * with_params if stage == "zero3" else 2 * int(k > 1)
            costs[row] = dict(sent=z["sent_bytes"], params=z["params_bytes"],
                              grads=z["grads_bytes"], optim=z["optim_bytes"], acts=shard * A * b,
                              collectives=coll, handoffs=0, messages=coll * (k - 1))
    for c in costs.values():
        c["memory"] = c["params"] + c["grads"] + c["optim"] + c["acts"]
        c["seconds_latency"] = c["messages"] * latency_us * 1e-6
        c["seconds_bandwidth"] = c["sent"] / (bandwidth_gbs * 1e9)
        c["seconds"] = c["seconds_latency"] + c["seconds_bandwidth"]
    if tflops is not None:
        _step_seconds(costs, sizes, stages, k, n, m, b, tflops, latency_us, bandwidth_gbs)
    return costs


def _network_costs(sizes, k, n, m, b, ob):
    """split_costs' network row (contiguous layers per device, network_cuts), and the stages."""
    weights = [(2 * b + ob) * r["params"] + n * b * r["acts"] for r in sizes]
    crossing = [2 * n * r["out"] * b for r in sizes]     # a cut after layer i: forward and back
    bounds = [0, *network_cuts(weights, crossing, k), len(sizes)]
    stages = [sizes[a:c] for a, c in pairwise(bounds)]
    per_device = []
    for s, stage in enumerate(stages):
        p = sum(r["params"] for r in stage)
        out = n * stage[-1]["out"] * b if s < k - 1 else 0                  # activations forward
        back = n * sizes[bounds[s] - 1]["out"] * b if s > 0 else 0         # gradients back
        per_device.append(dict(sent=out + back, params=p * b, grads=p * b, optim=p * ob,
                               acts=n * sum(r["acts"] for r in stage) * b,
                               messages=m * ((s < k - 1) + (s > 0))))
    fullest = max(per_device, key=lambda d: d["params"] + d["grads"] + d["optim"] + d["acts"])
    row = dict(fullest, sent=max(d["sent"] for d in per_device),
               messages=max(d["messages"] for d in per_device), collectives=0,
               handoffs=2 * (k - 1) * m, cuts=bounds[1:-1], microbatches=m)
    return row, stages


def _step_seconds(costs, sizes, stages, k, n, m, b, tflops, latency_us, bandwidth_gbs):
    """Adds seconds_compute, seconds_exposed and seconds_step to every row (see split_costs)."""
    if not tflops > 0:
        raise ValueError(f"tflops must be > 0 (a device's speed in 10^12 FLOP/s), got {tflops!r}")
    rate = tflops * 1e12
    whole = 6 * n * sum(r["macs"] for r in sizes) / rate       # the step on one device
    for name, c in costs.items():
        if name == "network":
            per_stage = [6 * n * sum(r["macs"] for r in st) / rate for st in stages]
            compute = ((m - 1) * max(per_stage) + sum(per_stage)) / m
            cuts = [st[-1]["out"] for st in stages[:-1]]
            exposed = sum(2 * (latency_us * 1e-6 + n / m * o * b / (bandwidth_gbs * 1e9))
                          for o in cuts)
        else:
            compute = whole / k
            hide = {"within layer": 0.0, "ZeRO-3": compute}.get(name, BACKWARD_SHARE * compute)
            exposed = max(0.0, c["seconds"] - hide)
        c["seconds_compute"], c["seconds_exposed"] = compute, exposed
        c["seconds_step"] = compute + exposed


def plot_costs(costs, axes=None, title=None):
    """Three bar charts of split_costs' result: MB sent, memory (stacked), messages sent."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(10, 3), layout="constrained")
    names = list(costs)
    MB = 1e6
    axes[0].bar(names, [costs[s]["sent"] / MB for s in names], color="tab:red")
    axes[0].set(ylabel="MB sent per device", title="communication")
    bottom = [0.0] * len(names)
    parts = (("params", "tab:blue"), ("grads", "tab:cyan"), ("optim", "tab:olive"),
             ("acts", "tab:green"))
    for part, color in parts:
        vals = [costs[s][part] / MB for s in names]
        axes[1].bar(names, vals, bottom=bottom, color=color, label=part)
        bottom = [a + v for a, v in zip(bottom, vals, strict=True)]
    axes[1].set(ylabel="MB on the fullest device", title="memory")
    axes[1].legend(fontsize=8)
    axes[2].bar(names, [costs[s]["messages"] for s in names], color="tab:purple")
    axes[2].set(ylabel="per step", title="messages the busiest device sends")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8, labelrotation=30 if len(names) > 3 else 0)
    if title:
        axes[0].figure.suptitle(title)
    return axes


# Bytes of optimizer state per parameter: plain SGD keeps none, momentum one fp32 buffer, Adam two
# (exp_avg, exp_avg_sq); mixed-precision Adam also keeps an fp32 master copy (4 + 4 + 4 = 12,
# and its bf16/fp16 weights and gradients are counted at dtype_bytes=2).
OPTIMIZER_STATE_BYTES = {"sgd": 0, "momentum": 4, "adam": 8, "mixed_adam": 12}
SHARDING_STAGES = ("dp", "zero1", "zero2", "zero3")


def sharding_costs(n_params, world, stage, optimizer="adam", dtype_bytes=4) -> ShardingCost:
    """Per rank and per step, for plain data parallelism ("dp") and ZeRO stages 1-3: the bytes of
    parameters, gradients and optimizer state each rank holds, and the bytes it sends.

    ZeRO-1 shards the optimizer state, ZeRO-2 the gradients too, ZeRO-3 the parameters too.
    Traffic: dp all-reduces the gradients (2 (k-1)/k of them, ring); ZeRO-1 and ZeRO-2
    reduce-scatter the gradients and all-gather the updated parameters, (k-1)/k each, the same
    total; ZeRO-3 all-gathers the parameters again for backward: 3 (k-1)/k.
    With optimizer="mixed_adam" the classic mixed-precision ZeRO accounting (2 + 2 + 12 bytes per
    parameter) needs dtype_bytes=2.
    """
    if stage not in SHARDING_STAGES:
        raise ValueError(f"stage must be one of {SHARDING_STAGES}, not {stage!r}")
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer must be one of {tuple(OPTIMIZER_STATE_BYTES)}, "
                         f"not {optimizer!r}")
    if int(world) != world or world < 1 or n_params < 0:
        raise ValueError(f"need world >= 1 (an integer) and n_params >= 0, got {world}, {n_params}")
    k = int(world)
    params = n_params * dtype_bytes
    grads = n_params * dtype_bytes
    optim = n_params * OPTIMIZER_STATE_BYTES[optimizer]
    level = SHARDING_STAGES.index(stage)
    if level >= 1:
        optim /= k
    if level >= 2:
        grads /= k
    if level >= 3:
        params /= k
    passes = 3 if stage == "zero3" else 2
    sent = passes * ring_pass_bytes(n_params * dtype_bytes, k)
    return ShardingCost(params_bytes=params, grads_bytes=grads, optim_bytes=optim,
                        total_bytes=params + grads + optim, sent_bytes=sent)
