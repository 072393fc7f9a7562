"""What a rank does with the data it received is judged from the dataflow (tests/check_cases.py's
form), each shortcut with the words its refusal names:

1. received K/V blocks kept through arithmetic (`kv * 1.0`, `-kv`, `kv + 0.0`, `abs` with the
   sign aside, values read out of torch): check_ring_forward bounds everything a rank made from
   what it received, on 6 ranks against 4 (World.held_from_messages);
2. a decoy of the required collective beside a substitute that moves the data: every World
   check whose exercise is about one collective allows only it (`World(..., allow=...)`);
3. an operand whose values leave the result bitwise the same (`lerp(y, x, 0)`, `where` on an
   all-false mask, `y + x * 1e-30` rounded away, a clamp to zero): cancels.py runs the
   operation again with it changed, and the Recorder's dataflow does not follow it;
4. stand-ins of the right sizes sent by check_tokens_to_heads (its messages' contents).
"""

import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, raw_copy, shortcut

KEPT = "received K/V blocks alive at once"
ALLOWS = "this exercise allows only"
DECOR = "does not depend on what it received"


# ---- 1: received blocks kept through arithmetic ------------------------------------------------
def _ring_blocks(k, v, comm, keep):
    """Every K/V block round the ring, each kept as `keep(block)` (first its own)."""
    r, w = comm.rank, comm.world
    kv = torch.stack([k, v])
    held = [keep(kv)]
    for i in range(w - 1):
        comm.send(kv, (r + 1) % w, tag=i)
        kv = comm.recv((r - 1) % w, kv.shape, tag=i)
        held.append(keep(kv))
    comm.wait()
    return held


def _two_pass(q, held, unkeep):
    """A plain softmax over every kept block: the row maxima first, then the sums."""
    scale = 1 / q.shape[-1] ** 0.5
    top = None
    for h in held:
        m = (q @ unkeep(h)[0].transpose(-2, -1) * scale).amax(-1)
        top = m if top is None else torch.maximum(top, m)
    num, den = 0, 0
    for h in held:
        b = unkeep(h)
        p = torch.exp(q @ b[0].transpose(-2, -1) * scale - top[..., None])
        num, den = num + p @ b[1], den + p.sum(-1)
    return num / den[..., None]


@shortcut("check_ring_forward", "every block kept as kv * 1.0", KEPT)
def ring_keep_times_one(q, k, v, comm):
    return _two_pass(q, _ring_blocks(k, v, comm, lambda kv: kv * 1.0), lambda h: h)


@shortcut("check_ring_forward", "every block kept negated", KEPT)
def ring_keep_negated(q, k, v, comm):
    return _two_pass(q, _ring_blocks(k, v, comm, lambda kv: -kv), lambda h: -h)


@shortcut("check_ring_forward", "every block kept as kv + 0.0", KEPT)
def ring_keep_plus_zero(q, k, v, comm):
    return _two_pass(q, _ring_blocks(k, v, comm, lambda kv: kv + 0.0), lambda h: h)


@shortcut("check_ring_forward", "every block kept as its magnitude and sign", KEPT)
def ring_keep_abs(q, k, v, comm):
    held = _ring_blocks(k, v, comm, lambda kv: (kv.abs(), kv.sign()))
    return _two_pass(q, held, lambda h: h[0] * h[1])


@shortcut("check_ring_forward", "every block kept as Python lists", KEPT)
def ring_keep_lists(q, k, v, comm):
    held = _ring_blocks(k, v, comm, lambda kv: kv.tolist())
    return _two_pass(q, held, torch.tensor)


@other("check_ring_forward", "online softmax in float64")
def ring_online_float64(q, k, v, comm):
    r, w = comm.rank, comm.world
    qd, kv = q.double(), torch.stack([k, v])
    scale = qd.shape[-1] ** -0.5
    m = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float64)
    den, num = torch.zeros_like(m), torch.zeros_like(qd)
    for i in range(w):
        s = qd @ kv[0].double().transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        c, p = torch.exp(m - m_new), torch.exp(s - m_new[..., None])
        num, den, m = num * c[..., None] + p @ kv[1].double(), den * c + p.sum(-1), m_new
        if i < w - 1:
            comm.send(kv, (r + 1) % w, tag=i)
            kv = comm.recv((r - 1) % w, kv.shape, tag=i)
            comm.wait()
    return (num / den[..., None]).float()


# ---- 2: a decoy of the required collective beside a substitute ---------------------------------
@shortcut("check_grad_shard", "a decoy reduce-scatter, the whole gradients all-gathered", ALLOWS)
def grad_shard_decoy_gather(flat_grad):
    w, r = dist.get_world_size(), dist.get_rank()
    padded = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % w)])
    c = padded.numel() // w
    dist.reduce_scatter_tensor(torch.empty(c), padded)      # the decoy: its output dropped
    everyone = [torch.empty_like(padded) for _ in range(w)]
    dist.all_gather(everyone, padded)
    return sum(t[r * c:(r + 1) * c] for t in everyone) / w


@shortcut("check_gather_layer", "a decoy all-gather, zero-padded slots all-reduced", ALLOWS)
def gather_layer_decoy_all_reduce(shard, shapes):
    w, r, c = dist.get_world_size(), dist.get_rank(), shard.numel()
    dist.all_gather_into_tensor(torch.empty(w * c), shard)  # the decoy
    slots = torch.zeros(w * c)
    slots[r * c:(r + 1) * c] = shard
    dist.all_reduce(slots)
    sizes = [torch.Size(s).numel() for s in shapes]
    return [t.reshape(s) for t, s in zip(slots[:sum(sizes)].split(sizes), shapes)]


@shortcut("check_sync_bn_input_grad", "the sums all-gathered beside an empty all-reduce",
          ALLOWS)
def sync_bn_input_grad_gathered_sums(dy, x_hat, invstd, n):
    dist.all_reduce(torch.zeros(0))                          # the decoy: nothing in it
    sums = torch.cat([dy.sum(0), (dy * x_hat).sum(0)])
    every = [torch.empty_like(sums) for _ in range(dist.get_world_size())]
    dist.all_gather(every, sums)
    mean_dy, mean_dy_xhat = (sum(every) / n).chunk(2)
    return invstd * (dy - mean_dy - x_hat * mean_dy_xhat)


@shortcut("check_clip_sharded", "the squared norms all-gathered beside a decoy all-reduce",
          ALLOWS)
def clip_sharded_gathered_norms(shards, max_norm):
    dist.all_reduce(torch.zeros(1))                          # the decoy
    mine = sum((p.grad.double() ** 2).sum() for p in shards).reshape(1)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    norm = torch.cat(every).sum().sqrt()
    for p in shards:
        p.grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0).float())
    return float(norm)


# ---- 3: an operand whose values leave the result the same ---------------------------------------
_BOARD = torch.zeros(1 << 14)             # written through ctypes: provenance does not see it
_SLOT = 1 << 10


def _bucket(grads, mix):
    """Every rank's bucket posted on the board by ctypes, the all-reduce run, the mean made from
    the board and `mix(mean, received)` written back."""
    k, r = dist.get_world_size(), dist.get_rank()
    flat = torch.cat([g.reshape(-1) for g in grads]).detach().contiguous()
    raw_copy(_BOARD.data_ptr() + 4 * r * _SLOT, flat.data_ptr(), 4 * flat.numel())
    dist.all_reduce(flat)
    dist.barrier()
    n = flat.numel()
    mean = torch.stack([_BOARD[j * _SLOT:j * _SLOT + n].clone() for j in range(k)]).mean(0)
    out, off = mix(mean, flat), 0
    for g in grads:
        g.copy_(out[off:off + g.numel()].view_as(g))
        off += g.numel()


@shortcut("check_average_bucket", "the board's mean, lerp towards the received by 0", DECOR)
def average_bucket_lerp_zero(grads):
    _bucket(grads, lambda mean, got: torch.lerp(mean, got, 0.0))


@shortcut("check_average_bucket", "the board's mean, where on an all-false mask", DECOR)
def average_bucket_where_false(grads):
    _bucket(grads, lambda mean, got: torch.where(torch.zeros_like(got, dtype=torch.bool), got,
                                                 mean))


@shortcut("check_average_bucket", "the board's mean, the received times 1e-30", DECOR)
def average_bucket_tiny_weight(grads):
    _bucket(grads, lambda mean, got: mean + got * 1e-30)


@shortcut("check_average_bucket", "the board's mean, the received clamped to zero", DECOR)
def average_bucket_clamped(grads):
    _bucket(grads, lambda mean, got: mean + got.clamp(0, 0))


# ---- 4: stand-ins of the right sizes ------------------------------------------------------------
@shortcut("check_tokens_to_heads", "zeros of the right sizes sent, the tokens from a board",
          "stand-ins")
def tokens_to_heads_zeros(x, comm):
    w, r = comm.world, comm.rank
    per, flat = x.shape[1] // w, x.contiguous()
    raw_copy(_BOARD.data_ptr() + 4 * r * _SLOT, flat.data_ptr(), 4 * flat.numel())
    for j in range(w):         # sent after the board was written: a recv from j sees j's slot
        if j != r:
            comm.send(torch.zeros_like(x[:, j * per:(j + 1) * per]), j, tag=j)
    got = {j: comm.recv(j, x[:, :per].shape, tag=r) for j in range(w) if j != r}
    parts = [_BOARD[j * _SLOT:j * _SLOT + x.numel()].view(x.shape)[:, r * per:(r + 1) * per]
             + got.get(j, 0) for j in range(w)]
    comm.wait()
    return torch.cat(parts, dim=2)


test_case = parametrize_cases(__name__)
