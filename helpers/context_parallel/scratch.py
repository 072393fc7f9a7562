"""Part VII: ring attention by hand. The sequence is split over the ranks of a comm; each rank
keeps its queries and passes its key/value block around the ring (send to rank + 1, receive
from rank - 1), so after `world` steps every query has seen every key without any rank ever
holding the whole sequence. The blocks are combined with the online softmax (a running max and
a running sum per query), exactly as flash attention combines the tiles of one GPU.

Causal attention over a contiguous split is lopsided (rank 0's queries see one block, the last
rank's see all of them); the zig-zag split gives rank r the chunks r and 2 world - 1 - r of
2 world equal chunks, so every rank computes the same amount.
Works over any comm with send/recv (helpers.DistComm across processes, ThreadComm in checks).
"""
import math

import torch

__all__ = ["split_positions", "shard_sequence", "unshard_sequence", "attention_reference",
           "block_attention", "merge_blocks", "ring_attention", "RingAttention",
           "block_work", "CPAttention"]

LAYOUTS = ("contiguous", "zigzag")


def split_positions(T, world, rank, layout="zigzag"):
    """The global positions (a LongTensor) of the tokens rank `rank` holds of a sequence of T."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    parts = 2 * world if layout == "zigzag" else world
    if T % parts:
        raise ValueError(f"a sequence of {T} tokens does not split into {parts} equal chunks "
                         f"({layout} over {world} ranks): use a multiple of {parts}")
    chunks = torch.arange(T).chunk(parts)
    if layout == "contiguous":
        return chunks[rank]
    return torch.cat([chunks[rank], chunks[parts - 1 - rank]])


def shard_sequence(x, world, rank, layout="zigzag", dim=-2):
    """Rank `rank`'s tokens of x (its sequence along `dim`), in the order of split_positions."""
    return x.index_select(dim, split_positions(x.shape[dim], world, rank, layout))


def unshard_sequence(parts, layout="zigzag", dim=-2):
    """The whole sequence from every rank's part (in rank order): the inverse of shard_sequence."""
    world = len(parts)
    T = sum(p.shape[dim] for p in parts)
    pos = torch.cat([split_positions(T, world, r, layout) for r in range(world)])
    return torch.cat(parts, dim).index_select(dim, torch.argsort(pos))


def attention_reference(q, k, v, causal=False):
    """Plain softmax attention over the whole sequence: the unsplit answer. (B, H, T, D)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[-2]
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(),
                          float("-inf"))
    return s.softmax(-1) @ v


def _mask(q_pos, k_pos):
    return k_pos[None, :] <= q_pos[:, None]          # query i sees keys at or before it


def block_attention(q, k, v, mask=None):
    """One block of keys for the queries: (acc, m, l) with m the row max of the scores, l the sum
    of exp(score - m), acc the sum of exp(score - m) v. A row whose keys are all masked has
    m = -inf and l = 0 (it contributes nothing when merged)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1)
    p = torch.exp(s - torch.where(torch.isinf(m), 0.0, m)[..., None])
    return p @ v, m, p.sum(-1)


def merge_blocks(acc, m, l, acc_b, m_b, l_b):
    """The online softmax: combine the running (acc, m, l) with a new block's. Both are rescaled to
    the new running max, so no exponent ever exceeds 0. `m` must be finite (merge into a state
    that has seen at least one key per row)."""
    m_new = torch.maximum(m, m_b)
    a, b = torch.exp(m - m_new), torch.exp(m_b - m_new)
    return acc * a[..., None] + acc_b * b[..., None], m_new, l * a + l_b * b


def _positions(comm, T_local, layout):
    T = T_local * comm.world
    return [split_positions(T, comm.world, r, layout) for r in range(comm.world)]


class RingAttention(torch.autograd.Function):
    """Forward: world steps; at step i this rank holds the K/V block of rank (rank - i) % world,
    sends it on to rank + 1 and receives the next from rank - 1. Backward: the same ring, with the
    key and value gradients travelling beside their block; one last hop takes them home."""

    @staticmethod
    def forward(ctx, q, k, v, comm, causal, layout, stats):
        r, w = comm.rank, comm.world
        pos = _positions(comm, q.shape[-2], layout)
        acc = m = l = None
        kb, vb = k.detach(), v.detach()
        for i in range(w):
            src = (r - i) % w
            if i < w - 1:                      # post the send first: it overlaps the compute
                comm.send(kb, (r + 1) % w, tag=100 + 2 * i)
                comm.send(vb, (r + 1) % w, tag=101 + 2 * i)
            mask = _mask(pos[r], pos[src]) if causal else None
            if mask is None or mask.any():
                blk = block_attention(q.detach(), kb, vb, mask)
                acc, m, l = blk if acc is None else merge_blocks(acc, m, l, *blk)
                if stats is not None:
                    stats.append(int(mask.sum()) if mask is not None else kb.shape[-2] ** 2)
            if i < w - 1:
                kb = comm.recv((r - 1) % w, k.shape, tag=100 + 2 * i, dtype=k.dtype)
                vb = comm.recv((r - 1) % w, v.shape, tag=101 + 2 * i, dtype=v.dtype)
        comm.wait()
        out = acc / l[..., None]
        lse = m + torch.log(l)                 # log of the softmax denominator, per query
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm, ctx.causal, ctx.pos = comm, causal, pos
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        comm, r, w, pos = ctx.comm, ctx.comm.rank, ctx.comm.world, ctx.pos
        scale = 1 / math.sqrt(q.shape[-1])
        D = (d_out * out).sum(-1, keepdim=True)          # rowsum(dO * O) of softmax's backward
        dq = torch.zeros_like(q)
        kb, vb, dkb, dvb = k, v, torch.zeros_like(k), torch.zeros_like(v)
        for i in range(w):
            src = (r - i) % w
            mask = _mask(pos[r], pos[src]) if ctx.causal else None
            if mask is None or mask.any():
                s = q @ kb.transpose(-2, -1) * scale
                if mask is not None:
                    s = s.masked_fill(~mask, float("-inf"))
                p = torch.exp(s - lse[..., None])             # the softmax, recomputed
                dvb = dvb + p.transpose(-2, -1) @ d_out
                ds = p * (d_out @ vb.transpose(-2, -1) - D)
                dq = dq + ds @ kb * scale
                dkb = dkb + ds.transpose(-2, -1) @ q * scale
            blocks = (kb, vb, dkb, dvb) if i < w - 1 else (dkb, dvb)
            for j, t in enumerate(blocks):                    # on to rank + 1; the last hop
                comm.send(t, (r + 1) % w, tag=200 + 4 * i + j)   # carries the gradients home
            got = [comm.recv((r - 1) % w, t.shape, tag=200 + 4 * i + j, dtype=t.dtype)
                   for j, t in enumerate(blocks)]
            if i < w - 1:
                kb, vb, dkb, dvb = got
            else:
                dk, dv = got
        comm.wait()
        return dq, dk, dv, None, None, None, None


def check_ranks_agree(comm, q, k, v):
    """Refuse, on every rank at once and before any block travels, shapes the ring cannot pass
    around: q, k, v of different shapes on a rank, or different shapes (token counts) between
    ranks. One all-gather of 12 integers."""
    if not q.shape == k.shape == v.shape or q.dim() != 4:
        raise ValueError(f"ring attention takes q, k, v of one shape (B, H, tokens, D) on a rank; "
                         f"rank {comm.rank} has {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    mine = torch.tensor([list(q.shape)], device=q.device)
    got = [tuple(s) for s in comm.all_gather(mine, dim=0).tolist()]
    if len(set(got)) > 1:
        held = ", ".join(f"rank {r}: {s[2]}" for r, s in enumerate(got))
        raise ValueError(f"ring attention needs the same number of tokens (and B, H, D) on "
                         f"every rank; the ranks hold {held} tokens (shapes {got}): split the "
                         f"sequence with helpers.shard_sequence")


def ring_attention(q, k, v, comm, causal=False, layout="zigzag", stats=None):
    """Attention of this rank's queries over the whole sequence, whose tokens are split over the
    ranks of `comm` by `layout` (q, k, v: this rank's (B, H, T / world, D)). Differentiable.
    `stats`, a list, receives the number of scores this rank computed per block."""
    if comm.world == 1:
        return attention_reference(q, k, v, causal)
    check_ranks_agree(comm, q, k, v)
    return RingAttention.apply(q, k, v, comm, causal, layout, stats)


def block_work(T, world, layout, causal=True):
    """Scores each rank computes for a sequence of T (the unmasked query-key pairs it sees)."""
    work = []
    for r in range(world):
        q = split_positions(T, world, r, layout)
        work.append(sum(int(_mask(q, split_positions(T, world, s, layout)).sum()) if causal
                        else len(q) ** 2 for s in range(world)))
    return work


class CPAttention(torch.nn.Module):
    """A causal self-attention layer (helpers.SmallAttention's weights, shared, not copied) whose
    sequence is split over `comm`: projections on this rank's tokens, ring attention between.
    Each rank's weight gradients cover its own tokens; their sum over the ranks is the full one
    (context-parallel ranks are data-parallel ranks for the weights)."""

    def __init__(self, attn, comm, layout="zigzag"):
        super().__init__()
        self.attn, self.comm, self.layout = attn, comm, layout

    def forward(self, x):
        B, T, _ = x.shape
        a = self.attn
        q, k, v = (lin(x).view(B, T, -1, a.head_dim).transpose(1, 2)
                   for lin in (a.q, a.k, a.v))
        y = ring_attention(q, k, v, self.comm, causal=True, layout=self.layout)
        return a.proj(y.transpose(1, 2).reshape(B, T, -1))
