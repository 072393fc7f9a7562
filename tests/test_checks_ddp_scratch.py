"""The checks of DDP from scratch (helpers/checks/ddp_scratch.py; check_overlap_hooks in
tests/test_checks_overlap_hooks.py), on the harness's World: the worked answers, shortcuts of
different kinds (known cheats included: make_buckets returned, a decoy all-reduce beside the
average), other right answers (tests/check_cases.py)."""
import contextlib

import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut, worked

import helpers


# ---- bucket_params -----------------------------------------------------------------------------
@worked("check_bucket_params")
def bucket_params(params, bucket_mb):
    limit = None if bucket_mb is None else bucket_mb * 2**20
    buckets, current, size, seen = [], [], 0, set()
    for p in reversed(list(params)):
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        current.append(p)
        size += p.numel() * p.element_size()
        if limit is None or size >= limit:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


@other("check_bucket_params", "dedupe first, tuples")
def bucket_params_tuples(params, bucket_mb):
    order = []
    for p in list(params)[::-1]:
        if p.requires_grad and all(p is not q for q in order):
            order.append(p)
    if bucket_mb is None:
        return [(p,) for p in order]
    out, cur, nbytes = [], [], 0
    for p in order:
        cur.append(p)
        nbytes += p.nbytes
        if nbytes >= bucket_mb * 2**20:
            out.append(tuple(cur))
            cur, nbytes = [], 0
    return out + [tuple(cur)] * bool(cur)


@shortcut("check_bucket_params", "returns make_buckets", "course's own answer")
def bucket_params_course(params, bucket_mb):
    return helpers.make_buckets(params, bucket_mb)


@shortcut("check_bucket_params", "forward order", "reverse order")
def bucket_params_forward(params, bucket_mb):
    return bucket_params(list(params)[::-1], bucket_mb)


@shortcut("check_bucket_params", "keeps frozen ones", "frozen parameter")
def bucket_params_frozen(params, bucket_mb):
    frozen = [p for p in params if not p.requires_grad]
    return bucket_params(params, bucket_mb) + [frozen]


@shortcut("check_bucket_params", "a tied parameter twice", "reduced once")
def bucket_params_twice(params, bucket_mb):
    ps = [p for p in reversed(list(params)) if p.requires_grad]
    return [[p] for p in ps] if bucket_mb is None else [ps]


# ---- average_bucket ----------------------------------------------------------------------------
@worked("check_average_bucket")
def average_bucket(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:   # write into each gradient (rebinding changes nothing)
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


@other("check_average_bucket", "divide first, AVG-free, split back")
def average_bucket_split(grads):
    flat = torch.cat([g.flatten() / dist.get_world_size() for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))


@shortcut("check_average_bucket", "one message per gradient", "expected one")
def average_bucket_each(grads):
    for g in grads:
        dist.all_reduce(g)
        g /= dist.get_world_size()


@shortcut("check_average_bucket", "never copies back", "unchanged")
def average_bucket_no_copy(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()


@shortcut("check_average_bucket", "a sum", "divide by the world size")
def average_bucket_sum(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


@shortcut("check_average_bucket", "rebinds the list items", "in place")
def average_bucket_rebind(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for i, g in enumerate(list(grads)):
        grads[i] = flat[offset:offset + g.numel()].view_as(g).clone()
        offset += g.numel()


@shortcut("check_average_bucket", "a decoy all-reduce, the average by all_gather",
          "allows only all_reduce")
def average_bucket_gather(grads):
    flat = torch.zeros(sum(g.numel() for g in grads))
    dist.all_reduce(flat)                          # bucket-sized, carries nothing
    w = dist.get_world_size()
    for g in grads:
        parts = [torch.empty_like(g) for _ in range(w)]
        dist.all_gather(parts, g)
        g.copy_(torch.stack(parts).mean(0))


@shortcut("check_average_bucket", "a decoy all-reduce, the average by send/recv",
          "allows only all_reduce")
def average_bucket_p2p(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(torch.zeros_like(flat))
    r, w = dist.get_rank(), dist.get_world_size()
    for j in range(w):
        if j != r:
            dist.send(flat, j)
    total = flat.clone()
    for j in range(w):
        if j != r:
            got = torch.empty_like(flat)
            dist.recv(got, j)
            total += got
    for g, piece in zip(grads, (total / w).split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))


# ---- scratch_accumulate ------------------------------------------------------------------------
@worked("check_scratch_accumulate")
def accumulate(model, loss_fn, micro_batches):
    k = len(micro_batches)
    for i, (X, y) in enumerate(micro_batches):
        last = i == k - 1
        with contextlib.nullcontext() if last else model.no_sync():
            (loss_fn(model(X), y) / k).backward()
    model.finish_gradient_synchronization()


@other("check_scratch_accumulate", "all inside no_sync, finish averages")
def accumulate_all_no_sync(model, loss_fn, micro_batches):
    with model.no_sync():
        for X, y in micro_batches:
            (loss_fn(model(X), y) / len(micro_batches)).backward()
    model.finish_gradient_synchronization()


@shortcut("check_scratch_accumulate", "the colleague's loop: refused", "no_sync")
def accumulate_refused(model, loss_fn, micro_batches):
    for X, y in micro_batches:
        (loss_fn(model(X), y) / len(micro_batches)).backward()
    model.finish_gradient_synchronization()


@shortcut("check_scratch_accumulate", "finish after every micro-batch", "once per step")
def accumulate_finish_each(model, loss_fn, micro_batches):
    for X, y in micro_batches:
        (loss_fn(model(X), y) / len(micro_batches)).backward()
        model.finish_gradient_synchronization()


@shortcut("check_scratch_accumulate", "one big batch", "its own forward and backward")
def accumulate_concat(model, loss_fn, micro_batches):
    X = torch.cat([X for X, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    loss_fn(model(X), y).backward()
    model.finish_gradient_synchronization()


@shortcut("check_scratch_accumulate", "no finish", "finish_gradient_synchronization")
def accumulate_no_finish(model, loss_fn, micro_batches):
    with model.no_sync():
        for X, y in micro_batches:
            (loss_fn(model(X), y) / len(micro_batches)).backward()


test_case = parametrize_cases(__name__)
