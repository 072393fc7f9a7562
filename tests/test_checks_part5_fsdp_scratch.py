"""Part V's FSDP-from-scratch checks (helpers/checks/fsdp_scratch.py) on the three kinds of answers
(tests/check_cases.py): the notebooks' worked answers pass, shortcuts of two kinds or more
fail naming the skipped step (known cheats among them), and other right answers pass.
"""

import numpy as np
import pytest
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut, worked

import helpers


# ---- fsdp_scratch: Exercise 1 -------------------------------------------------------------------
@worked("check_shard_flat")
def shard_flat(tensors, rank, world):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    flat = torch.cat([flat, flat.new_zeros(-flat.numel() % world)])
    return flat.chunk(world)[rank].clone()


@other("check_shard_flat", "arithmetic slice of a padded copy")
def shard_flat_slice(tensors, rank, world):
    n = sum(t.numel() for t in tensors)
    size = -(-n // world)
    flat = torch.zeros(size * world, dtype=tensors[0].dtype)
    flat[:n] = torch.cat([t.flatten() for t in tensors])
    return flat[rank * size:(rank + 1) * size].clone()


@shortcut("check_shard_flat", "padded with torch.zeros' float32 default", "bfloat16 input")
def shard_flat_float32_pad(tensors, rank, world):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    flat = torch.cat([flat, torch.zeros(-flat.numel() % world)])
    return flat.chunk(world)[rank].clone()


@shortcut("check_shard_flat", "unpadded shards", "must be equal")
def shard_unpadded(tensors, rank, world):
    return torch.cat([t.reshape(-1) for t in tensors]).tensor_split(world)[rank].clone()


@shortcut("check_shard_flat", "a piece of every tensor", "pad it once")
def shard_each_tensor(tensors, rank, world):
    return torch.cat([shard_flat([t], rank, world) for t in tensors])


@shortcut("check_shard_flat", "a view of the whole padded vector", ["a view", ".clone()"])
def shard_view_of_padded(tensors, rank, world):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    flat = torch.cat([flat, flat.new_zeros(-flat.numel() % world)])
    s = flat.numel() // world
    return flat[rank * s:(rank + 1) * s]


@shortcut("check_shard_flat", "a narrow of F.pad's vector", ["a view", ".clone()"])
def shard_narrow_of_padded(tensors, rank, world):
    flat = torch.nn.functional.pad(torch.cat([t.reshape(-1) for t in tensors]),
                                   (0, -sum(t.numel() for t in tensors) % world))
    return flat.narrow(0, rank * (flat.numel() // world), flat.numel() // world)


@other("check_shard_flat", "the slice copied into a tensor of its own")
def shard_flat_copied(tensors, rank, world):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    s = -(-flat.numel() // world)
    out = flat.new_zeros(s)
    mine = flat[rank * s:(rank + 1) * s]
    out[:mine.numel()] = mine
    return out


@shortcut("check_shard_flat", "the course's flat_shard", "helpers.flat_shard")
def shard_reference(tensors, rank, world):
    return helpers.flat_shard(tensors, rank, world)


# ---- fsdp_scratch: Exercise 2 -------------------------------------------------------------------
@worked("check_gather_layer")
def gather_layer(shard, shapes):
    world = dist.get_world_size()
    full = shard.new_empty(shard.numel() * world)
    dist.all_gather_into_tensor(full, shard)
    out, offset = [], 0
    for s in shapes:
        out.append(full[offset:offset + s.numel()].view(s))
        offset += s.numel()
    return out


@other("check_gather_layer", "list form of all_gather")
def gather_layer_list(shard, shapes):
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, shard)
    flat = torch.cat(parts)
    sizes = [s.numel() for s in shapes]
    pieces = flat[:sum(sizes)].split(sizes)
    return [p.reshape(s) for p, s in zip(pieces, shapes)]


@shortcut("check_gather_layer", "broadcast from every rank", "used broadcast")
def gather_broadcast(shard, shapes):
    world = dist.get_world_size()
    parts = []
    for src in range(world):
        t = shard.clone()
        dist.broadcast(t, src=src)
        parts.append(t)
    return gather_split(torch.cat(parts), shapes)


def gather_split(full, shapes):
    out, offset = [], 0
    for s in shapes:
        out.append(full[offset:offset + s.numel()].view(s))
        offset += s.numel()
    return out


@shortcut("check_gather_layer", "redundant all-gathers", "one all-gather")
def gather_five_times(shard, shapes):
    for _ in range(4):
        gather_layer(shard, shapes)
    return gather_layer(shard, shapes)


@shortcut("check_gather_layer", "no communication", "did not all-gather")
def gather_local_only(shard, shapes):
    world = dist.get_world_size()
    return gather_split(torch.cat([shard] * world), shapes)


# ---- fsdp_scratch: Exercise 3 -------------------------------------------------------------------
@worked("check_zero3_sent_bytes")
def zero3_sent_bytes(layers, world):
    shard = 0
    for layer in layers:
        n = sum(p.numel() for p in layer.parameters())
        shard += -(-n // world)
    return 3 * (world - 1) * shard * 4


@other("check_zero3_sent_bytes", "numpy int64")
def zero3_sent_bytes_numpy(layers, world):
    counts = np.array([sum(p.numel() for p in m.parameters()) for m in layers])
    return np.int64(3 * (world - 1) * 4) * np.ceil(counts / world).astype(np.int64).sum()


@shortcut("check_zero3_sent_bytes", "data parallelism's figure", "data parallelism")
def zero3_like_dp(layers, world):
    n = sum(p.numel() for m in layers for p in m.parameters())
    return 2 * (world - 1) / world * n * 4


@shortcut("check_zero3_sent_bytes", "whole shards per collective", "k-1 shards")
def zero3_whole_shards(layers, world):
    return 3 * world * sum(-(-sum(p.numel() for p in m.parameters()) // world)
                           for m in layers) * 4


@shortcut("check_zero3_sent_bytes", "no padding", "padding")
def zero3_unpadded(layers, world):
    n = sum(p.numel() for m in layers for p in m.parameters())
    return 3 * (world - 1) / world * n * 4


@shortcut("check_zero3_sent_bytes", "pads the total, not each layer", "pads the total")
def zero3_padded_total(layers, world):
    n = sum(p.numel() for m in layers for p in m.parameters())
    return 3 * (world - 1) * -(-n // world) * 4


# ---- fsdp_scratch: Exercise 4 (clip over shards) ------------------------------------------------
@worked("check_clip_sharded")
def clip_sharded(shards, max_norm):
    if shards:
        device = shards[0].grad.device
    elif dist.get_backend() == "nccl":   # no shard: NCCL sends from a GPU
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    sq = torch.zeros((), device=device)
    for p in shards:
        sq += p.grad.pow(2).sum()
    dist.all_reduce(sq)
    norm = sq.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in shards:
        p.grad.mul_(coef)
    return norm


@other("check_clip_sharded", "float64 sum, Python float")
def clip_sharded_float(shards, max_norm):
    sq = torch.tensor([sum(float(p.grad.double().pow(2).sum()) for p in shards)],
                      dtype=torch.float64)
    dist.all_reduce(sq, op=dist.ReduceOp.SUM)
    norm = float(sq.sqrt())
    if norm > max_norm:
        for p in shards:
            p.grad *= max_norm / (norm + 1e-6)
    return norm


@shortcut("check_clip_sharded", "the squares stacked: a rank that owns no shard cannot stack",
          ["raised RuntimeError", "stack"])
def clip_stacked(shards, max_norm):
    sq = torch.stack([p.grad.pow(2).sum() for p in shards]).sum()
    dist.all_reduce(sq)
    norm = sq.sqrt()
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for p in shards:
        p.grad.mul_(coef)
    return norm


@shortcut("check_clip_sharded", "torch's clip on the local shards", "the norm of its own shards")
def clip_local(shards, max_norm):
    return torch.nn.utils.clip_grad_norm_(shards, max_norm)


@shortcut("check_clip_sharded", "gathers every gradient", "not the gradients")
def clip_gather(shards, max_norm):
    flat = torch.cat([p.grad.reshape(-1) for p in shards] + [torch.zeros(0)])   # none: empty
    sizes = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([float(flat.numel())]))
    parts = [torch.zeros(int(s)) for s in sizes]
    biggest = max(int(s) for s in sizes)
    padded = torch.cat([flat, flat.new_zeros(biggest - flat.numel())])
    out = [torch.zeros(biggest) for _ in parts]
    dist.all_gather(out, padded)
    norm = torch.cat(out).norm()
    coef = min(1.0, max_norm / (float(norm) + 1e-6))
    for p in shards:
        p.grad.mul_(coef)
    return norm


@shortcut("check_clip_sharded", "the course's clip", "helpers.clip_sharded_grad_norm_")
def clip_reference(shards, max_norm):
    return helpers.clip_sharded_grad_norm_(shards, max_norm)


# ---- fsdp_scratch: Exercise 5 (units for tied weights; meets the refusal) -----------------------
@worked("check_fsdp_units")
def fsdp_units(model):
    return [*model.blocks, model]


@other("check_fsdp_units", "each block's Linear, then the root")
def fsdp_units_linears(model):
    return [b[0] for b in model.blocks] + [model]


@shortcut("check_fsdp_units", "the default units (FSDPFromScratch refuses)", "tied weights")
def fsdp_units_default(model):
    return None


@shortcut("check_fsdp_units", "the blocks and the embedding: the tied head left outside",
          ["embed.weight and head.weight are one tied weight", "head holds it outside"])
def fsdp_units_blocks_embed(model):
    return [*model.blocks, model.embed]


@shortcut("check_fsdp_units", "one unit for everything", "give each block a unit")
def fsdp_units_root_only(model):
    return [model]


@shortcut("check_fsdp_units", "blocks only (the embedding and head left out)", "in no unit")
def fsdp_units_blocks_only(model):
    return list(model.blocks)


test_case = parametrize_cases(__name__)


def test_units_that_leave_a_tied_weights_other_holder_outside_are_refused():
    """FSDPFromScratch's units (helpers/sharding/flat.py): a tied weight whose other holder is
    outside the unit sharding it would stay whole and unsynchronised there, so it is refused
    before any work, naming both names and the fix; a unit holding both is accepted."""
    from helpers.checks.fsdp_scratch import TiedLM
    from helpers.sharding.flat import unit_parameters
    model = TiedLM(11, 8, 2)
    for units, inside, outside in (([*model.blocks, model.embed], "embed", "head"),
                                   ([*model.blocks, model.head], "head", "embed")):
        with pytest.raises(ValueError) as info:
            unit_parameters(model, units)
        words = str(info.value)
        assert "embed.weight and head.weight are one tied weight" in words, words
        assert f"sharded by the unit {inside}" in words and f"but {outside} holds it" in words
        assert "one unit holding every module that shares it" in words, words
    groups = unit_parameters(model, [*model.blocks, model])
    assert sum(len(names) for _, names in groups) == len(list(model.parameters()))
