"""Part I: what each of the three splits costs per training step, from a real model's sizes.

Sizes are measured, not typed: parameters by counting, activations as the tensors autograd saves
for backward (torch.autograd.graph.saved_tensors_hooks). The model is an nn.Sequential (LeNet and
ResNet-18 of helpers.models are).
"""
import copy
import functools
import math

import torch
from torch import nn

__all__ = ["SPLITS", "layer_sizes", "saved_per_layer", "balanced_cuts", "ring_allreduce_bytes",
           "split_costs", "plot_costs", "OPTIMIZER_STATE_BYTES", "SHARDING_STAGES",
           "sharding_costs", "ZERO_ROWS", "RECOMPUTE", "activation_bytes_per_token",
           "block_params", "ring_attention_bytes", "moe_dispatch_bytes", "train_flops_per_token"]

SPLITS = ("data", "network", "within layer")
ZERO_ROWS = ("ZeRO-1", "ZeRO-2", "ZeRO-3")


def saved_per_layer(net, X):
    """Bytes of the tensors autograd saves for backward while each top-level layer of `net` runs
    on X: every storage counted once (a view such as Flatten's output adds nothing), the
    parameters left out. Works on the meta device too (no memory is used there)."""
    params = {id(q) for q in net.parameters()}
    param_ptrs = {q.untyped_storage().data_ptr() for q in net.parameters()
                  if q.device.type != "meta"}
    seen, keep, per_layer, current = set(), [], [0] * len(net), [0]

    def pack(t):
        if t.device.type == "meta":   # no storage address: the tensor a view was taken of
            base = t._base if t._base is not None else t
            key, is_param = ("meta", id(base)), id(base) in params
        else:
            key = t.untyped_storage().data_ptr()
            is_param = key in param_ptrs
        if not is_param and key not in seen:
            seen.add(key)
            keep.append(t)            # keeps the id from being reused while we count
            per_layer[current[0]] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        h = X
        for i, layer in enumerate(net):
            current[0] = i
            h = layer(h)
    return per_layer


def layer_sizes(net, input_shape):
    """One dict per top-level layer of `net`: its parameters, its output size per example
    (what a network split sends on), the activations autograd saves for its backward per example
    (in float32 values: saved bytes / 4, measured as the difference between batches of 4 and 2,
    in training mode on a copy of net), and (inputs, outputs) per example of each conv or dense
    layer inside it (what a within-layer split exchanges)."""
    children, rows, hooks = list(net), [], []
    for child in children:
        rows.append(dict(name=type(child).__name__,
                         params=sum(p.numel() for p in child.parameters()),
                         out=0, acts=0, weighted=[]))

    def on_child(i, module, inputs, output):
        rows[i]["out"] = output[0].numel()

    def on_leaf(i, module, inputs, output):
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            rows[i]["weighted"].append((inputs[0][0].numel(), output[0].numel()))

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
    for row, a, b in zip(rows, two, four):
        row["acts"] = round((b - a) / 2 / 4)
    return rows


def balanced_cuts(weights, k):
    """Cut points that split `weights` into k contiguous, non-empty groups whose largest sum is as
    small as possible (how a network split places layers on devices)."""
    n = len(weights)
    if not 1 <= k <= n:
        raise ValueError(f"cannot place {n} layers on {k} devices: use 1 to {n} devices")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)

    @functools.lru_cache(maxsize=None)
    def best(i, parts):   # (largest group sum, cuts) for weights[i:] in `parts` groups
        if parts == 1:
            return prefix[n] - prefix[i], ()
        return min((max(prefix[j] - prefix[i], best(j, parts - 1)[0]), (j, *best(j, parts - 1)[1]))
                   for j in range(i + 1, n - parts + 2))

    return list(best(0, k)[1])


def ring_allreduce_bytes(nbytes, k):
    """Bytes each of k devices sends in a ring all-reduce of `nbytes`: 2 (k-1)/k of them."""
    return 2 * (k - 1) / k * nbytes


def split_costs(sizes, k, batch_size, bandwidth_gbs, num_microbatches=1, bytes_per_value=4,
                optimizer="sgd", latency_us=0.0, zero=False):
    """Per training step, for each split in SPLITS (and ZERO_ROWS when zero=True): the bytes the
    busiest device sends, the memory of the fullest device (params, grads, optimizer state,
    activations, in bytes), the collectives and the point-to-point hand-offs of the step, the
    messages the busiest device sends, and the seconds its sending takes in the alpha-beta model:
    messages * latency_us + bytes / bandwidth_gbs.

    data: every device holds the model, its optimizer state and 1/k of the batch; one ring
      all-reduce of the gradients (2(k-1) messages per device).
    network: contiguous layers per device (balanced by memory), the whole batch passes through
      each; the activation at each cut goes forward, its gradient back, once per micro-batch.
    within layer: every conv/dense layer is split k ways by output channels/units; its outputs
      are all-gathered after it (forward), its input gradients all-reduced (backward); each
      device keeps the gathered, full activations.
    ZeRO-1/2/3: data parallelism with the optimizer state, then the gradients, then the
      parameters sharded k ways (sharding_costs); ZeRO-3 gathers each layer's parameters for its
      forward and again for its backward.
    """
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer must be one of {tuple(OPTIMIZER_STATE_BYTES)}, "
                         f"not {optimizer!r}")
    b, n, m = bytes_per_value, batch_size, num_microbatches
    ob = OPTIMIZER_STATE_BYTES[optimizer]
    P = sum(r["params"] for r in sizes)
    A = sum(r["acts"] for r in sizes)
    costs = {}

    shard = -(-n // k)    # the largest shard of the batch
    costs["data"] = dict(sent=ring_allreduce_bytes(P * b, k), params=P * b, grads=P * b,
                         optim=P * ob, acts=shard * A * b, collectives=int(k > 1), handoffs=0,
                         messages=2 * (k - 1))

    weights = [(2 * b + ob) * r["params"] + n * b * r["acts"] for r in sizes]
    bounds = [0, *balanced_cuts(weights, k), len(sizes)]
    stages = [sizes[a:c] for a, c in zip(bounds, bounds[1:])]
    per_device = []
    for s, stage in enumerate(stages):
        p = sum(r["params"] for r in stage)
        out = n * stage[-1]["out"] * b if s < k - 1 else 0                  # activations forward
        back = n * sizes[bounds[s] - 1]["out"] * b if s > 0 else 0         # gradients back
        per_device.append(dict(sent=out + back, params=p * b, grads=p * b, optim=p * ob,
                               acts=n * sum(r["acts"] for r in stage) * b,
                               messages=m * ((s < k - 1) + (s > 0))))
    fullest = max(per_device, key=lambda d: d["params"] + d["grads"] + d["optim"] + d["acts"])
    costs["network"] = dict(fullest, sent=max(d["sent"] for d in per_device),
                            messages=max(d["messages"] for d in per_device), collectives=0,
                            handoffs=2 * (k - 1) * m, cuts=bounds[1:-1])

    layers = [io for r in sizes for io in r["weighted"]]
    weighted = sum(r["params"] for r in sizes if r["weighted"])
    p_dev = -(-weighted // k) + (P - weighted)    # conv/dense weights split, the rest replicated
    sent = sum((k - 1) / k * n * o * b for _, o in layers)                       # all-gathers
    sent += sum(ring_allreduce_bytes(n * i * b, k) for i, _ in layers[1:])       # all-reduces
    L = len(layers) if k > 1 else 0
    costs["within layer"] = dict(sent=sent, params=p_dev * b, grads=p_dev * b, optim=p_dev * ob,
                                 acts=n * A * b, collectives=max(0, 2 * L - 1), handoffs=0,
                                 messages=(k - 1) * L + 2 * (k - 1) * max(0, L - 1))
    if zero:
        with_params = sum(1 for r in sizes if r["params"]) if k > 1 else 0
        for row, stage in zip(ZERO_ROWS, SHARDING_STAGES[1:]):
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
    return costs


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
        bottom = [a + v for a, v in zip(bottom, vals)]
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


def sharding_costs(n_params, world, stage, optimizer="adam", dtype_bytes=4):
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
    sent = passes * (k - 1) / k * n_params * dtype_bytes
    return dict(params_bytes=params, grads_bytes=grads, optim_bytes=optim,
                total_bytes=params + grads + optim, sent_bytes=sent)


# --- Part VII: a transformer's memory and traffic, per token and per layer ---------------------
RECOMPUTE = ("none", "selective", "full")


def activation_bytes_per_token(width, heads, seq, tp=1, sp=False, recompute="none",
                               dtype_bytes=4, flash=True, dropout=False, ln_stats=True):
    """Bytes one pre-norm transformer block (attention, 4x GELU MLP) keeps for backward per token,
    on one tensor-parallel rank: Korthikanti et al.'s count, term by term.

    Replicated over tp (unless sequence parallel, sp): the two layer norms' inputs and the
    outputs feeding q/k/v and the MLP (4 h). Split over tp: q, k, v (3 h), the MLP's two
    4 h-wide tensors (8 h), and the attention output (h) plus its log-sum-exp (flash: one fp32
    per head) or, without flash, the softmax (heads x seq) and the output projection's input.
    dropout adds 1-byte masks (2 h; and heads x seq with its output without flash); ln_stats two
    fp32 per layer norm. recompute "full" keeps only the block's input; "selective" recomputes
    the attention core (drops the heads x seq terms). With dtype_bytes=2, dropout, flash=False,
    ln_stats=False this is their s b h (34 + 5 a s / h) and its TP/SP/AC variants.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, not {recompute!r}")
    if width % tp or heads % tp:
        raise ValueError(f"tp={tp} must divide the width {width} and the heads {heads}")
    h, a, s, b, t = width, heads, seq, dtype_bytes, tp
    if recompute == "full":
        return h * b / (t if sp else 1)
    rep = 4 * h * b + (2 * h if dropout else 0) + (4 * 4 if ln_stats else 0)
    split = 12 * h * b
    if flash:
        split += 4 * a
    elif recompute == "none":
        split += a * s * b + ((a * s + a * s * b) if dropout else 0)
    return rep / (t if sp else 1) + split / t


def block_params(width, tp=1):
    """Parameters of one block on one tensor-parallel rank: q, k, v, the MLP's first layer and
    the weights of the two row-split layers are split (12 h^2 + 7 h over tp); the layer norms
    and the row-split layers' biases are replicated (6 h)."""
    return (12 * width * width + 7 * width) // tp + 6 * width


def ring_attention_bytes(tokens, width, cp, tp=1, dtype_bytes=4):
    """Bytes one rank sends per layer in ring attention over cp ranks, its `tokens` (local) with
    width / tp of K and of V: forward passes K and V on cp - 1 times; backward passes K, V and
    their gradients cp - 1 times and the gradients home once more."""
    block = tokens * width // tp * dtype_bytes
    return 0 if cp == 1 else (2 * (cp - 1) + 4 * (cp - 1) + 2) * block


def moe_dispatch_bytes(tokens, width, n_experts, k, capacity_factor, ep, dtype_bytes=4):
    """Bytes one rank's all-to-alls send per MoE layer and step (dispatch and combine, forward
    and backward) with fixed buffers: n_experts x capacity rows of `width`, all but its own
    experts' share leaving the rank. capacity = ceil(factor x tokens x k / n_experts)."""
    capacity = math.ceil(capacity_factor * tokens * k / n_experts)
    return 4 * (n_experts - n_experts // ep) * capacity * width * dtype_bytes


def train_flops_per_token(n_params, layers, width, seq, recompute="none"):
    """FLOPs of one training token: 6 per parameter (2 forward, 4 backward) plus attention's
    scores and weighted sum (12 x layers x width x seq); recompute adds a forward."""
    flops = 6 * n_params + 12 * layers * width * seq
    extra = {"none": 0, "selective": 4 * layers * width * seq, "full": flops / 3}
    return flops + extra[recompute]
