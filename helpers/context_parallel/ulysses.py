"""Part VII: the other way to split attention's sequence, by heads (DeepSpeed-Ulysses). Each
rank holds T / world tokens of every head; one all-to-all gives it every token of H / world
heads, it runs ordinary attention on them (any kernel: heads are independent), and a second
all-to-all gives the tokens back. Four all-to-alls forward (q, k, v, the output) and four
backward, each moving (world - 1) / world of a rank's tensor: the bytes per rank do not grow
with world, where the ring's do; but world may not exceed the heads (the K/V heads with GQA).
"""
import torch
import torch.nn.functional as F

from .scratch import split_positions, validate_ranks_agree

__all__ = ["seq_to_heads", "heads_to_seq", "SeqToHeads", "HeadsToSeq", "ulysses_attention"]


def _all_to_all(comm, pieces, tag):
    """pieces[j] (all of one shape) goes to rank j; returns what each rank j sent here, in rank
    order: one `comm.all_to_all` of the stacked pieces, a piece a row."""
    ones = [1] * comm.world
    return list(comm.all_to_all(torch.stack(pieces), ones, ones, tag).unbind(0))


def seq_to_heads(x, comm, tag=400):
    """(B, H, T/w, D) this rank's tokens of every head -> (B, H/w, T, D) every token (in rank
    order of the chunks) of this rank's heads H/w * rank .. H/w * (rank + 1) - 1."""
    w = comm.world
    if x.shape[1] % w:
        raise ValueError(f"{x.shape[1]} heads do not split over {w} ranks: all-to-all attention "
                         f"needs world to divide the heads (the K/V heads with GQA)")
    return torch.cat(_all_to_all(comm, list(x.chunk(w, dim=1)), tag), dim=2)


def heads_to_seq(x, comm, tag=401):
    """The inverse of seq_to_heads: (B, H/w, T, D) -> (B, H, T/w, D)."""
    return torch.cat(_all_to_all(comm, list(x.chunk(comm.world, dim=2)), tag), dim=1)


class SeqToHeads(torch.autograd.Function):
    """seq_to_heads with a gradient: backward sends the gradient back with heads_to_seq."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return seq_to_heads(x, comm)

    @staticmethod
    def backward(ctx, grad):
        return heads_to_seq(grad, ctx.comm), None


class HeadsToSeq(torch.autograd.Function):
    """heads_to_seq with a gradient: backward sends the gradient back with seq_to_heads."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return heads_to_seq(x, comm)

    @staticmethod
    def backward(ctx, grad):
        return seq_to_heads(grad, ctx.comm), None


def ulysses_attention(q, k, v, comm, causal=False, layout="contiguous"):
    """Attention of this rank's tokens (q, k, v: (B, H, T/w, D), split by `layout`) over the whole
    sequence, by all-to-all over the heads: equal to ring_attention. Differentiable."""
    if comm.world == 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    validate_ranks_agree(comm, q, k, v)
    T, w = q.shape[-2] * comm.world, comm.world
    pos = torch.cat([split_positions(T, w, r, layout) for r in range(w)]).to(q.device)
    order = torch.argsort(pos)                # the gathered chunks, put in sequence order
    qh, kh, vh = (SeqToHeads.apply(t, comm)[..., order, :] for t in (q, k, v))
    y = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    return HeadsToSeq.apply(y[..., torch.argsort(order), :].contiguous(), comm)
