"""Bytes a rank received in a message are its own to reinterpret (helpers/checks/_core/arrived.py):
a qwZ answer that packs its int8 values and its float scales' bytes into one all-gather and reads
the scales back with `.view(torch.float32)` (or numpy's view) passes, even after writing the
received buffer (an in-place clamp, its own slot rewritten: what arrived is kept as delivered),
while floats made from bits that another rank left in a global still fail, whether viewed alone,
concatenated with what arrived, copied into a received buffer before the view, or spliced into a
numpy copy of it (tests/check_cases.py)."""
import numpy as np
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut

READ = "made floats from the bits of another dtype"
_BOARD = {}


def _quantized(shard, block):
    """(int8 values, float32 scales, blocks) of `shard`, as the worked answer quantizes."""
    n = shard.numel()
    x = torch.cat([shard, shard.new_zeros(-n % block)]).view(-1, block)
    scale = x.abs().amax(1) / 127
    return torch.round(x / scale.clamp_min(1e-30)[:, None]).to(torch.int8), scale, x.shape[0]


def _dequantized(qs, ss, world, n):
    """The world's shards from gathered int8 values (world, nb, block) and scales (world, nb)."""
    return (qs.float() * ss[..., None]).reshape(world, -1)[:, :n].reshape(-1)


@other("check_qwz_all_gather", "one all-gather: int8 values and the scales' bytes packed")
def qwz_packed(shard, block):
    world, n = dist.get_world_size(), shard.numel()
    q, scale, nb = _quantized(shard, block)
    buf = torch.cat([q.reshape(-1), scale.contiguous().view(torch.int8)])
    got = buf.new_empty(world * buf.numel())
    dist.all_gather_into_tensor(got, buf)
    got = got.view(world, -1)
    qs = got[:, :q.numel()].reshape(world, nb, -1)
    ss = got[:, q.numel():].contiguous().view(torch.float32)
    return _dequantized(qs, ss, world, n)


@other("check_qwz_all_gather", "one all-gather into a list, each rank's scales viewed in place")
def qwz_packed_list(shard, block):
    world, n = dist.get_world_size(), shard.numel()
    q, scale, nb = _quantized(shard, block)
    buf = torch.cat([scale.contiguous().view(torch.uint8), q.reshape(-1).view(torch.uint8)])
    parts = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(parts, buf)
    ss = torch.stack([p[:4 * nb].view(torch.float32) for p in parts])
    qs = torch.stack([p[4 * nb:].view(torch.int8).view(nb, -1) for p in parts])
    return _dequantized(qs, ss, world, n)


def _packed_gather(shard, block):
    """(q's numel, blocks, the (world, packed) int8 buffer of every rank's values and scales)."""
    world = dist.get_world_size()
    q, scale, nb = _quantized(shard, block)
    buf = torch.cat([q.reshape(-1), scale.contiguous().view(torch.int8)])
    got = buf.new_empty(world * buf.numel())
    dist.all_gather_into_tensor(got, buf)
    return q.numel(), nb, got.view(world, -1), buf


@other("check_qwz_all_gather", "packed; the received int8 values clamped in place, then the "
       "scales viewed")
def qwz_packed_clamped_in_place(shard, block):
    world, n = dist.get_world_size(), shard.numel()
    m, nb, got, _ = _packed_gather(shard, block)
    got[:, :m].clamp_(-127, 127)            # a write of the rank's own to what arrived
    ss = got[:, m:].contiguous().view(torch.float32)
    return _dequantized(got[:, :m].reshape(world, nb, -1), ss, world, n)


@other("check_qwz_all_gather", "packed; the rank's own slot rewritten with its own bytes")
def qwz_packed_own_slot_rewritten(shard, block):
    world, n = dist.get_world_size(), shard.numel()
    m, nb, got, buf = _packed_gather(shard, block)
    got[dist.get_rank()].copy_(buf)
    ss = got[:, m:].contiguous().view(torch.float32)
    return _dequantized(got[:, :m].reshape(world, nb, -1), ss, world, n)


@other("check_qwz_all_gather", "packed; the scales read through numpy's float32 view")
def qwz_packed_numpy_view(shard, block):
    world, n = dist.get_world_size(), shard.numel()
    m, nb, got, _ = _packed_gather(shard, block)
    ss = torch.stack([torch.from_numpy(row[m:].numpy().view(np.float32).copy()) for row in got])
    return _dequantized(got[:, :m].reshape(world, nb, -1), ss, world, n)


def _board_scales(scale, r):
    """Rank `r`'s scales' bytes left in a module global (read after the all-gather that
    follows: every rank's are there by then), each made a plain int: bytes are too small to
    fingerprint, so only the rule on floats made from bits stands in the way."""
    _BOARD[(id(_BOARD), r)] = [(0).__add__(b)
                               for b in scale.contiguous().view(torch.uint8).tolist()]


@shortcut("check_qwz_all_gather", "int8 values gathered, scales' bits read from a global, "
          "concatenated with what arrived before the view", READ)
def qwz_scales_on_board_concatenated(shard, block):
    world, r, n = dist.get_world_size(), dist.get_rank(), shard.numel()
    q, scale, nb = _quantized(shard, block)
    _board_scales(scale, r)
    got = q.new_empty(world * q.numel())
    dist.all_gather_into_tensor(got, q.reshape(-1))
    bits = torch.tensor([b for s in range(world) for b in _BOARD[(id(_BOARD), s)]],
                        dtype=torch.uint8).view(torch.int8)
    packed = torch.cat([got, bits]).view(torch.uint8)       # arrived and smuggled, one tensor
    ss = packed[got.numel():].contiguous().view(torch.float32).view(world, nb)
    return _dequantized(got.view(world, nb, -1), ss, world, n)


def _gathered_with_room(shard, block):
    """(world, q, nb, got): each rank's int8 blocks gathered with room for its scales left
    zero (the scales' bits put on the global board, not sent)."""
    world, r = dist.get_world_size(), dist.get_rank()
    q, scale, nb = _quantized(shard, block)
    _board_scales(scale, r)
    buf = torch.cat([q.reshape(-1), torch.zeros(4 * nb, dtype=torch.int8)])   # room only
    got = buf.new_empty(world * buf.numel())
    dist.all_gather_into_tensor(got, buf)
    return world, q, nb, got


@shortcut("check_qwz_all_gather", "scales' bits read from a global, copied into a received "
          "buffer before the view", READ)
def qwz_scales_copied_into_received(shard, block):
    world, q, nb, got = _gathered_with_room(shard, block)
    got = got.view(world, -1)
    for s in range(world):
        got[s, q.numel():] = torch.tensor(_BOARD[(id(_BOARD), s)],
                                          dtype=torch.uint8).view(torch.int8)
    ss = got[:, q.numel():].contiguous().view(torch.float32)
    return _dequantized(got[:, :q.numel()].reshape(world, nb, -1), ss, world, shard.numel())


@shortcut("check_qwz_all_gather", "scales' bits read from a global, spliced into a numpy copy "
          "of what arrived before the view", READ)
def qwz_scales_spliced_into_numpy_copy(shard, block):
    world, q, nb, got = _gathered_with_room(shard, block)
    rows = got.view(world, -1).numpy().copy()
    for s in range(world):
        rows[s, q.numel():] = np.array(_BOARD[(id(_BOARD), s)], dtype=np.uint8).view(np.int8)
    got = torch.from_numpy(rows)
    ss = got[:, q.numel():].contiguous().view(torch.float32)
    return _dequantized(got[:, :q.numel()].reshape(world, nb, -1), ss, world, shard.numel())


test_case = parametrize_cases(__name__)
