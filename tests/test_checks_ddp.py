"""The checks of the torchrun chapter (helpers/checks/ddp_torchrun.py): the worked answers,
shortcuts of
different kinds (known cheats included: a sampler bound before the check runs, the
course's RNG restorer under another name), other right answers (tests/check_cases.py)."""
import random

import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut, worked
from torch.utils.data.distributed import DistributedSampler

import helpers


# ---- sampler_shard -----------------------------------------------------------------------------
@worked("check_sampler_shard")
def sampler_shard(n, rank, world_size, epoch, seed):
    g = torch.Generator().manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    per_rank = -(-n // world_size)
    padded = (perm * (world_size + 1))[:per_rank * world_size]   # repeat the first indices
    return padded[rank::world_size]


@other("check_sampler_shard", "a tensor, padding by slicing")
def sampler_shard_tensor(n, rank, world_size, epoch, seed):
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    total = world_size * ((n + world_size - 1) // world_size)
    while len(perm) < total:
        perm = torch.cat([perm, perm[:total - len(perm)]])
    return perm[rank:total:world_size]


@shortcut("check_sampler_shard", "the global generator reseeded", "global random state")
def sampler_shard_global_seed(n, rank, world_size, epoch, seed):
    torch.manual_seed(seed + epoch)
    perm = torch.randperm(n).tolist()
    per_rank = -(-n // world_size)
    return (perm * (world_size + 1))[:per_rank * world_size][rank::world_size]


_ITER = DistributedSampler.__iter__        # bound before any check patches it


@shortcut("check_sampler_shard", "__iter__ bound earlier", "compute the shard yourself")
def sampler_shard_bound(n, rank, world_size, epoch, seed):
    s = DistributedSampler.__new__(DistributedSampler)
    s.__dict__.update(dataset=range(n), num_replicas=world_size, rank=rank, epoch=epoch,
                      drop_last=False, shuffle=True, seed=seed,
                      num_samples=-(-n // world_size), total_size=world_size * -(-n // world_size))
    return list(_ITER(s))


@shortcut("check_sampler_shard", "the sampler itself", "compute the shard yourself")
def sampler_shard_sampler(n, rank, world_size, epoch, seed):
    s = DistributedSampler(range(n), num_replicas=world_size, rank=rank, seed=seed)
    s.set_epoch(epoch)
    return list(s)


@shortcut("check_sampler_shard", "ignores the epoch", "set_epoch")
def sampler_shard_epoch0(n, rank, world_size, epoch, seed):
    return sampler_shard(n, rank, world_size, 0, seed)


@shortcut("check_sampler_shard", "contiguous blocks", "contiguous block")
def sampler_shard_blocks(n, rank, world_size, epoch, seed):
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    per_rank = -(-n // world_size)
    padded = (perm * (world_size + 1))[:per_rank * world_size]
    return padded[rank * per_rank:(rank + 1) * per_rank]


@shortcut("check_sampler_shard", "no padding", "pads the permutation")
def sampler_shard_unpadded(n, rank, world_size, epoch, seed):
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    return perm[rank::world_size]


# ---- rank_loss ---------------------------------------------------------------------------------
@worked("check_rank_loss")
def rank_loss(losses, global_batch, world_size):
    return losses.sum() * world_size / global_batch


@other("check_rank_loss", "the mean weighted by the shard's share")
def rank_loss_share(losses, global_batch, world_size):
    return losses.mean() * (len(losses) * world_size / global_batch)


@shortcut("check_rank_loss", "the per-rank mean", "weight each rank")
def rank_loss_mean(losses, global_batch, world_size):
    return losses.mean()


@shortcut("check_rank_loss", "divides by the world size again", "times too small")
def rank_loss_small(losses, global_batch, world_size):
    return losses.sum() / global_batch


@shortcut("check_rank_loss", "a plain sum", "must be scaled")
def rank_loss_sum(losses, global_batch, world_size):
    return losses.sum()


@shortcut("check_rank_loss", "detached", "no gradient")
def rank_loss_detached(losses, global_batch, world_size):
    return (losses.sum() * world_size / global_batch).detach()


# ---- resume ------------------------------------------------------------------------------------
@worked("check_resume")
def resume(path, model, optimizer):
    snap = torch.load(path, weights_only=True)
    model.load_state_dict(snap["model"])
    optimizer.load_state_dict(snap["optimizer"])
    rng = snap["rng"][0]
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
    version, state, gauss = rng["python"]
    random.setstate((version, tuple(state), gauss))
    return snap["epoch"]


@other("check_resume", "map_location, numpy epoch")
def resume_other(path, model, optimizer):
    snap = torch.load(path, map_location="cpu", weights_only=True)
    for key, target in (("model", model), ("optimizer", optimizer)):
        target.load_state_dict(snap[key])
    torch.random.set_rng_state(torch.ByteTensor(snap["rng"][0]["torch"]))
    v, s, gauss = snap["rng"][0]["python"]
    random.setstate((v, tuple(s), gauss))
    return np.int64(snap["epoch"])


restore = helpers.set_rng_state           # the course's restorer under another name


@shortcut("check_resume", "set_rng_state renamed", "course's own answer")
def resume_renamed(path, model, optimizer):
    snap = torch.load(path, weights_only=True)
    model.load_state_dict(snap["model"])
    optimizer.load_state_dict(snap["optimizer"])
    restore(snap["rng"][0])
    return snap["epoch"]


@shortcut("check_resume", "the course's loader", "course's own answer")
def resume_loader(path, model, optimizer):
    return helpers.load_snapshot(path, model, optimizer)[0]


@shortcut("check_resume", "no RNG", "dropout would draw other masks")
def resume_no_rng(path, model, optimizer):
    snap = torch.load(path, weights_only=True)
    model.load_state_dict(snap["model"])
    optimizer.load_state_dict(snap["optimizer"])
    return snap["epoch"]


@shortcut("check_resume", "the last rank's RNG, not rank 0's", "rank 0's")
def resume_last_rank(path, model, optimizer):
    snap = torch.load(path, weights_only=True)
    model.load_state_dict(snap["model"])
    optimizer.load_state_dict(snap["optimizer"])
    rng = snap["rng"][-1]
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
    version, state, gauss = rng["python"]
    random.setstate((version, tuple(state), gauss))
    return snap["epoch"]


@shortcut("check_resume", "no optimizer state", "momentum buffers")
def resume_no_optimizer(path, model, optimizer):
    snap = torch.load(path, weights_only=True)
    model.load_state_dict(snap["model"])
    rng = snap["rng"][0]
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
    random.setstate((rng["python"][0], tuple(rng["python"][1]), rng["python"][2]))
    return snap["epoch"]


test_case = parametrize_cases(__name__)
