"""Part V's checks (helpers/checks/zero.py, fsdp_scratch.py, fsdp2.py) on the three kinds of
answers (tests/check_cases.py): the notebooks' worked answers pass, shortcuts of two kinds or
more fail naming the skipped step (known cheats among them), and
other right answers pass (the list form of reduce_scatter, numpy numbers, an exact optimum)."""
import itertools

import numpy as np
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut, worked
from torch.utils.checkpoint import CheckpointPolicy, checkpoint

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


@shortcut("check_grad_shard", "async and never waited", "wrong values")
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


@shortcut("check_mixed_zero_bytes", "everything sharded at every stage", "ZeRO-1 shards")
def mixed_zero_bytes_all_sharded(stage, k):
    return 16 / k if stage != "dp" else 16


@shortcut("check_mixed_zero_bytes", "the course's sharding_costs", "helpers.sharding_costs")
def mixed_zero_bytes_reference(stage, k):
    return helpers.sharding_costs(1, k, stage, "mixed_adam", 2)["total_bytes"]


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
    flat = torch.zeros(size * world)
    flat[:n] = torch.cat([t.flatten() for t in tensors])
    return flat[rank * size:(rank + 1) * size].clone()


@shortcut("check_shard_flat", "unpadded shards", "must be equal")
def shard_unpadded(tensors, rank, world):
    return torch.cat([t.reshape(-1) for t in tensors]).tensor_split(world)[rank].clone()


@shortcut("check_shard_flat", "a piece of every tensor", "pad it once")
def shard_each_tensor(tensors, rank, world):
    return torch.cat([shard_flat([t], rank, world) for t in tensors])


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
    sq = torch.zeros(())
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


@shortcut("check_clip_sharded", "torch's clip on the local shards", "the norm of its own shards")
def clip_local(shards, max_norm):
    return torch.nn.utils.clip_grad_norm_(shards, max_norm)


@shortcut("check_clip_sharded", "gathers every gradient", "not the gradients")
def clip_gather(shards, max_norm):
    flat = torch.cat([p.grad.reshape(-1) for p in shards])
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


@shortcut("check_fsdp_units", "one unit for everything", "give each block a unit")
def fsdp_units_root_only(model):
    return [model]


@shortcut("check_fsdp_units", "blocks only (the embedding and head left out)", "in no unit")
def fsdp_units_blocks_only(model):
    return list(model.blocks)


# ---- fsdp2: Exercise 1 --------------------------------------------------------------------------
@worked("check_saved_bytes_of_call")
def saved_bytes_of_call(f, *inputs):
    params = {p.untyped_storage().data_ptr() for p in f.parameters()}
    seen = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params:
            seen[key] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    return sum(t.untyped_storage().nbytes() for t in seen.values())


@other("check_saved_bytes_of_call", "numpy total, list of storages")
def saved_bytes_of_call_numpy(f, *inputs):
    params = [p.untyped_storage().data_ptr() for p in f.parameters()]
    kept = []

    def pack(t):
        kept.append(t)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in kept}
    return np.int64(sum(v for k, v in sizes.items() if k not in params))


@shortcut("check_saved_bytes_of_call", "every pack call summed", "count each storage once")
def saved_every_call(f, *inputs):
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    return total


@shortcut("check_saved_bytes_of_call", "parameters counted", "leave out the storages")
def saved_with_params(f, *inputs):
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    return sum(t.untyped_storage().nbytes() for t in seen.values())


@shortcut("check_saved_bytes_of_call", "the output's size", "size of the output")
def saved_output_bytes(f, *inputs):
    out = f(*inputs)
    return out.numel() * out.element_size()


@shortcut("check_saved_bytes_of_call", "the course's saved_per_layer", "helpers.saved_per_layer")
def saved_reference(f, *inputs):
    return sum(helpers.saved_per_layer(torch.nn.Sequential(f), inputs[0]))


# ---- fsdp2: Exercise 2 --------------------------------------------------------------------------
@worked("check_checkpointed_forward")
def checkpointed_forward(blocks, x):
    for b in blocks:
        x = checkpoint(b, x, use_reentrant=False)
    return x


@other("check_checkpointed_forward", "functools.partial per block")
def checkpointed_forward_partial(blocks, x):
    import functools
    run = functools.partial(checkpoint, use_reentrant=False)
    for i in range(len(blocks)):
        x = run(blocks[i], x)
    return x


@shortcut("check_checkpointed_forward", "no checkpointing", "checkpoint each block")
def forward_plain(blocks, x):
    for b in blocks:
        x = b(x)
    return x


@shortcut("check_checkpointed_forward", "one checkpoint around every block", "all at once")
def forward_one_checkpoint(blocks, x):
    def run(x):
        for b in blocks:
            x = b(x)
        return x
    return checkpoint(run, x, use_reentrant=False)


@shortcut("check_checkpointed_forward", "reentrant checkpoint", "use_reentrant=False")
def forward_reentrant(blocks, x):
    for b in blocks:
        x = checkpoint(b, x, use_reentrant=True)
    return x


@shortcut("check_checkpointed_forward", "no graph", "has no gradient")
def forward_no_grad(blocks, x):
    with torch.no_grad():
        return forward_plain(blocks, x)


# ---- fsdp2: Exercise 3 --------------------------------------------------------------------------
def _kept(f, h):
    return saved_bytes_of_call_fn(f, h)


def saved_bytes_of_call_fn(f, h, params=()):
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            seen[t.untyped_storage().data_ptr()] = t
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(h)
    return sum(t.untyped_storage().nbytes() for t in seen.values())


@worked("check_choose_checkpoints")
def choose_checkpoints(blocks, x, budget):
    freed, left, h = [], 0, x
    for b in blocks:   # a checkpointed block still keeps its input
        ps = list(b.parameters())
        plain = saved_bytes_of_call_fn(b, h, ps)
        ckpt = saved_bytes_of_call_fn(lambda h, b=b: checkpoint(b, h, use_reentrant=False), h, ps)
        freed.append(plain - ckpt)
        left += plain
        h = b(h)
    chosen = []
    for i in sorted(range(len(blocks)), key=lambda i: -freed[i]):
        if left <= budget:
            break
        chosen.append(i)
        left -= freed[i]
    return chosen


@other("check_choose_checkpoints", "numpy indices")
def choose_checkpoints_numpy(blocks, x, budget):
    return np.array(choose_checkpoints(blocks, x, budget), dtype=np.int64)


@shortcut("check_choose_checkpoints", "every block", "suffice")
def checkpoint_all(blocks, x, budget):
    return list(range(len(blocks)))


@shortcut("check_choose_checkpoints", "by parameter count", "measure")
def checkpoint_by_params(blocks, x, budget):
    chosen = sorted(range(len(blocks)), key=lambda i: -sum(p.numel()
                                                            for p in blocks[i].parameters()))
    return chosen[:max(1, len(blocks) // 2)]


@shortcut("check_choose_checkpoints", "nothing", "over the budget")
def checkpoint_none(blocks, x, budget):
    return []


# ---- fsdp2: Exercise 4 (selective checkpointing) ------------------------------------------------
@worked("check_save_matmuls")
def save_matmuls(ctx, op, *args, **kwargs):
    aten = torch.ops.aten
    if op in (aten.mm.default, aten.addmm.default, aten.bmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


@other("check_save_matmuls", "by overload packet")
def save_matmuls_packet(ctx, op, *args, **kwargs):
    aten = torch.ops.aten
    matmul = op.overloadpacket in (aten.mm, aten.addmm, aten.bmm, aten.baddbmm)
    return CheckpointPolicy.MUST_SAVE if matmul else CheckpointPolicy.PREFER_RECOMPUTE


@shortcut("check_save_matmuls", "save everything", "recomputed no pointwise")
def save_everything(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE


@shortcut("check_save_matmuls", "recompute everything", "ran matrix products again")
def save_nothing(ctx, op, *args, **kwargs):
    return CheckpointPolicy.PREFER_RECOMPUTE


# ---- fsdp2: Exercise 6 (resume from a DCP checkpoint) -----------------------------------------
@worked("check_dcp_resume")
def dcp_resume(model, optimizer, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


@other("check_dcp_resume", "a Stateful app state")
def dcp_resume_stateful(model, optimizer, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.stateful import Stateful

    class App(Stateful):
        def state_dict(self):
            m, o = get_state_dict(model, optimizer)
            return {"model": m, "optim": o}

        def load_state_dict(self, sd):
            set_state_dict(model, optimizer, model_state_dict=sd["model"],
                           optim_state_dict=sd["optim"])
    app = App()
    state = app.state_dict()
    dcp.load(state, checkpoint_id=path)
    app.load_state_dict(state)


@shortcut("check_dcp_resume", "the model only", "moments did not come back")
def dcp_resume_model_only(model, optimizer, path):
    import torch.distributed.checkpoint as dcp
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["model"])


@shortcut("check_dcp_resume", "torch.load of the folder", "your code raised")
def dcp_resume_torch_load(model, optimizer, path):
    sd = torch.load(path)
    model.load_state_dict(sd["model"])


test_case = parametrize_cases(__name__)
