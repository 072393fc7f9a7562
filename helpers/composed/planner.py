"""Part VII: a planner. Given a model, a GPU and a number of GPUs, it lists the layouts
(dp, tp, pp, cp, ep, ZeRO stage, how gradients accumulate, activation recomputation,
micro-batches) whose memory fits, with the memory per GPU and the step time of the course's
cost model (helpers.costs and helpers.transformer_costs), fastest first.

The model is the course's GPT shape: `layers` pre-norm blocks of `width` and `heads`, token and
position embeddings, an untied head; `experts` > 0 makes every MLP a top-k MoE. Per pipeline
stage the planner counts what a rank holds (parameters, gradients, optimizer state: sharded by
ZeRO over dp x cp, an expert's over the dp x cp / ep ranks that hold it; saved activations:
Korthikanti's per-token count times the micro-batches 1F1B keeps alive on that stage) and what
it sends per step along each dimension. With m micro-batches ZeRO-2 and 3 choose how gradients
accumulate, as Part V measured: reduced after every micro-batch (sharded memory, m reductions;
ZeRO-3 also gathers its parameters twice per micro-batch) or under no_sync (full gradients, and
for ZeRO-3 unsharded parameters, kept until one reduction: torch's pipelining does this).

Time: the compute at mfu of the GPU's FLOP/s, stretched by the pipeline bubble; tensor,
pipeline and expert traffic in full, each message paying the link's latency; data-parallel
traffic beyond the backward it overlaps (every micro-batch's, or under no_sync only the last
one's); and ring attention hop by hop, each hop overlapping only the attention of the block it
brings, half a block for a causal zig-zag ring (its MLP waits for it).
"""
import itertools
from typing import TypedDict

from ..costs import (
    OPTIMIZER_STATE_BYTES,
    SHARDING_STAGES,
    ShardingCost,
    ring_bytes_per_device,
    ring_pass_bytes,
    sharding_costs,
)
from ..expert_parallel.moe import MoE
from ..runtime.launch import take_kwargs
from ..transformer_costs import (
    RECOMPUTE,
    activation_bytes_per_token,
    block_params,
    moe_dispatch_bytes,
    ring_attention_bytes,
    train_flops_per_token,
)

__all__ = ["data_parallel_costs", "stage_costs", "ring_exposed_seconds", "layout_costs",
           "candidate_layouts", "plan", "DimensionBytes", "DimensionMessages", "StageCost",
           "Layout", "LayoutCost"]

_MODEL_KEYS = ("layers", "width", "heads", "vocab", "seq", "batch")
_GPU_KEYS = ("memory", "flops", "bandwidth")
_ACCUMULATION = ("every", "no_sync")
_LATENCY = 10e-6        # seconds a message pays before its first byte (gpu["latency"] overrides)
_MOE_DEFAULTS = take_kwargs({}, MoE)     # MoE's k and capacity_factor where a model omits them


class DimensionBytes(TypedDict):
    """Bytes one rank sends per step along each dimension."""
    tp: float
    pp: float
    dp: float
    cp: float
    ep: float


class DimensionMessages(TypedDict):
    """Messages one rank sends per step along the dimensions whose latency shows (dp's hide)."""
    tp: int
    pp: int
    cp: int
    ep: int


class StageCost(TypedDict):
    """stage_costs' result for one pipeline stage (a plain dict): what one of its ranks holds
    (bytes) and sends per step."""
    stage: int
    params: float
    grads: float
    optim: float
    acts: float
    memory: float
    bytes: DimensionBytes
    messages: DimensionMessages
    n_params: int
    tokens: float


class Layout(TypedDict, total=False):
    """A layout (a plain dict; an absent size is 1, ZeRO "dp", accumulation "every", no
    recomputation, no sequence parallelism)."""
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    zero: str
    acc: str
    recompute: str
    m: int
    sp: bool


class LayoutCost(Layout):
    """layout_costs' and plan's rows (plain dicts): the layout and its estimate."""
    memory: float
    bytes: float
    seconds: float
    compute_s: float
    exposed_s: float
    stages: list[StageCost]
    fits: bool


def validate_model(model, gpu=None):
    """Refuse a model (or GPU) description that misses a key or has a non-positive size."""
    for what, d, keys in (("model", model, _MODEL_KEYS), ("gpu", gpu, _GPU_KEYS)):
        if d is None:
            continue
        missing = [k for k in keys if k not in d]
        if missing:
            raise ValueError(f"the {what} needs {', '.join(missing)} (has {sorted(d)})")
        bad = [k for k in keys if not d[k] > 0]
        if bad:
            raise ValueError(f"the {what}'s {', '.join(bad)} must be > 0")
    if gpu is not None and not gpu.get("latency", _LATENCY) >= 0:
        raise ValueError(f"the gpu's latency must be >= 0 seconds, not {gpu['latency']}")


def data_parallel_costs(n_params, k, zero, m=1, acc="every", optimizer="adam",
                        dtype_bytes=2) -> ShardingCost:
    """sharding_costs over k ranks with m micro-batches per step: "every" reduces the gradients
    after each micro-batch (ZeRO-2: m reduce-scatters and one all-gather, (m + 1)/2 times DDP's
    all-reduce; ZeRO-3: an all-gather in forward and in backward and a reduce-scatter per
    micro-batch), "no_sync" keeps full gradients (ZeRO-3: and unsharded parameters) until one
    reduction. Plain dp and ZeRO-1 hold full gradients anyway (DDP's no_sync)."""
    if acc not in _ACCUMULATION:
        raise ValueError(f"acc must be one of {_ACCUMULATION}, not {acc!r}")
    z = ShardingCost(**sharding_costs(n_params, k, zero, optimizer, dtype_bytes))   # a copy
    if zero in ("dp", "zero1") or m == 1:
        return z
    full = n_params * dtype_bytes
    once = ring_pass_bytes(full, k)
    if acc == "no_sync":
        z["grads_bytes"] = full
        if zero == "zero3":
            z["params_bytes"] = full
    elif zero == "zero2":
        z["sent_bytes"] = (m + 1) * once
    else:
        z["sent_bytes"] = 3 * m * once
    z["total_bytes"] = z["params_bytes"] + z["grads_bytes"] + z["optim_bytes"]
    return z


def _moe(model):
    """(experts, k, capacity_factor) of the model: MoE's own defaults for what it omits."""
    return (model.get("experts", 0), model.get("k", _MOE_DEFAULTS["k"]),
            model.get("capacity_factor", _MOE_DEFAULTS["capacity_factor"]))


def _stage_params(model, lay, r):
    """Parameters one rank of pipeline stage r holds (its tensor-parallel and expert share):
    (dense, expert); an expert's are replicated on dp x cp / ep ranks only."""
    h, V, s = model["width"], model["vocab"], model["seq"]
    tp, ep, E = lay.get("tp", 1), lay.get("ep", 1), _moe(model)[0]
    blocks = model["layers"] // lay.get("pp", 1)
    dense, expert = blocks * block_params(h, tp), 0
    if E:   # the MLP (8 h^2 + 4 h split, h replicated) becomes E / ep experts and a router
        mlp = (8 * h * h + 4 * h) // tp + h
        dense += blocks * (h * E + E - mlp)
        expert = blocks * (E // ep) * mlp
    if r == 0:
        dense += (V + s) * h
    if r == lay.get("pp", 1) - 1:
        dense += 2 * h + h * V
    return dense, expert


def _active_params(model):
    """Parameters one token passes through (a MoE token: k experts and the router)."""
    h, V, s = model["width"], model["vocab"], model["seq"]
    E, k, _ = _moe(model)
    per_block = block_params(h) + ((k - 1) * (8 * h * h + 5 * h) + h * E + E if E else 0)
    return model["layers"] * per_block + (V + s) * h + 2 * h + h * V


def stage_costs(model, lay: Layout, optimizer="adam", dtype_bytes=2, flash=True,
                dropout=False) -> list[StageCost]:
    """Per pipeline stage (a list, stage 0 first), what one of its ranks holds and sends per
    step: params, grads, optim, acts, memory (bytes), bytes = {tp, pp, dp, cp, ep} and the
    messages along tp, pp, cp and ep (each pays the latency).
    `lay`: dp, tp, pp, cp, ep, zero (a stage of helpers.SHARDING_STAGES), acc (_ACCUMULATION),
    recompute, m, sp."""
    validate_model(model)
    h, a, s, V = (model[k] for k in ("width", "heads", "seq", "vocab"))
    b = dtype_bytes
    dp, tp, pp, cp, m = (lay.get(k, 1) for k in ("dp", "tp", "pp", "cp", "m"))
    ep, sp, rec = lay.get("ep", 1), lay.get("sp", False), lay.get("recompute", "none")
    zero, acc = lay.get("zero", "dp"), lay.get("acc", "every")
    E, k, cf = _moe(model)
    rows = model["batch"] / (dp * m)                    # sequences per micro-batch
    tokens = rows * s / cp                              # tokens per micro-batch on one rank
    blocks = model["layers"] // pp
    per_token = activation_bytes_per_token(h, a, s, tp, sp, rec, b, flash, dropout)
    if E and rec != "full":                             # k x factor copies through the MLP
        per_token += (k * cf - 1) * 8 * h * b / tp
    full = activation_bytes_per_token(h, a, s, tp, sp, "none", b, flash, dropout)
    again = rec != "none"           # recomputation runs attention's forward (its ring) again
    out = []
    for r in range(pp):
        dense, expert = _stage_params(model, lay, r)
        z = data_parallel_costs(dense, dp * cp, zero, m, acc, optimizer, b)
        if expert:
            ze = data_parallel_costs(expert, dp * cp // ep, zero, m, acc, optimizer, b)
            z = ShardingCost(**{key: z[key] + ze[key] for key in z})
        live = min(pp - r, m)                           # 1F1B: micro-batches alive at the peak
        per_mb = blocks * tokens * per_token
        if r == 0:
            per_mb += tokens * 8 + s / cp * 8           # token ids, position ids (int64)
        if r == pp - 1:
            per_mb += tokens * (2 * h * b + 4 * V + 8 + 8)   # norm, head input, fp32 log-probs
        # full recomputation: one block's activations come back while its backward runs
        acts = live * per_mb + (tokens * full if rec == "full" else 0)
        act = tokens * h * b                            # one activation of a micro-batch
        tp_calls = (6 if rec == "full" else 4) * blocks * m   # f and g, both ways (+ again)
        ring = ring_attention_bytes(tokens, h, cp, tp, b)
        ring_fwd = 2 * (cp - 1) * tokens * h // tp * b
        pp_msgs = m * ((r < pp - 1) + (r > 0))
        sent = DimensionBytes(
            tp=tp_calls * ring_bytes_per_device(act, tp), pp=pp_msgs * act,
            dp=z["sent_bytes"], cp=blocks * m * (ring + (ring_fwd if again else 0)),
            ep=blocks * m * moe_dispatch_bytes(tokens, h // tp, E, k, cf, ep, b)
            if E and ep > 1 else 0)
        messages = DimensionMessages(
            tp=tp_calls * 2 * (tp - 1), pp=pp_msgs,
            cp=blocks * m * (3 * (cp - 1) + 1 + ((cp - 1) if again else 0)) if cp > 1 else 0,
            ep=4 * blocks * m * (ep - 1) if E else 0)
        mem = z["params_bytes"] + z["grads_bytes"] + z["optim_bytes"] + acts
        out.append(StageCost(stage=r, params=z["params_bytes"], grads=z["grads_bytes"],
                             optim=z["optim_bytes"], acts=acts, memory=mem, bytes=sent,
                             messages=messages, n_params=dense + expert, tokens=tokens))
    return out


def ring_exposed_seconds(tokens, model, lay, rate, link, latency, dtype_bytes=2):
    """Seconds of one layer's ring attention (one micro-batch, forward and backward) that its
    attention does not hide: each hop brings a K/V block (and, in backward, a gradient block)
    while the rank computes attention on the block it holds; the hop costs latency plus bytes
    over the link, the block's attention its FLOPs at `rate`. The attention is causal with the
    zig-zag split: the first hop hides behind the rank's own block, whole; every later one
    behind half a block (causal_block). The last hop (the gradients home) hides behind nothing;
    recomputation runs the forward ring again."""
    cp, tp = lay.get("cp", 1), lay.get("tp", 1)
    if cp == 1:
        return 0.0
    h, s = model["width"], model["seq"]
    kv = 2 * tokens * h / tp * dtype_bytes              # one rank's K and V
    own = 4 * h * s * tokens / (tp * cp) / rate          # scores and weighted sum, whole block
    hop = latency + kv / link
    fwd = max(0.0, hop - own) + (cp - 2) * max(0.0, hop - own / 2)
    bwd = max(0.0, 2 * hop - 2 * own) + (cp - 2) * max(0.0, 2 * hop - own) + hop
    return fwd * (2 if lay.get("recompute", "none") != "none" else 1) + bwd


def layout_costs(model, gpu, lay: Layout, optimizer="adam", dtype_bytes=2, mfu=0.4,
                 **kw) -> LayoutCost:
    """One layout: the fullest rank's memory, the busiest rank's bytes, and the step time:
    compute (FLOPs at mfu x the GPU's FLOP/s, stretched by the pipeline bubble (m + pp - 1) / m)
    plus the communication that cannot hide: tensor, pipeline and expert traffic in full with a
    latency per message, data traffic beyond the backward it overlaps (all of it when the
    gradients are reduced every micro-batch, the last micro-batch's when they are reduced once),
    ring attention beyond the attention each hop overlaps (ring_exposed_seconds)."""
    validate_model(model, gpu)
    stages = stage_costs(model, lay, optimizer, dtype_bytes, **kw)
    dp, tp, pp, cp, m = (lay.get(k, 1) for k in ("dp", "tp", "pp", "cp", "m"))
    flops = train_flops_per_token(_active_params(model), model["layers"], model["width"],
                                  model["seq"], lay.get("recompute", "none"))
    rate = mfu * gpu["flops"]
    compute = flops * model["batch"] * model["seq"] / (dp * tp * pp * cp) / rate
    link, latency = gpu["bandwidth"], gpu.get("latency", _LATENCY)

    # data traffic overlaps the backward it follows: every micro-batch's when each reduces its
    # gradients; only the last one's when they accumulate whole and reduce once (no_sync; plain
    # dp and ZeRO-1 always do)
    once = lay.get("zero", "dp") in ("dp", "zero1") or lay.get("acc", "every") == "no_sync"
    window = compute * 2 / 3 / (m if once else 1)

    def exposed_of(st):
        sent, msgs = st["bytes"], st["messages"]
        t = sum(sent[d] / link + msgs[d] * latency for d in ("tp", "pp", "ep"))
        t += max(0.0, sent["dp"] / link - window)
        blocks = model["layers"] // pp
        return t + blocks * m * ring_exposed_seconds(st["tokens"], model, lay, rate, link,
                                                     latency, dtype_bytes)

    exposed = max(exposed_of(st) for st in stages)
    seconds = compute * (m + pp - 1) / m + exposed
    busy = max(stages, key=lambda st: sum(st["bytes"].values()))["bytes"]
    fullest = max(stages, key=lambda st: st["memory"])
    return LayoutCost(**lay, memory=fullest["memory"], bytes=sum(busy.values()),
                      seconds=seconds, compute_s=compute, exposed_s=exposed, stages=stages,
                      fits=fullest["memory"] <= gpu["memory"])


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(model, n_gpus, sp=True) -> list[Layout]:
    """Every layout the model allows on n_gpus: dp x tp x pp x cp = n_gpus with tp dividing the
    heads and the width, pp the layers, 2 cp the sequence, dp the batch; ep dividing dp and
    the experts; micro-batches m a power of two dividing the batch per dp rank (at most 16);
    each ZeRO stage (only "dp" without data parallelism), with ZeRO-2 and 3 and m > 1 both ways
    of accumulating; and each recomputation."""
    validate_model(model)
    E = _moe(model)[0]
    out = []
    for tp, pp, cp in itertools.product(_divisors(n_gpus), repeat=3):
        if n_gpus % (tp * pp * cp):
            continue
        dp = n_gpus // (tp * pp * cp)
        if (model["heads"] % tp or model["width"] % tp or model["layers"] % pp
                or (cp > 1 and model["seq"] % (2 * cp)) or model["batch"] % dp):
            continue
        per_dp = model["batch"] // dp
        ms = [m for m in (1, 2, 4, 8, 16) if per_dp % m == 0]
        eps = [e for e in _divisors(dp) if E and E % e == 0] or [1]
        zeros = SHARDING_STAGES if dp * cp > 1 else ("dp",)
        for ep, m, zero, rec in itertools.product(eps, ms, zeros, RECOMPUTE):
            if zero in ("dp", "zero1"):
                accs = ("no_sync",)
            else:
                accs = _ACCUMULATION if m > 1 else ("every",)
            for acc in accs:
                out.append(Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, acc=acc,
                                  recompute=rec, m=m, sp=sp and tp > 1))
    return out


def plan(model, gpu, n_gpus, optimizer="adam", dtype_bytes=2, top=None,
         **kw) -> list[LayoutCost]:
    """The layouts that fit in the GPU's memory, fastest first (then the fewest bytes sent by
    the busiest rank, then the least memory)."""
    validate_model(model, gpu)
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer must be one of {tuple(OPTIMIZER_STATE_BYTES)}")
    if int(n_gpus) != n_gpus or n_gpus < 1:
        raise ValueError(f"n_gpus must be a whole number >= 1, not {n_gpus}")
    rows = [layout_costs(model, gpu, lay, optimizer, dtype_bytes, **kw)
            for lay in candidate_layouts(model, int(n_gpus))]
    fits = sorted((r for r in rows if r["fits"]),
                  key=lambda r: (r["seconds"], r["bytes"], r["memory"]))
    return fits[:top] if top else fits
