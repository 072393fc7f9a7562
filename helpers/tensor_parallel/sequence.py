"""Part VI: sequence parallelism by hand (Korthikanti et al.), and the vocabulary split.

Between the tensor-parallel regions a block's layer norms and residual adds run on the whole
activation on every rank. Sequence parallelism keeps that region split along the sequence: each
rank holds T/k positions. Entering a tensor-parallel region, an all-gather of the sequence
(backward: a reduce-scatter of its gradient) replaces f; leaving it, a reduce-scatter of the
partial outputs (backward: an all-gather) replaces g's all-reduce. The same bytes (a ring
all-reduce is a reduce-scatter then an all-gather), 1/k of the norm region's activations. The
all-gathered input is not kept: the gather and the column-split linears that read it run as one
step that saves only this rank's positions and gathers them again in backward (Megatron's
sequence parallelism), so every activation outside attention and the MLP is 1/k.

The vocabulary split: the embedding's rows and the head's columns (the vocabulary) split over
the ranks; a lookup sums each rank's rows (zero for ids it does not hold), and the loss is a
cross-entropy over logits no rank holds whole (a max, a sum of exponentials and the target's
logit, each all-reduced).
"""
import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..seeding import seeded
from .scratch import TPMLP, TPAttention, reduce_from_tp, shard_of

__all__ = ["GatherSequence", "scatter_sequence", "GatherLinears", "SPBlock",
           "sync_replicated_grads", "VocabEmbedding", "vocab_parallel_cross_entropy", "TinyTPLM",
           "tiny_tp_lm"]


class GatherSequence(torch.autograd.Function):
    """Into a tensor-parallel region: all-gather the sequence (dim 1) in forward; in backward,
    reduce-scatter the gradient (each rank's heads or columns gave part of every position's)."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return comm.all_gather(x, dim=1)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.reduce_scatter(grad.contiguous(), dim=1), None


class _ScatterSequence(torch.autograd.Function):
    """Out of a tensor-parallel region: reduce-scatter the partial outputs along the sequence in
    forward (the sum, only this rank's positions); in backward, all-gather the gradient."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return comm.reduce_scatter(x.contiguous(), dim=1)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_gather(grad.contiguous(), dim=1), None


def _gather_sequence(x, comm):
    """GatherSequence: all-gather the sequence in forward, reduce-scatter the gradient."""
    return GatherSequence.apply(x, comm)


def scatter_sequence(x, comm):
    """_ScatterSequence: reduce-scatter the partial outputs in forward, all-gather the gradient."""
    return _ScatterSequence.apply(x, comm)


class GatherLinears(torch.autograd.Function):
    """_gather_sequence followed by column-split linears, saving only this rank's positions:
    forward all-gathers x (B, T/k, h) and returns each linear of the whole sequence; backward
    all-gathers x again for the weights' gradients and reduce-scatters the input's. One more
    all-gather in backward buys (k - 1)/k of the gathered input's memory."""

    @staticmethod
    def forward(ctx, x, comm, *weights_and_biases):
        ctx.comm = comm
        ctx.save_for_backward(x, *weights_and_biases)
        full = comm.all_gather(x, dim=1)
        pairs = zip(weights_and_biases[::2], weights_and_biases[1::2], strict=True)
        return tuple(F.linear(full, w, b) for w, b in pairs)

    @staticmethod
    def backward(ctx, *grads):
        x, *wb = ctx.saved_tensors
        full = ctx.comm.all_gather(x, dim=1)                 # re-gathered, not kept
        flat = full.reshape(-1, full.shape[-1])
        gx, out = torch.zeros_like(full), []
        for g, w in zip(grads, wb[::2], strict=True):
            if g is None:
                out += [torch.zeros_like(w), torch.zeros(w.shape[0], dtype=w.dtype,
                                                         device=w.device)]
                continue
            gx += g @ w
            g2 = g.reshape(-1, g.shape[-1])
            out += [g2.t() @ flat, g2.sum(0)]
        return (ctx.comm.reduce_scatter(gx, dim=1), None, *out)


def _gather_linears(x, comm, linears):
    """The outputs of `linears` (column-split nn.Linear) on the all-gathered sequence of x,
    saving only x (GatherLinears)."""
    params = [t for lin in linears for t in (lin.weight, lin.bias)]
    return GatherLinears.apply(x, comm, *params)


class _SPAttention(TPAttention):
    """TPAttention entered from this rank's positions: q, k and v read the gathered sequence
    through _gather_linears, so the gathered input is not saved."""

    def partial(self, h):
        q, k, v = _gather_linears(h, self.comm, (self.q, self.k, self.v))
        B, T, _ = q.shape
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(y.transpose(1, 2).reshape(B, T, -1), self.proj.weight)


class _SPMLP(TPMLP):
    """TPMLP entered from this rank's positions: its first layer reads the gathered sequence
    through _gather_linears."""

    def partial(self, h):
        (up,) = _gather_linears(h, self.comm, (self.up,))
        return F.linear(F.gelu(up), self.down.weight)


class SPBlock(nn.Module):
    """The SmallBlock with tensor and sequence parallelism: this rank holds T/k positions of the
    residual stream; layer norms run on them; attention and MLP are split as in TPBlock, entered
    by an all-gather (fused with their first linears: _SPAttention, _SPMLP) and left by
    scatter_sequence. The layer norms and the output biases are replicated but each rank sees
    only its positions: sync_replicated_grads sums their gradients."""

    def __init__(self, block, comm):
        super().__init__()
        self.comm = comm
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        self.attn, self.mlp = _SPAttention(block.attn, comm), _SPMLP(block.mlp, comm)

    def _region(self, module, h, bias):
        partial = module.partial(h)            # gathers h inside, keeping only h for backward
        return scatter_sequence(partial, self.comm) + bias

    def forward(self, x):
        x = x + self._region(self.attn, self.ln1(x), self.attn.proj.bias)
        return x + self._region(self.mlp, self.ln2(x), self.mlp.down.bias)


def sync_replicated_grads(block, comm):
    """Sum over the ranks the gradients of the replicated parameters (the layer norms, the
    biases added after the reduce-scatter): each rank saw only its positions. Megatron
    all-reduces its sequence-parallel parameters' gradients the same way."""
    for p in (*block.ln1.parameters(), *block.ln2.parameters(), block.attn.proj.bias,
              block.mlp.down.bias):
        comm.all_reduce(p.grad)


# --- the vocabulary split -----------------------------------------------------------------------
class VocabEmbedding(nn.Module):
    """Rank r's rows of `emb` (a contiguous 1/k of the vocabulary): ids it does not hold look
    up zeros, and g (an all-reduce) sums the ranks' lookups into the whole embedding."""

    def __init__(self, emb, comm):
        super().__init__()
        self.comm, k, r = comm, comm.world, comm.rank
        self.weight = nn.Parameter(shard_of(emb.weight, 0, r, k))
        self.start = r * self.weight.shape[0]

    def forward(self, ids):
        local = ids - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        return reduce_from_tp(out * mine.unsqueeze(-1), self.comm)


def vocab_parallel_cross_entropy(logits, target, comm, start):
    """Mean cross-entropy of logits split along the vocabulary (this rank: columns start ..
    start + V/k), without gathering them: log sum exp over all ranks minus the target's logit,
    each sum all-reduced (g: all-reduce forward, identity backward)."""
    with torch.no_grad():
        top = comm.all_reduce(logits.max(-1).values.clone(), op="max")
    z = logits - top.unsqueeze(-1)
    total = reduce_from_tp(z.exp().sum(-1), comm)
    local = target - start
    mine = (local >= 0) & (local < logits.shape[-1])
    picked = z.gather(-1, local.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    target_z = reduce_from_tp(picked * mine, comm)
    return (total.log() - target_z).mean()


class TinyTPLM(nn.Module):
    """A token model for the vocabulary split: an embedding, one SmallBlock, a linear head."""

    def __init__(self, vocab, width, heads):
        super().__init__()
        from ..tiny_models import SmallBlock
        self.emb, self.block = nn.Embedding(vocab, width), SmallBlock(width, heads)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        return self.head(self.block(self.emb(ids)))


def tiny_tp_lm(vocab=64, width=32, heads=4, seed=0):
    """The TinyTPLM with weights from `seed` (every rank builds the same one)."""
    with seeded(seed):
        return TinyTPLM(vocab, width, heads)
