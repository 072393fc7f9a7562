"""The checks of the torchrun chapter's exercises (helpers/checks/ddp.py): the worked solutions
pass, stubs report "not done", and answers that skip the concept fail with a specific message."""
import random

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

import helpers
from helpers.checks import check_rank_loss, check_resume, check_sampler_shard


# The worked solutions, as the notebook has them between the nbgrader markers.
def sampler_shard(n, rank, world_size, epoch, seed):
    ### BEGIN SOLUTION
    g = torch.Generator().manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    per_rank = -(-n // world_size)
    padded = (perm * (world_size + 1))[:per_rank * world_size]   # repeat the first indices
    return padded[rank::world_size]
    ### END SOLUTION


def rank_loss(losses, global_batch, world_size):
    ### BEGIN SOLUTION
    return losses.sum() * world_size / global_batch
    ### END SOLUTION


def resume(path, model, optimizer):
    ### BEGIN SOLUTION
    snap = torch.load(path, weights_only=True)
    model.load_state_dict(snap["model"])
    optimizer.load_state_dict(snap["optimizer"])
    rng = snap["rng"][0]                               # this rank's (one process: rank 0)
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
    version, state, gauss = rng["python"]
    random.setstate((version, tuple(state), gauss))
    return snap["epoch"]
    ### END SOLUTION


def stub(*args):
    raise NotImplementedError()


def failed(result, words):
    return result.status == "failed" and words in result.message


@pytest.mark.parametrize("check,solution", [(check_sampler_shard, sampler_shard),
                                            (check_rank_loss, rank_loss),
                                            (check_resume, resume)])
def test_solution_passes_and_stub_is_not_done(check, solution):
    assert check(solution).passed
    assert check(stub).status == "not done"


def test_sampler_shard_wrong_answers():
    def unpadded(n, rank, w, epoch, seed):
        g = torch.Generator().manual_seed(seed + epoch)
        return torch.randperm(n, generator=g)[rank::w].tolist()

    def no_epoch(n, rank, w, epoch, seed):
        return sampler_shard(n, rank, w, 0, seed)

    def contiguous(n, rank, w, epoch, seed):
        full = sampler_shard(n, 0, 1, epoch, seed)
        per = -(-n // w)
        return (full * 2)[rank * per:(rank + 1) * per]

    def library(n, rank, w, epoch, seed):
        s = DistributedSampler(range(n), num_replicas=w, rank=rank, seed=seed)
        s.set_epoch(epoch)
        return list(s)
    assert failed(check_sampler_shard(unpadded), "pads")
    assert failed(check_sampler_shard(no_epoch), "seed + epoch")
    assert failed(check_sampler_shard(contiguous), "contiguous block")
    assert failed(check_sampler_shard(library), "compute the shard yourself")


def test_rank_loss_wrong_answers():
    assert failed(check_rank_loss(lambda l, n, w: l.mean()), "same number of examples")
    assert failed(check_rank_loss(lambda l, n, w: l.sum() / n), "already divides")
    assert failed(check_rank_loss(lambda l, n, w: l.sum()), "times too large")
    assert failed(check_rank_loss(lambda l, n, w: (l.sum() * w / n).detach()), "no gradient")


def test_resume_wrong_answers():
    def model_only(path, model, optimizer):
        snap = torch.load(path, weights_only=True)
        model.load_state_dict(snap["model"])
        return snap["epoch"]

    def no_rng(path, model, optimizer):
        snap = torch.load(path, weights_only=True)
        model.load_state_dict(snap["model"])
        optimizer.load_state_dict(snap["optimizer"])
        return snap["epoch"]

    def no_python_rng(path, model, optimizer):
        snap = torch.load(path, weights_only=True)
        model.load_state_dict(snap["model"])
        optimizer.load_state_dict(snap["optimizer"])
        torch.set_rng_state(torch.tensor(snap["rng"][0]["torch"], dtype=torch.uint8))
        return snap["epoch"]

    def library(path, model, optimizer):
        return helpers.load_snapshot(path, model, optimizer)[0]
    assert failed(check_resume(model_only), "momentum")
    assert failed(check_resume(no_rng), "torch's RNG")
    assert failed(check_resume(no_python_rng), "Python's random")
    assert failed(check_resume(library), "restore it yourself")
