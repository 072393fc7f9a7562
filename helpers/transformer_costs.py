"""Part VII: a transformer's memory and traffic, per token and per layer (Korthikanti et al.'s
activation count, ring attention, MoE dispatch, training FLOPs); the planner
(helpers/composed/planner.py) composes them. Part I's costs of LeNet and ResNet-18 are in costs.py.
"""
import math

from .validate import validate_positive_int

__all__ = ["RECOMPUTE", "activation_bytes_per_token", "block_params", "ring_attention_bytes",
           "ulysses_attention_bytes", "moe_dispatch_bytes", "moe_layer_seconds",
           "train_flops_per_token"]

RECOMPUTE = ("none", "selective", "full")


def _counts(**values):
    """Each value a whole number >= 1 (ranks, heads, experts): a cost of 0 or -2 ranks would
    come out as a number (negative bytes), not as the mistake it is."""
    for name, v in values.items():
        validate_positive_int(v, name)


def _amounts(**values):
    """Each value a number >= 0 (tokens, widths, bytes)."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {v!r}")


def _recompute(recompute):
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, not {recompute!r}")


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
    _recompute(recompute)
    _counts(width=width, heads=heads, tp=tp)
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
    _counts(width=width, tp=tp)
    if width % tp:
        raise ValueError(f"tp={tp} must divide the width {width} (it splits whole columns): "
                         "choose a tp that divides it")
    return (12 * width * width + 7 * width) // tp + 6 * width


def ring_attention_bytes(tokens, width, cp, tp=1, dtype_bytes=4, kv_width=None):
    """Bytes one rank sends per layer in ring attention over cp ranks, its `tokens` (local) with
    kv_width / tp of K and of V (kv_width: the K/V heads' width, smaller than `width` with
    grouped-query attention; default width): forward passes K and V on cp - 1 times; backward
    passes K and V on cp - 1 times and their gradients cp times (the last hop takes them
    home)."""
    _counts(cp=cp, tp=tp)
    _amounts(tokens=tokens, width=width)
    block = tokens * (kv_width or width) // tp * dtype_bytes
    return 0 if cp == 1 else (2 * (cp - 1) + 2 * (cp - 1) + 2 * cp) * block


def ulysses_attention_bytes(tokens, width, cp, tp=1, dtype_bytes=4, kv_width=None):
    """Bytes one rank sends per layer in all-to-all (Ulysses) attention over cp ranks, its
    `tokens` (local): forward turns q, k, v from sequence shards into head shards and the
    output back, backward the same four in reverse; each all-to-all keeps 1/cp of the tensor
    on the rank. Independent of cp beyond (cp - 1) / cp, where the ring's grows with cp."""
    _counts(cp=cp, tp=tp)
    _amounts(tokens=tokens, width=width)
    q = tokens * width // tp * dtype_bytes
    kv = tokens * (kv_width or width) // tp * dtype_bytes
    return 0 if cp == 1 else 2 * (2 * q + 2 * kv) * (cp - 1) // cp


def moe_dispatch_bytes(tokens, width, n_experts, k, capacity_factor, ep, dtype_bytes=4):
    """Bytes one rank's all-to-alls send per MoE layer and step (dispatch and combine, forward
    and backward) with fixed buffers: n_experts x capacity rows of `width`, all but its own
    experts' share leaving the rank. capacity = ceil(factor x tokens x k / n_experts)."""
    _counts(n_experts=n_experts, k=k, ep=ep)
    _amounts(tokens=tokens, width=width, capacity_factor=capacity_factor)
    if k > n_experts or n_experts % ep:
        raise ValueError(f"k={k} experts per token out of {n_experts}, over ep={ep} ranks: k "
                         "must be at most the experts, and ep must divide them")
    capacity = math.ceil(capacity_factor * tokens * k / n_experts)
    return 4 * (n_experts - n_experts // ep) * capacity * width * dtype_bytes


def moe_layer_seconds(tokens, width, hidden, k, ep, flops, bandwidth, latency=10e-6,
                      shared_hidden=0, dtype_bytes=2, chunks=1):
    """A prediction, not a measurement: one MoE layer's forward on one rank of ep, `tokens`
    tokens, evenly routed, with the GPU's `flops` (FLOP/s achieved) and `bandwidth` (bytes/s
    per rank, all-to-all). Returns dict(dispatch, experts, shared, combine, seconds).
    chunks=1: each all-to-all waits for what precedes it. chunks=c > 1: the tokens cut into c
    pieces, one piece's all-to-alls running while another's experts (and the shared expert)
    compute (torchtitan's and DeepSeek's overlap): max(comm, compute) + min(comm, compute) / c."""
    a2a = latency * (ep - 1) + tokens * k * width * dtype_bytes * (ep - 1) / ep / bandwidth
    experts = 2 * tokens * k * 2 * width * hidden / flops
    shared = 2 * tokens * 2 * width * shared_hidden / flops
    comm, compute = 2 * a2a, experts + shared
    seconds = comm + compute if chunks == 1 else (max(comm, compute)
                                                  + min(comm, compute) / chunks)
    return dict(dispatch=a2a, experts=experts, shared=shared, combine=a2a, seconds=seconds)


def train_flops_per_token(n_params, layers, width, seq, recompute="none"):
    """FLOPs of one training token: 6 per parameter (2 forward, 4 backward) plus attention's
    scores and weighted sum (12 x layers x width x seq); recompute adds a forward."""
    _recompute(recompute)
    flops = 6 * n_params + 12 * layers * width * seq
    extra = {"none": 0, "selective": 4 * layers * width * seq, "full": flops / 3}
    return flops + extra[recompute]
