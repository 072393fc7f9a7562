"""Part V's ZeRO checks (helpers/checks/zero.py) on the three kinds of answers
(tests/check_cases.py): the notebooks' worked answers pass, shortcuts of two kinds or more
fail naming the skipped step (known cheats among them), and other right answers pass (an
exact optimum, the list form of reduce_scatter). FSDP's: test_checks_part5_fsdp_scratch.py and
test_checks_part5_fsdp2.py.
"""
import itertools

import numpy as np
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut, worked

import helpers


# ---- zero: Exercise 1 ---------------------------------------------------------------------------
@worked("check_partition")
def partition(sizes, world):
    load, owner = [0] * world, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        r = min(range(world), key=lambda r: load[r])
        owner[i] = r
        load[r] += sizes[i]
    return owner


@other("check_partition", "exact optimum by search on small cases, greedy otherwise")
def partition_exact(sizes, world):
    if len(sizes) <= 8:
        best = min(itertools.product(range(world), repeat=len(sizes)),
                   key=lambda own: max(sum(s for s, r in zip(sizes, own) if r == k)
                                       for k in range(world)))
        return np.array(best)       # numpy ranks
    return partition(sizes, world)


@shortcut("check_partition", "deals sorted tensors out in turn", "never looks at the loads")
def partition_sorted_round_robin(sizes, world):
    owner = [0] * len(sizes)
    for j, i in enumerate(sorted(range(len(sizes)), key=lambda i: -sizes[i])):
        owner[i] = j % world
    return owner


@shortcut("check_partition", "snake order", "never looks at the loads")
def partition_snake(sizes, world):
    owner = [0] * len(sizes)
    for j, i in enumerate(sorted(range(len(sizes)), key=lambda i: -sizes[i])):
        lap, pos = divmod(j, world)
        owner[i] = pos if lap % 2 == 0 else world - 1 - pos
    return owner


@shortcut("check_partition", "the course's partition_by_size", "helpers.partition_by_size")
def partition_reference(sizes, world):
    return helpers.partition_by_size(sizes, world)


@shortcut("check_partition", "contiguous runs", "least load")
def partition_contiguous(sizes, world):
    n = len(sizes)
    return [min(i * world // n, world - 1) for i in range(n)]


# ---- zero: Exercise 2 ---------------------------------------------------------------------------
@worked("check_zero1_optimizer")
def zero1_optimizer(params, rank, world, lr):
    owners = helpers.partition_by_size([p.numel() for p in params], world)
    mine = [p for p, r in zip(params, owners) if r == rank]
    return torch.optim.AdamW(mine, lr=lr)


@other("check_zero1_optimizer", "own greedy partition, explicit weight decay")
def zero1_optimizer_own(params, rank, world, lr):
    owners = partition([p.numel() for p in params], world)
    return torch.optim.AdamW([{"params": [p for p, r in zip(params, owners) if r == rank]}],
                             lr=lr, weight_decay=0.01)


@shortcut("check_zero1_optimizer", "all parameters", "about 1/world")
def zero1_all_params(params, rank, world, lr):
    return torch.optim.AdamW(params, lr=lr)


@shortcut("check_zero1_optimizer", "round-robin by index", "balance them by size")
def zero1_round_robin(params, rank, world, lr):
    return torch.optim.AdamW(params[rank::world], lr=lr)


@shortcut("check_zero1_optimizer", "a fixed learning rate", "learning rate")
def zero1_lr_ignored(params, rank, world, lr):
    return zero1_optimizer(params, rank, world, 123.0)


@shortcut("check_zero1_optimizer", "Adam with coupled L2", "AdamW")
def zero1_adam(params, rank, world, lr):
    owners = helpers.partition_by_size([p.numel() for p in params], world)
    return torch.optim.Adam([p for p, r in zip(params, owners) if r == rank], lr=lr,
                            weight_decay=0.01)


# ---- zero: Exercise 3 ---------------------------------------------------------------------------
@worked("check_grad_shard")
def grad_shard(flat_grad):
    world = dist.get_world_size()
    pad = flat_grad.new_zeros(-flat_grad.numel() % world)
    flat = torch.cat([flat_grad, pad])
    out = flat.new_empty(flat.numel() // world)
    dist.reduce_scatter_tensor(out, flat)
    return out / world


@other("check_grad_shard", "list form, async with wait")
def grad_shard_list(flat_grad):
    world = dist.get_world_size()
    flat = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % world)])
    out = flat.new_empty(flat.numel() // world)
    dist.reduce_scatter(out, list(flat.chunk(world)), async_op=True).wait()
    return out.div_(world)


@other("check_grad_shard", "the group of init_device_mesh's 1-D mesh (played by the world)")
def grad_shard_device_mesh(flat_grad):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    world = mesh.size()
    flat = torch.nn.functional.pad(flat_grad, (0, -flat_grad.numel() % world))
    out = flat.new_empty(flat.numel() // world)
    dist.reduce_scatter_tensor(out, flat, group=mesh.get_group("dp"))
    return out / mesh["dp"].size()


@shortcut("check_grad_shard", "all-reduce then slice", "twice what a reduce-scatter")
def grad_shard_allreduce(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    flat = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % world)])
    dist.all_reduce(flat)
    return flat.chunk(world)[rank] / world


@shortcut("check_grad_shard", "sum, not average", "divide by the world size")
def grad_shard_sum(flat_grad):
    world = dist.get_world_size()
    flat = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % world)])
    out = flat.new_empty(flat.numel() // world)
    dist.reduce_scatter_tensor(out, flat)
    return out


@shortcut("check_grad_shard", "async and never waited, read meanwhile",
          "wait() for the work before reading or writing its tensors")
def grad_shard_no_wait(flat_grad):
    world = dist.get_world_size()
    flat = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % world)])
    out = flat.new_zeros(flat.numel() // world)
    dist.reduce_scatter_tensor(out, flat, async_op=True)
    return out / world


# ---- zero: Exercise 5 (accumulation with Zero2; meets its refusal) -----------------------------
@worked("check_accumulate_zero2")
def accumulate_zero2(model, micro_batches):
    m = len(micro_batches)
    for i, (X, y) in enumerate(micro_batches):
        last = i == m - 1
        with model.no_sync() if not last else torch.enable_grad():
            loss = torch.nn.functional.cross_entropy(model(X), y) / m
            loss.backward()
    model.finish_gradient_synchronization()
    model.step()
    model.zero_grad()


@shortcut("check_accumulate_zero2", "every backward under no_sync (DDP and FSDP2 never reduce)",
          ["ran every backward under model.no_sync()", "Run the last backward outside no_sync()",
           "DDP and FSDP2 never synchronise"])
def accumulate_zero2_all_no_sync(model, micro_batches):
    with model.no_sync():
        for X, y in micro_batches:
            (torch.nn.functional.cross_entropy(model(X), y) / len(micro_batches)).backward()
    model.finish_gradient_synchronization()
    model.step()
    model.zero_grad()


@other("check_accumulate_zero2", "set_requires_gradient_sync, summed loss")
def accumulate_zero2_flag(model, micro_batches):
    model.set_requires_gradient_sync(False)
    for i, (X, y) in enumerate(micro_batches):
        if i == len(micro_batches) - 1:
            model.set_requires_gradient_sync(True)
        (torch.nn.functional.cross_entropy(model(X), y) * (1 / len(micro_batches))).backward()
    model.finish_gradient_synchronization()
    model.step()
    model.zero_grad()


@shortcut("check_accumulate_zero2", "a reduce-scatter per micro-batch", "one per micro-batch")
def accumulate_every(model, micro_batches):
    for X, y in micro_batches:
        (torch.nn.functional.cross_entropy(model(X), y) / len(micro_batches)).backward()
    model.finish_gradient_synchronization()
    model.step()
    model.zero_grad()


@shortcut("check_accumulate_zero2", "step without finish (Zero2 refuses)",
          "call finish_gradient_synchronization()")
def accumulate_no_finish(model, micro_batches):
    for i, (X, y) in enumerate(micro_batches):
        with model.no_sync() if i < len(micro_batches) - 1 else torch.enable_grad():
            (torch.nn.functional.cross_entropy(model(X), y) / len(micro_batches)).backward()
    model.step()


@shortcut("check_accumulate_zero2", "the last micro-batch only", "differs from one process")
def accumulate_last_only(model, micro_batches):
    X, y = micro_batches[-1]
    torch.nn.functional.cross_entropy(model(X), y).backward()
    model.finish_gradient_synchronization()
    model.step()
    model.zero_grad()


# ---- zero: Exercise 6 (mixed-precision bytes) ---------------------------------------------------
@worked("check_mixed_zero_bytes")
def mixed_zero_bytes(stage, k):
    weights, grads, state = 2, 2, 12
    level = ["dp", "zero1", "zero2", "zero3"].index(stage)
    return (weights / (k if level >= 3 else 1) + grads / (k if level >= 2 else 1)
            + state / (k if level >= 1 else 1))


@other("check_mixed_zero_bytes", "a table, numpy")
def mixed_zero_bytes_table(stage, k):
    return np.float64({"dp": 16, "zero1": 4 + 12 / k, "zero2": 2 + 14 / k,
                       "zero3": 16 / k}[stage])


@shortcut("check_mixed_zero_bytes", "float32 accounting", "4 + 4 + 8")
def mixed_zero_bytes_fp32(stage, k):
    return {"dp": 16, "zero1": 8 + 8 / k, "zero2": 4 + 12 / k, "zero3": 16 / k}[stage]


@shortcut("check_mixed_zero_bytes", "ZeRO-2 as ZeRO-1: the bf16 gradients not sharded",
          "2 bytes of bf16 gradients left whole")
def mixed_zero_bytes_zero2_grads_whole(stage, k):
    return {"dp": 16, "zero1": 4 + 12 / k, "zero2": 4 + 12 / k, "zero3": 16 / k}[stage]


@shortcut("check_mixed_zero_bytes", "everything sharded at every stage", "ZeRO-1 shards")
def mixed_zero_bytes_all_sharded(stage, k):
    return 16 / k if stage != "dp" else 16


@shortcut("check_mixed_zero_bytes", "the course's sharding_costs", "helpers.sharding_costs")
def mixed_zero_bytes_reference(stage, k):
    return helpers.sharding_costs(1, k, stage, "mixed_adam", 2)["total_bytes"]


test_case = parametrize_cases(__name__)
