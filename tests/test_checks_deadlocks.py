"""A deadlock is the answer's failure, on every run, whichever rank finds it: one rank makes a
collective or a send the others never meet, or returns early, and the check fails the answer with
words naming each blocked rank's call and the ranks that returned without taking part, never
"the check itself failed" (helpers/runtime/thread_world.py raises it in the blocked rank's call;
helpers/checks/_core/waits.py makes it a CheckFailed)."""
import math
import time

import torch
import torch.distributed as dist
from check_cases import parametrize_cases, quiet, shortcut

import helpers.checks

RETURNED = "already returned"


@shortcut("check_pipeline_forward", "every rank sends on, the last back to rank 0 (a ring)",
          ["deadlock", RETURNED, "rank 0 returned without receiving it",
           "A send completes only once its peer receives it"])
def pf_ring_send(stage, comm, X, m, n, in_shape):
    r, p = comm.rank, comm.world
    rows = [len(c) for c in torch.arange(n).tensor_split(m)]
    outs = []
    with torch.no_grad():
        for j in range(m):
            h = X.tensor_split(m)[j] if r == 0 else comm.recv(r - 1, (rows[j], *in_shape), tag=j)
            out = stage(h)
            comm.send(out, (r + 1) % p, tag=j)
            outs.append(out)
    comm.wait()
    return torch.cat(outs) if r == p - 1 else None


@shortcut("check_dp_average", "rank 0 alone all-reduces one more tensor (a count to print)",
          ["deadlock", RETURNED, "rank 0 waits in all_reduce", "returned without calling it",
           "Every rank of a group must make the same collective calls"])
def dpa_rank0_extra(grads, comm):
    for g in grads:
        comm.all_reduce(g)
        g /= comm.world
    if comm.rank == 0:
        comm.all_reduce(torch.tensor([float(len(grads))]))


@shortcut("check_dp_average", "each rank stops creating dp groups once it made its own",
          ["deadlock", "waits in new_group", "ranks 0 and 3 returned without calling it",
           "dist.new_group is entered by every rank of the default group"])
def dpa_new_groups_until_own(grads, comm):
    world = dist.get_world_size()
    tp = world // comm.world
    for j in range(tp):                     # the ranks of column 0 never create the others
        mine = dist.new_group(list(range(j, world, tp)))
        if dist.get_rank() % tp == j:
            break
    for g in grads:
        dist.all_reduce(g, group=mine)
        g /= comm.world


@shortcut("check_gather_layer", "rank 0 alone gathers a second time",
          ["deadlock", RETURNED, "rank 0 waits in all_gather", "returned without calling it"])
def gl_rank0_twice(shard, shapes):
    w = dist.get_world_size()
    full = shard.new_empty(w * shard.numel())
    dist.all_gather_into_tensor(full, shard)
    if dist.get_rank() == 0:
        dist.all_gather_into_tensor(full.clone(), shard)
    sizes = [math.prod(s) for s in shapes]
    return [t.view(s) for t, s in zip(full[:sum(sizes)].split(sizes), shapes)]


@shortcut("check_clip_sharded", "a rank without shards returns before the all-reduce",
          ["deadlock", RETURNED, "waits in all_reduce", "returned without calling it"])
def cs_early_return_empty(shards, max_norm):
    if not shards:
        return torch.zeros(())
    sq = torch.zeros(())
    for p in shards:
        sq += p.grad.pow(2).sum()
    dist.all_reduce(sq)
    norm = sq.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in shards:
        p.grad.mul_(coef)
    return norm


test_case = parametrize_cases(__name__)


def test_a_deadlock_found_as_the_last_rank_returns_fails_the_answer():
    """Rank 0 blocks in an extra all-reduce before the others return (they sleep first): the
    last of them to return finds the deadlock, in the harness's code, and the verdict is still
    the answer's, with the deadlock's own words."""
    def late(grads, comm):
        for g in grads:
            comm.all_reduce(g)
            g /= comm.world
        if comm.rank == 0:
            comm.all_reduce(torch.ones(1))
        else:
            time.sleep(0.3)
    for _ in range(2):
        result = quiet(helpers.checks.check_dp_average, late)
        assert result.status == "failed", result
        assert result.message.startswith("deadlock: every rank still running is blocked"), result
        assert "rank 0 waits in all_reduce" in result.message, result
