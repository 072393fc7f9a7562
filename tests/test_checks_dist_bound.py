"""torch.distributed reached however the answer bound it: names imported before the check ran,
distributed_c10d's, a default argument, torch's older names, and threads a rank's answer
starts all reach the simulated world (dist_bound.py, carried.py); collectives it does not play
are refused by name, with the calls it plays, never with "call init_process_group"."""
import concurrent.futures
import threading
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from check_cases import other, parametrize_cases, shortcut
from torch.distributed import ReduceOp, all_reduce, get_world_size, reduce_scatter_tensor
from torch.distributed import distributed_c10d as c10d

import helpers.checks
from helpers.checks._core.dist_bound import unplayed


def _unflatten_into(grads, flat):
    o = 0
    for g in grads:
        g.copy_(flat[o:o + g.numel()].view_as(g))
        o += g.numel()


@other("check_average_bucket", "all_reduce imported before the check ran")
def average_bucket_from_import(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce(flat)
    _unflatten_into(grads, flat / get_world_size())


@shortcut("check_average_bucket", "all_reduce imported early, the sum left undivided",
          "divide by the world size")
def average_bucket_from_import_undivided(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce(flat)
    _unflatten_into(grads, flat)


@other("check_average_bucket", "all_reduce_coalesced of the one flat bucket")
def average_bucket_coalesced(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist.all_reduce_coalesced([flat])
    _unflatten_into(grads, flat / dist.get_world_size())


def _padded(flat_grad, w):
    padded = F.pad(flat_grad, (0, -flat_grad.numel() % w))
    return padded, padded.new_empty(padded.numel() // w)


@other("check_grad_shard", "distributed_c10d's reduce_scatter_tensor, imported early")
def grad_shard_c10d(flat_grad):
    w = c10d.get_world_size()
    padded, out = _padded(flat_grad, w)
    reduce_scatter_tensor(out, padded, op=ReduceOp.SUM) if w % 2 else \
        c10d.reduce_scatter_tensor(out, padded)
    return out / w


@other("check_grad_shard", "torch's pre-2.0 name, on a thread the rank starts")
def grad_shard_base_thread(flat_grad):
    w = dist.get_world_size()
    padded, out = _padded(flat_grad, w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = threading.Thread(target=dist._reduce_scatter_base, args=(out, padded))
        t.start()
        t.join()
    return out / w


@other("check_gather_layer", "all_gather_into_tensor bound as a default argument")
def gather_layer_default_arg(shard, shapes, _gather=dist.all_gather_into_tensor):
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    _gather(full, shard)
    out, o = [], 0
    for s in shapes:
        out.append(full[o:o + s.numel()].view(s))
        o += s.numel()
    return out


@other("check_clip_sharded", "the all-reduce on a pool's thread")
def clip_sharded_pool(shards, max_norm):
    sq = torch.zeros(())
    for p in shards:
        sq += p.grad.pow(2).sum()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(dist.all_reduce, sq).result()
    norm = sq.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in shards:
        p.grad.mul_(coef)
    return norm


test_case = parametrize_cases(__name__)


def test_a_collective_the_world_does_not_play_is_refused_by_name():
    def clip_sharded(shards, max_norm):
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, float(sum(p.grad.pow(2).sum() for p in shards)))
        coef = min(1.0, max_norm / (sum(every) ** 0.5 + 1e-6))
        for p in shards:
            p.grad.mul_(coef)
        return torch.tensor(sum(every) ** 0.5)
    result = helpers.checks.check_clip_sharded(clip_sharded)
    assert result.status == "failed", result
    assert "all_gather_object" in result.message and "dist.all_reduce" in result.message
    assert "init_process_group" not in result.message, result.message


def test_no_default_group_reads_as_the_calls_the_world_plays():
    error = ValueError("Default process group has not been initialized, please make sure to "
                       "call init_process_group.")
    words = str(unplayed(error))
    assert "dist.all_reduce" in words and "init_process_group" not in words, words
    other_error = ValueError("something else")
    assert unplayed(other_error) is other_error


def _flat_back(grads, flat):
    _unflatten_into(grads, flat / dist.get_world_size())


def test_a_process_group_method_or_private_helper_is_refused_naming_it():
    """The process group's own method (reached through `_get_default_group`) and
    `_coalescing_manager` are not played: the words name the call torch.distributed ran (a
    private one when no public one is on the traceback), not "a torch.distributed call"."""
    def average_bucket_group_method(grads):
        flat = torch.cat([g.reshape(-1) for g in grads])
        c10d._get_default_group().allreduce([flat]).wait()
        _flat_back(grads, flat)

    def average_bucket_coalescing(grads):
        flat = torch.cat([g.reshape(-1) for g in grads])
        with c10d._coalescing_manager():
            dist.all_reduce(flat)
        _flat_back(grads, flat)
    for answer, name in ((average_bucket_group_method, "distributed_c10d._get_default_group"),
                         (average_bucket_coalescing, "distributed_c10d._coalescing_manager")):
        result = helpers.checks.check_average_bucket(answer)
        assert result.status == "failed", result
        assert f"your code called torch.distributed.{name}," in result.message, result.message
        assert "dist.all_reduce" in result.message, result.message
