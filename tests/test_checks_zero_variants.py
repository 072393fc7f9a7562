"""The check of the ZeRO chapter's qwZ exercise (helpers/checks/zero.py) on the three
kinds of answers (tests/check_cases.py): the worked answer passes, shortcuts that gather in full
or half precision, use one scale per shard, drop the scales, or floor instead of rounding fail
naming the skipped step, and other right answers (the list form, float64, uint8) pass."""
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut, worked

import helpers


def _blocks(shard, block):
    n = shard.numel()
    return torch.cat([shard, shard.new_zeros(-n % block)]).view(-1, block)


def _gather(t, world):
    out = t.new_empty(world * t.numel())
    dist.all_gather_into_tensor(out, t.contiguous())
    return out


@worked("check_qwz_all_gather")
def qwz_all_gather(shard, block):
    world, n = dist.get_world_size(), shard.numel()
    x = _blocks(shard, block)
    scale = x.abs().amax(1) / 127
    q = torch.round(x / scale.clamp_min(1e-30)[:, None]).to(torch.int8)
    qs, ss = _gather(q.reshape(-1), world), _gather(scale, world)
    full = qs.view(world, -1, block).float() * ss.view(world, -1, 1)
    return full.view(world, -1)[:, :n].reshape(-1)


@other("check_qwz_all_gather", "list form, float64 arithmetic, uint8 offset by 128")
def qwz_all_gather_list(shard, block):
    world, n = dist.get_world_size(), shard.numel()
    x = _blocks(shard, block).double()
    scale = (x.abs().amax(1) / 127).float()
    q = (torch.round(x / scale.double().clamp_min(1e-30)[:, None]) + 128).to(torch.uint8)
    qs = [torch.empty_like(q) for _ in range(world)]
    ss = [torch.empty_like(scale) for _ in range(world)]
    dist.all_gather(qs, q)
    dist.all_gather(ss, scale)
    return torch.cat([((a.double() - 128) * s.double()[:, None]).reshape(-1)[:n]
                      for a, s in zip(qs, ss)]).float()


@other("check_qwz_all_gather", "the course's own pieces, written out")
def qwz_all_gather_flat(shard, block):
    world, n = dist.get_world_size(), shard.numel()
    q, s = _quantize(shard, block)
    qs, ss = _gather(q, world), _gather(s, world)
    return torch.cat([(qs.view(world, -1)[r].view(-1, block).float()
                       * ss.view(world, -1)[r][:, None]).reshape(-1)[:n] for r in range(world)])


def _quantize(shard, block):
    x = _blocks(shard, block)
    s = x.abs().amax(1) / 127
    return torch.round(x / s[:, None]).to(torch.int8).reshape(-1), s


@shortcut("check_qwz_all_gather", "gathers float32", "quantize before the all-gather")
def qwz_plain(shard, block):
    return _gather(shard, dist.get_world_size())


@shortcut("check_qwz_all_gather", "gathers bfloat16", "bfloat16 2")
def qwz_bf16(shard, block):
    return _gather(shard.bfloat16(), dist.get_world_size()).float()


@shortcut("check_qwz_all_gather", "one scale per shard", "a scale per block")
def qwz_one_scale(shard, block):
    world, n = dist.get_world_size(), shard.numel()
    x = _blocks(shard, block).reshape(-1)
    scale = x.abs().max().reshape(1) / 127
    q = torch.round(x / scale).to(torch.int8)
    qs, ss = _gather(q, world), _gather(scale, world)
    return (qs.view(world, -1).float() * ss.view(world, 1))[:, :n].reshape(-1)


@shortcut("check_qwz_all_gather", "scales not gathered", "gather each rank's scales")
def qwz_own_scales(shard, block):
    world, n = dist.get_world_size(), shard.numel()
    q, s = _quantize(shard, block)
    qs = _gather(q, world)
    return (qs.view(world, -1, block).float() * s.view(1, -1, 1)).view(world, -1)[:, :n] \
        .reshape(-1)


@shortcut("check_qwz_all_gather", "truncates instead of rounding", "round to the nearest")
def qwz_truncate(shard, block):
    world, n = dist.get_world_size(), shard.numel()
    x = _blocks(shard, block)
    scale = x.abs().amax(1) / 127
    q = (x / scale[:, None]).to(torch.int8)       # toward zero
    qs, ss = _gather(q.reshape(-1), world), _gather(scale, world)
    return (qs.view(world, -1, block).float() * ss.view(world, -1, 1)).view(world, -1)[:, :n] \
        .reshape(-1)


@shortcut("check_qwz_all_gather", "the course's quantized_all_gather",
          "helpers.quantized_all_gather")
def qwz_reference(shard, block):
    return helpers.quantized_all_gather(shard, dist.get_world_size(), block)


test_case = parametrize_cases(__name__)
