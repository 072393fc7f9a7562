"""Natural wrong answers that swap two quantities a check's draws once let coincide: the number
of gradient tensors or of micro-batches for the world size, len(p) for p.numel(), a whole-number
batch ratio, rank 0's span for the step's, a tensor's rows for its elements, dp for tp or for
ep, one mesh axis's size for another's. Each check now forces the two apart in every call: each
shortcut fails on eight replayed draws (before the fix each passed on some of them, or on every
one), and the right answers beside them pass on the same draws."""
import contextlib

import pytest
import torch
import torch.distributed as dist
from check_cases import (  # noqa: F401
    CASES,
    not_grading,
    other,
    parametrize_cases,
    ring_over,
    shortcut,
)
from torch.nn import functional as F

import helpers.checks
from helpers.checks._core.inputs import replay_seeds

SEEDS = range(8)


@shortcut("check_dp_average", "the sum divided by the number of tensors, not of ranks",
          "comm.world")
def dp_average_by_tensor_count(grads, comm):
    for g in grads:
        comm.all_reduce(g)
        g /= len(grads)


@shortcut("check_scratch_accumulate", "each loss divided by the world size, not the micro-batch "
          "count", "divided by the world size")
def scratch_accumulate_by_world(model, loss_fn, micro_batches):
    k = len(micro_batches)
    for i, (X, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == k - 1 else model.no_sync():
            (loss_fn(model(X), y) / dist.get_world_size()).backward()
    model.finish_gradient_synchronization()


@other("check_scratch_accumulate", "each loss weighted by its rows over all the rows")
def scratch_accumulate_by_rows(model, loss_fn, micro_batches):
    total, k = sum(len(y) for _, y in micro_batches), len(micro_batches)
    for i, (X, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == k - 1 else model.no_sync():
            (loss_fn(model(X), y) * len(y) / total).backward()
    model.finish_gradient_synchronization()


@shortcut("check_accumulate_zero2", "each loss divided by the world size, not the micro-batch "
          "count", "divided by the world size")
def accumulate_zero2_by_world(model, micro_batches):
    m = len(micro_batches)
    for i, (X, y) in enumerate(micro_batches):
        with model.no_sync() if i < m - 1 else contextlib.nullcontext():
            (F.cross_entropy(model(X), y) / dist.get_world_size()).backward()
    model.finish_gradient_synchronization()
    model.step()


@other("check_accumulate_zero2", "Part III's weighting: each summed loss over all the rows")
def accumulate_zero2_by_rows(model, micro_batches):
    total, m = sum(len(y) for _, y in micro_batches), len(micro_batches)
    for i, (X, y) in enumerate(micro_batches):
        with model.no_sync() if i < m - 1 else contextlib.nullcontext():
            (F.cross_entropy(model(X), y, reduction="sum") / total).backward()
    model.finish_gradient_synchronization()
    model.step()


def _zero1_by(size, params, rank, world, lr):
    """Largest first, each to the least loaded rank, by `size(p)`."""
    load, mine = [0] * world, []
    for i in sorted(range(len(params)), key=lambda i: -size(params[i])):
        r = load.index(min(load))
        load[r] += size(params[i])
        if r == rank:
            mine.append(params[i])
    return torch.optim.AdamW(mine, lr=lr)


@shortcut("check_zero1_optimizer", "balanced by len(p), the first dimension", "p.numel()")
def zero1_by_first_dim(params, rank, world, lr):
    return _zero1_by(len, params, rank, world, lr)


@shortcut("check_zero1_optimizer", "balanced by p.shape[-1], the last dimension", "p.numel()")
def zero1_by_last_dim(params, rank, world, lr):
    return _zero1_by(lambda p: p.shape[-1], params, rank, world, lr)


@other("check_zero1_optimizer", "balanced by bytes")
def zero1_by_bytes(params, rank, world, lr):
    return _zero1_by(lambda p: p.numel() * p.element_size(), params, rank, world, lr)


@shortcut("check_lr_at", "batch // base_batch: the ratio rounded down", "batch / base_batch")
def lr_at_floor_ratio(step, base_lr, base_batch, batch, warmup_steps):
    peak = base_lr * (batch // base_batch)
    return peak * min(1.0, (step + 1) / warmup_steps) if warmup_steps else peak


@other("check_lr_at", "the ratio as a Fraction")
def lr_at_fraction(step, base_lr, base_batch, batch, warmup_steps):
    from fractions import Fraction
    peak = base_lr * Fraction(batch, base_batch)
    return float(peak * min(1, Fraction(step + 1, warmup_steps)) if warmup_steps else peak)


@shortcut("check_idle_share", "the step as rank 0's first start to its last end", "on any rank")
def idle_share_rank0_span(timelines):
    span = timelines[0][-1]["end"] - timelines[0][0]["start"]
    busy = sum(e["end"] - e["start"] for tl in timelines for e in tl)
    return 1 - busy / (len(timelines) * span)


@other("check_idle_share", "the mean over ranks of each rank's idle share of the whole step")
def idle_share_mean_of_ranks(timelines):
    first = min(e["start"] for tl in timelines for e in tl)
    span = max(e["end"] for tl in timelines for e in tl) - first
    return sum(1 - sum(e["end"] - e["start"] for e in tl) / span
               for tl in timelines) / len(timelines)


@shortcut("check_ring_allreduce", "chunks of rows (tensor_split of dim 0), not of the elements",
          "t.view(-1)")
def ring_allreduce_rows(data):
    return ring_over(data, [t.tensor_split(len(data)) for t in data])


@shortcut("check_mesh_groups_3d", "the shape read as (pp, tp, dp)", "(pp, dp, tp) mesh")
def mesh_groups_3d_dp_tp_swapped(rank, shape):
    pp, tp, dp = shape
    i, rest = divmod(rank, dp * tp)
    j, k = divmod(rest, tp)

    def at(a, b, c):
        return (a * dp + b) * tp + c
    return {"pp": [at(a, j, k) for a in range(pp)], "dp": [at(i, b, k) for b in range(dp)],
            "tp": [at(i, j, c) for c in range(tp)]}


@shortcut("check_expert_grad_group", "every world // ep ranks (the dp size), not every ep",
          "every ep")
def expert_grad_group_stride_dp(rank, world, ep):
    return list(range(rank % ep, world, world // ep))


@shortcut("check_local_shape", "dp and tp swapped", "swaps dp and tp")
def local_shape_dp_tp_swapped(shape, split_dim, dp, tp, dp_rank):
    dp, tp = tp, dp
    out = list(shape)
    if split_dim is not None:
        out[split_dim] //= tp
    rows = -(-out[0] // dp)
    out[0] = max(0, min(rows, out[0] - dp_rank * rows))
    return tuple(out)


@shortcut("check_accumulate_gradients", "the no_sync forwards together, then their backwards",
          "ran after another micro-batch's forward")
def accumulate_gradients_nosync_batched(model, loss_fn, micro_batches):
    total = sum(len(y) for _, y in micro_batches)
    with model.no_sync():
        losses = [loss_fn(model(X), y) * len(y) / total for X, y in micro_batches[:-1]]
        for loss in losses:
            loss.backward()
    X, y = micro_batches[-1]
    (loss_fn(model(X), y) * len(y) / total).backward()


@shortcut("check_scratch_accumulate", "the no_sync forwards together, then their backwards",
          "right after its forward")
def scratch_accumulate_nosync_batched(model, loss_fn, micro_batches):
    k = len(micro_batches)
    with model.no_sync():
        losses = [loss_fn(model(X), y) / k for X, y in micro_batches[:-1]]
        for loss in losses:
            loss.backward()
    X, y = micro_batches[-1]
    (loss_fn(model(X), y) / k).backward()
    model.finish_gradient_synchronization()


@shortcut("check_accumulate_zero2", "the no_sync forwards together, then their backwards",
          "right after its forward")
def accumulate_zero2_nosync_batched(model, micro_batches):
    m = len(micro_batches)
    with model.no_sync():
        losses = [F.cross_entropy(model(X), y) / m for X, y in micro_batches[:-1]]
        for loss in losses:
            loss.backward()
    X, y = micro_batches[-1]
    (F.cross_entropy(model(X), y) / m).backward()
    model.finish_gradient_synchronization()
    model.step()


@shortcut("check_local_shape", "no clamp at 0 past the end", "expected")
def local_shape_no_clamp(shape, split_dim, dp, tp, dp_rank):
    out = list(shape)
    if split_dim is not None:
        out[split_dim] //= tp
    rows = -(-out[0] // dp)
    out[0] = min(rows, out[0] - dp_rank * rows)
    return tuple(out)


@shortcut("check_local_shape", "ceil rows for every rank but the last, which takes the rest",
          "expected")
def local_shape_last_remainder(shape, split_dim, dp, tp, dp_rank):
    out = list(shape)
    if split_dim is not None:
        out[split_dim] //= tp
    rows = -(-out[0] // dp)
    out[0] = rows if dp_rank < dp - 1 else out[0] - rows * (dp - 1)
    return tuple(out)


@shortcut("check_sync_bn_input_grad", "dy.sum(): the channels summed too",
          "not the synchronised BatchNorm's")
def sync_bn_input_grad_sum_all(dy, x_hat, invstd, n):
    sums = torch.stack([dy.sum(), (dy * x_hat).sum()])
    dist.all_reduce(sums)
    a, b = sums / n
    return invstd * (dy - a - x_hat * b)


@shortcut("check_bucket_params", "sizes as numel * 4 (float32 assumed)", "made buckets of")
def bucket_params_four_bytes(params, bucket_mb):
    seen, out, current, size = set(), [], [], 0
    for p in reversed(list(params)):
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        current.append(p)
        size += p.numel() * 4
        if bucket_mb is None or size >= bucket_mb * 2**20:
            out.append(current)
            current, size = [], 0
    return out + ([current] if current else [])


@shortcut("check_zero3_sent_bytes", "each parameter padded, not each layer's flat vector",
          "pads each parameter")
def zero3_sent_bytes_per_param(layers, world):
    shard = sum(-(-p.numel() // world) for m in layers for p in m.parameters())
    return 3 * (world - 1) * shard * 4


test_case = parametrize_cases(__name__)
HERE = [c for cases in CASES.values() for kind in ("shortcuts", "others") for c in cases[kind]
        if c.module == __name__]


@pytest.mark.parametrize("case", HERE, ids=repr)
def test_every_draw(case):
    """Each answer above on eight more replayed draws: a shortcut fails on every one (the pair it
    confuses is apart in every call), a right answer passes on every one."""
    for seed in SEEDS:
        replay_seeds(seed)
        case.judge()


def test_local_shape_keeps_dp_and_tp_apart_when_every_draw_is_its_highest(monkeypatch):
    """Every draw its highest (dp = tp = 4 wherever both are drawn): the swapped answer still
    fails, on the case whose tp is forced to differ from its dp."""
    import helpers.checks.mesh2d as module
    monkeypatch.setattr(module, "randint", lambda g, lo, hi: hi)
    result = helpers.checks.check_local_shape(local_shape_dp_tp_swapped)
    assert result.status == "failed" and "swaps dp and tp" in result.message, result
