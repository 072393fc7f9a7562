"""Part VII: ring attention by hand. The sequence is split over the ranks of a comm; each rank
keeps its queries and passes its key/value block around the ring (send to rank + 1, receive
from rank - 1), so after `world` steps every query has seen every key without any rank ever
holding the whole sequence. The blocks are combined with the online softmax (a running max and
a running sum per query), exactly as flash attention combines the tiles of one GPU.

Causal attention skips what the mask hides: of each block a rank computes only the query rows
that see some key and the key columns some query sees (`causal_block`). Over a contiguous split
that leaves rank 0 one block and the last rank all of them; the zig-zag split gives rank r the
chunks r and 2 world - 1 - r of 2 world equal chunks, so that every block after the first is
half a block (torch's templated ring attention uses the same rule) and every rank forms
(world + 1) / (2 world) of the contiguous last rank's products.

Each step posts its send and its receive together (`ring_pass`: torch's batch_isend_irecv),
computes, and then waits for both: the next block arrives while this one is computed, and a
block a rank has passed on is freed at once, so a rank holds its own K/V block, the one it
computes on and the one arriving, never the whole sequence (`RingCensus` counts them).
Works over any comm (helpers.DistComm across processes, ThreadComm in checks).
"""
import math

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["split_positions", "shard_sequence", "unshard_sequence", "attention_reference",
           "block_attention", "merge_blocks", "causal_block", "ring_pass", "ring_attention",
           "RingAttention", "validate_ranks_agree", "block_work", "RingCensus", "CPAttention"]

LAYOUTS = ("contiguous", "zigzag")
_TAG = 100          # the ring's message tags start here: forward 2 per step, backward 4


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
    return x.index_select(dim, split_positions(x.shape[dim], world, rank, layout).to(x.device))


def unshard_sequence(parts, layout="zigzag", dim=-2):
    """The whole sequence from every rank's part (in rank order): the inverse of shard_sequence."""
    world = len(parts)
    T = sum(p.shape[dim] for p in parts)
    pos = torch.cat([split_positions(T, world, r, layout) for r in range(world)])
    return torch.cat(parts, dim).index_select(dim, torch.argsort(pos).to(parts[0].device))


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


def causal_block(q_pos, k_pos, causal=True):
    """What of one block a rank computes: (first query row, key columns, mask). Positions are
    sorted, so the queries that see some key are a tail of the rows, the keys that some query
    sees a head of the columns: the rank forms the products q[first:] x k[:cols] only (none
    when cols == 0 or first == len(q_pos)); mask: which of those pairs the causal mask keeps,
    None when it keeps them all."""
    if not causal:
        return 0, len(k_pos), None
    cols = int((k_pos <= q_pos.max()).sum())
    first = int((q_pos < k_pos.min()).sum())
    if cols == 0 or first == len(q_pos):
        return len(q_pos), 0, None
    mask = _mask(q_pos[first:], k_pos[:cols])
    return first, cols, None if bool(mask.all()) else mask


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


def ring_pass(comm, tensors, tag):
    """Post one hop of the ring: each tensor to rank + 1 and one of the same shape from
    rank - 1, sends and receives together (comm.isendrecv: torch.distributed's
    batch_isend_irecv on a DistComm). Returns the hop; its wait() returns the received
    tensors and lets go of the sent ones."""
    w, r = comm.world, comm.rank
    nxt, prv = (r + 1) % w, (r - 1) % w
    return comm.isendrecv([(t, nxt, tag + i) for i, t in enumerate(tensors)],
                          [(prv, t.shape, t.dtype, tag + i) for i, t in enumerate(tensors)])


def _positions(comm, T_local, layout):
    T = T_local * comm.world
    return [split_positions(T, comm.world, r, layout) for r in range(comm.world)]


def _record(stats, phase, step, src, rows, cols, mask):
    if stats is not None:
        stats.append(dict(phase=phase, step=step, src=src, rows=rows, cols=cols,
                          products=rows * cols,
                          useful=rows * cols if mask is None else int(mask.sum())))


class RingAttention(torch.autograd.Function):
    """Forward: world steps; at step i this rank holds the K/V block of rank (rank - i) % world,
    posts its send to rank + 1 and the receive of the next from rank - 1, computes the part of
    the block the mask leaves (causal_block) and waits. Backward: the same ring; the unchanged
    K/V go on before the compute, their gradients after it, and one last hop takes the
    gradients home."""

    @staticmethod
    def forward(ctx, q, k, v, comm, causal, layout, stats):
        r, w = comm.rank, comm.world
        pos = _positions(comm, q.shape[-2], layout)
        q, k, v = (t.detach().contiguous() for t in (q, k, v))
        acc = m = l = None
        kv = (k, v)
        for i in range(w):
            src = (r - i) % w
            hop = ring_pass(comm, kv, _TAG + 2 * i) if i < w - 1 else None
            first, cols, mask = causal_block(pos[r].to(q.device), pos[src].to(q.device), causal)
            if cols:
                blk = block_attention(q[..., first:, :], kv[0][..., :cols, :],
                                      kv[1][..., :cols, :], mask)
                if acc is None:               # step 0: its own block, every query sees a key
                    acc, m, l = blk
                else:
                    acc[..., first:, :], m[..., first:], l[..., first:] = merge_blocks(
                        acc[..., first:, :], m[..., first:], l[..., first:], *blk)
                _record(stats, "forward", i, src, q.shape[-2] - first, cols, mask)
            if hop is not None:
                kv = hop.wait()              # the block passed on is let go here
        del kv
        out = acc / l[..., None]
        lse = m + torch.log(l)                 # log of the softmax denominator, per query
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm, ctx.causal, ctx.pos, ctx.stats = comm, causal, pos, stats
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        comm, r, w, pos = ctx.comm, ctx.comm.rank, ctx.comm.world, ctx.pos
        scale = 1 / math.sqrt(q.shape[-1])
        d_out = d_out.contiguous()
        D = (d_out * out).sum(-1, keepdim=True)          # rowsum(dO * O) of softmax's backward
        dq = torch.zeros_like(q)
        kv, dkv = (k, v), (torch.zeros_like(k), torch.zeros_like(v))
        for i in range(w):
            src = (r - i) % w
            hop = ring_pass(comm, kv, _TAG + 2 * w + 4 * i) if i < w - 1 else None  # K/V first
            first, cols, mask = causal_block(pos[r].to(q.device), pos[src].to(q.device),
                                             ctx.causal)
            if cols:
                kb, vb = kv[0][..., :cols, :], kv[1][..., :cols, :]
                s = q[..., first:, :] @ kb.transpose(-2, -1) * scale
                if mask is not None:
                    s = s.masked_fill(~mask, float("-inf"))
                p = torch.exp(s - lse[..., first:, None])    # the softmax, recomputed
                do = d_out[..., first:, :]
                dkv[1][..., :cols, :] += p.transpose(-2, -1) @ do
                ds = p * (do @ vb.transpose(-2, -1) - D[..., first:, :])
                dq[..., first:, :] += ds @ kb * scale
                dkv[0][..., :cols, :] += ds.transpose(-2, -1) @ q[..., first:, :] * scale
                _record(ctx.stats, "backward", i, src, q.shape[-2] - first, cols, mask)
                del kb, vb, s, p, ds
            if hop is not None:
                kv = hop.wait()
            # this block's gradient on to rank + 1 (the last hop carries it home)
            dkv = ring_pass(comm, dkv, _TAG + 2 * w + 4 * i + 2).wait()
        return dq, dkv[0], dkv[1], None, None, None, None


def validate_ranks_agree(comm, q, k, v):
    """Refuse, on every rank at once and before any block travels, shapes the ring cannot pass
    around: q, k, v of different shapes on a rank, or different shapes (token counts) between
    ranks. One all-gather of 4 integers."""
    if not q.shape == k.shape == v.shape or q.dim() != 4:
        raise ValueError(f"ring attention takes q, k, v of one shape (B, H, tokens, D) on a rank; "
                         f"rank {comm.rank} has {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if not hasattr(comm, "all_gather"):      # a comm of sends only: the shapes travel with them
        return
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
    `stats`, a list, receives one dict per block computed, forward and backward: phase, step,
    src (whose block), rows x cols of it, products formed (rows x cols per batch and head) and
    useful (the pairs the mask keeps)."""
    if comm.world == 1:
        return attention_reference(q, k, v, causal)
    validate_ranks_agree(comm, q, k, v)
    return RingAttention.apply(q, k, v, comm, causal, layout, stats)


def block_work(T, world, layout, causal=True, useful=False):
    """Per rank, the query x key products its ring forward forms for a sequence of T (useful=True:
    only the pairs the causal mask keeps), by the rule of causal_block."""
    pos = [split_positions(T, world, r, layout) for r in range(world)]
    work = []
    for r in range(world):
        total = 0
        for s in range(world):
            first, cols, mask = causal_block(pos[r], pos[s], causal)
            n = (len(pos[r]) - first) * cols
            total += int(mask.sum()) if useful and mask is not None else n
        work.append(total)
    return work


class RingCensus(TorchDispatchMode):
    """with RingCensus(block_bytes) as c: ...  ->  c.peak: the most bytes of point-to-point
    buffers alive at once on this rank, c.peak_blocks: the same in blocks of block_bytes.
    It watches torch.distributed's send and receive operations from below (a dispatch mode),
    and follows each storage they touch, whoever refers to it, until the storage is freed, as an
    allocator would (checked at every operation); what the ring's code says it holds plays no
    part. Processes only (a ThreadComm sends no such operation)."""

    P2P = ("c10d.send", "c10d.recv_", "c10d.recv_any_source_")

    def __init__(self, block_bytes):
        super().__init__()
        self.block_bytes, self.now, self.peak, self._live = block_bytes, 0, 0, {}

    @property
    def peak_blocks(self):
        return self.peak / self.block_bytes

    def _sweep(self):
        for key, (ref, nbytes) in list(self._live.items()):
            if ref.expired():
                del self._live[key]
                self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._sweep()
        if str(func.overloadpacket) in self.P2P:
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    if st.data_ptr() not in self._live:
                        self._live[st.data_ptr()] = (StorageWeakRef(st), st.nbytes())
                        self.now += st.nbytes()
            self.peak = max(self.peak, self.now)
        return func(*args, **(kwargs or {}))

    def __exit__(self, *exc):
        self._sweep()
        return super().__exit__(*exc)


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
