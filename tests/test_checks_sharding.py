"""The checks of Part V (helpers/checks/sharding.py): the reference solutions
pass, a stub reports "not done", and answers that skip the concept fail with their message."""
import pytest
import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

import helpers
from helpers.checks import (
    check_choose_checkpoints,
    check_checkpointed_forward,
    check_gather_layer,
    check_grad_shard,
    check_partition,
    check_saved_bytes_of_call,
    check_shard_flat,
    check_zero1_optimizer,
    check_zero3_sent_bytes,
)


# The reference solutions, as the notebooks have them between the nbgrader markers.


def partition(sizes, world):
    load, owner = [0] * world, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        r = min(range(world), key=lambda r: load[r])
        owner[i] = r
        load[r] += sizes[i]
    return owner


def zero1_optimizer(params, rank, world, lr):
    owners = helpers.partition_by_size([p.numel() for p in params], world)
    mine = [p for p, r in zip(params, owners) if r == rank]
    return torch.optim.AdamW(mine, lr=lr)


def grad_shard(flat_grad):
    world = dist.get_world_size()
    flat = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % world)])
    out = flat.new_empty(flat.numel() // world)
    dist.reduce_scatter_tensor(out, flat)
    return out / world


def shard_flat(tensors, rank, world):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    flat = torch.cat([flat, flat.new_zeros(-flat.numel() % world)])
    return flat.chunk(world)[rank].clone()


def gather_layer(shard, shapes):
    world = dist.get_world_size()
    full = shard.new_empty(shard.numel() * world)
    dist.all_gather_into_tensor(full, shard)
    out, offset = [], 0
    for s in shapes:
        out.append(full[offset:offset + s.numel()].view(s))
        offset += s.numel()
    return out


def zero3_sent_bytes(layers, world):
    shard = 0   # elements of this rank's padded flat shards, one per layer
    for layer in layers:
        n = sum(p.numel() for p in layer.parameters())
        shard += -(-n // world)
    return 3 * (world - 1) * shard * 4


def saved_bytes(f, *inputs):
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    return total


def checkpointed_forward(blocks, x):
    for b in blocks:
        x = checkpoint(b, x, use_reentrant=False)
    return x


def choose_checkpoints(blocks, x, budget):
    def kept(f, h):   # bytes autograd saves while f(h) runs
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            f(h)
        return total

    freed, left, h = [], 0, x
    for b in blocks:   # a checkpointed block still keeps its input
        plain = kept(b, h)
        ckpt = kept(lambda h: checkpoint(b, h, use_reentrant=False), h)
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


def stub(*args):
    raise NotImplementedError()


# Answers that look right but skip the idea.


def partition_round_robin(sizes, world):
    return [i % world for i in range(len(sizes))]


def partition_contiguous(sizes, world):
    return [i * world // len(sizes) for i in range(len(sizes))]


def zero1_all_params(params, rank, world, lr):
    return torch.optim.AdamW(params, lr=lr)


def zero1_round_robin(params, rank, world, lr):
    return torch.optim.AdamW(params[rank::world], lr=lr)


def grad_shard_allreduce(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    flat = torch.cat([flat_grad, flat_grad.new_zeros(-flat_grad.numel() % world)])
    dist.all_reduce(flat)
    return flat.chunk(world)[rank] / world


def grad_shard_sum(flat_grad):
    return grad_shard(flat_grad) * dist.get_world_size()


def shard_unpadded(tensors, rank, world):
    return torch.cat([t.reshape(-1) for t in tensors]).tensor_split(world)[rank].clone()


def shard_each_tensor(tensors, rank, world):
    return torch.cat([shard_flat([t], rank, world) for t in tensors])


def gather_broadcast(shard, shapes):
    world = dist.get_world_size()
    full = torch.cat([shard] * world)
    dist.broadcast(full, src=0)
    return gather_split(full, shapes)


def gather_split(full, shapes):
    out, offset = [], 0
    for s in shapes:
        out.append(full[offset:offset + s.numel()].view(s))
        offset += s.numel()
    return out


def gather_local_only(shard, shapes):
    world = dist.get_world_size()
    return gather_split(torch.cat([shard] * world), shapes)


def zero3_like_dp(layers, world):
    n = sum(p.numel() for m in layers for p in m.parameters())
    return 2 * (world - 1) / world * n * 4


def zero3_whole_shards(layers, world):
    return zero3_sent_bytes(layers, world) * world // max(world - 1, 1) if world > 1 else \
        3 * sum(p.numel() for m in layers for p in m.parameters()) * 4


def zero3_unpadded(layers, world):
    n = sum(p.numel() for m in layers for p in m.parameters())
    return 3 * (world - 1) / world * n * 4


def saved_output_bytes(f, *inputs):
    out = f(*inputs)
    return out.numel() * out.element_size()


def saved_input_bytes(f, *inputs):
    return sum(t.numel() * t.element_size() for t in inputs)


def forward_plain(blocks, x):
    for b in blocks:
        x = b(x)
    return x


def forward_no_grad(blocks, x):
    with torch.no_grad():
        return forward_plain(blocks, x)


def checkpoint_all(blocks, x, budget):
    return list(range(len(blocks)))


def checkpoint_by_params(blocks, x, budget):
    """Greedy on parameter count (a guess), stopping on the measured bytes."""
    gain, h = [], x
    for b in blocks:
        gain.append(saved_bytes(b, h)
                    - saved_bytes(lambda h: checkpoint(b, h, use_reentrant=False), h))
        h = b(h)
    left = saved_bytes(lambda h: forward_plain(blocks, h), x)
    chosen = []
    for i in sorted(range(len(blocks)), key=lambda i: -sum(p.numel() for p in
                                                            blocks[i].parameters())):
        if left <= budget:
            break
        chosen.append(i)
        left -= gain[i]
    return chosen


def checkpoint_ignoring_input(blocks, x, budget):
    """Counts a checkpointed block as saving nothing: it keeps its input."""
    saved, h = [], x
    for b in blocks:
        saved.append(saved_bytes(b, h))
        h = b(h)
    chosen, left = [], sum(saved)
    for i in sorted(range(len(blocks)), key=lambda i: -saved[i]):
        if left <= budget:
            break
        chosen.append(i)
        left -= saved[i]
    return chosen


def checkpoint_none(blocks, x, budget):
    return []


CASES = [
    (check_partition, partition, [(partition_round_robin, "differ by at most"),
                                  (partition_contiguous, "differ by at most")]),
    (check_zero1_optimizer, zero1_optimizer, [(zero1_all_params, "about 1/world"),
                                              (zero1_round_robin, "balance them by size")]),
    (check_grad_shard, grad_shard, [(grad_shard_allreduce, "twice what a reduce-scatter"),
                                    (grad_shard_sum, "divide by the world size")]),
    (check_shard_flat, shard_flat, [(shard_unpadded, "must be equal"),
                                    (shard_each_tensor, "pad it once")]),
    (check_gather_layer, gather_layer, [(gather_broadcast, "used broadcast"),
                                        (gather_local_only, "did not all-gather")]),
    (check_zero3_sent_bytes, zero3_sent_bytes, [(zero3_like_dp, "data parallelism"),
                                                (zero3_whole_shards, "k-1 shards"),
                                                (zero3_unpadded, "padding")]),
    (check_saved_bytes_of_call, saved_bytes, [(saved_output_bytes, "size of the output"),
                                      (saved_input_bytes, "expected")]),
    (check_checkpointed_forward, checkpointed_forward, [(forward_plain, "checkpoint each block"),
                                                        (forward_no_grad, "has no gradient")]),
    (check_choose_checkpoints, choose_checkpoints, [
        (checkpoint_all, "suffice"), (checkpoint_by_params, "suffice"),
        (checkpoint_none, "over the budget"), (checkpoint_ignoring_input, "keeps its input")]),
]


@pytest.mark.parametrize("check,solution,wrong", CASES, ids=[c[0].__name__ for c in CASES])
def test_solution_passes_stub_not_done_wrong_fails(check, solution, wrong):
    for _ in range(3):   # fresh random inputs every time
        assert check(solution).passed
    assert check(stub).status == "not done"
    for answer, message in wrong:
        result = check(answer)
        assert result.status == "failed", answer.__name__
        assert message in result.message, (answer.__name__, result.message)


def test_fake_world_restores_torch_distributed():
    before = dist.all_reduce, dist.get_world_size
    with helpers.checks.FakeWorld(3, 1):
        assert dist.get_world_size() == 3 and dist.get_rank() == 1
    assert (dist.all_reduce, dist.get_world_size) == before
    assert not dist.is_initialized()
