"""The checks of DDP from scratch (helpers/checks/ddp_scratch.py), on the harness's World: the
worked answers, shortcuts of different kinds (known cheats included: make_buckets
returned, a hook that waits inside itself, an all-reduce of a discarded clone), other right
answers (tests/check_cases.py)."""
import contextlib

import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut, worked
from torch.futures import collect_all, wait_all

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


# ---- overlap_hooks -----------------------------------------------------------------------------
@worked("check_overlap_hooks")
def overlap_hooks(model):
    handles = []

    def hook(p):
        handles.append(dist.all_reduce(p.grad, async_op=True))

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)

    def finish():
        for h in handles:
            h.wait()
        handles.clear()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(dist.get_world_size())
    return finish


@other("check_overlap_hooks", "divide in the hook, wait in finish")
def overlap_hooks_divide_first(model):
    pending = []

    def hook(p):
        p.grad.div_(dist.get_world_size())
        pending.append(dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True))
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)
    # waited, then let go: a list kept whole grows every step (and keeps every step's gradients)
    return lambda: [w.wait() for w in pending] and pending.clear()


@other("check_overlap_hooks", "the handles' futures, waited with wait_all in finish")
def overlap_hooks_futures(model):
    futures = []

    def hook(p):
        futures.append(dist.all_reduce(p.grad, async_op=True).get_future())
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)

    def finish():
        torch.futures.wait_all(futures)
        futures.clear()
        torch._foreach_div_([p.grad for p in model.parameters() if p.grad is not None],
                            dist.get_world_size())
    return finish


@other("check_overlap_hooks", "wait_all and collect_all bound at import, before the check ran")
def overlap_hooks_bound_early(model):
    futures = []

    def hook(p):
        futures.append(dist.all_reduce(p.grad, async_op=True).get_future())
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)

    def finish():
        half = len(futures) // 2
        wait_all(futures[:half])
        collect_all(futures[half:]).wait()
        futures.clear()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(dist.get_world_size())
    return finish


@other("check_overlap_hooks", "DDP comm-hook style: then() divides the future's value")
def overlap_hooks_then(model):
    futures, world = [], dist.get_world_size()

    def hook(p):
        fut = dist.all_reduce(p.grad, async_op=True).get_future()
        futures.append(fut.then(lambda f: f.value()[0].div_(world)))
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)
    return lambda: [f.wait() for f in futures] and futures.clear()


def _accumulate_grad_node(p):
    """The parameter's AccumulateGrad node (the Horovod idiom): kept alive by the caller, or its
    hooks go with it."""
    return p.expand_as(p).grad_fn.next_functions[0][0]


@other("check_overlap_hooks", "a hook on each parameter's AccumulateGrad node (Horovod's idiom)")
def overlap_hooks_accumulate_grad_node(model):
    handles, nodes = [], []
    for p in model.parameters():
        if p.requires_grad:
            nodes.append(_accumulate_grad_node(p))

            def hook(grad_inputs, grad_outputs, p=p):
                handles.append(dist.all_reduce(p.grad, async_op=True))
            nodes[-1].register_hook(hook)

    def finish():
        for h in handles:
            h.wait()
        handles.clear()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(dist.get_world_size())
    finish.nodes = nodes
    return finish


@shortcut("check_overlap_hooks", "AccumulateGrad node hooks that never average",
          "divide it by the world size")
def overlap_hooks_node_sum(model):
    handles, nodes = [], []
    for p in model.parameters():
        if p.requires_grad:
            nodes.append(_accumulate_grad_node(p))
            nodes[-1].register_hook(
                lambda gi, go, p=p: handles.append(dist.all_reduce(p.grad, async_op=True)))

    def finish():
        for h in handles:
            h.wait()
    finish.nodes = nodes
    return finish


@shortcut("check_overlap_hooks", "waits on the future inside the hook", "inside backward")
def overlap_hooks_future_wait_in_hook(model):
    def hook(p):
        dist.all_reduce(p.grad, async_op=True).get_future().wait()[0].div_(
            dist.get_world_size())
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)
    return lambda: None


@shortcut("check_overlap_hooks", "waits inside the hook", "inside backward")
def overlap_hooks_wait_in_hook(model):
    def hook(p):
        dist.all_reduce(p.grad, async_op=True).wait()
        p.grad.div_(dist.get_world_size())
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)
    return lambda: None


@shortcut("check_overlap_hooks", "all-reduces a discarded clone", "not a parameter")
def overlap_hooks_clone(model):
    handles = []
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(
                lambda p: handles.append(dist.all_reduce(p.grad.clone(), async_op=True)))
    return lambda: [h.wait() for h in handles]


@shortcut("check_overlap_hooks", "all-reduce after backward", "during backward")
def overlap_hooks_after(model):
    def finish():
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, async_op=True).wait()
                p.grad.div_(dist.get_world_size())
    return finish


@shortcut("check_overlap_hooks", "forgets to average", "divide it by the world size")
def overlap_hooks_sum(model):
    handles = []
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(
                lambda p: handles.append(dist.all_reduce(p.grad, async_op=True)))
    return lambda: [h.wait() for h in handles]


@shortcut("check_overlap_hooks", "blocking all-reduce", "async_op=True")
def overlap_hooks_sync(model):
    def hook(p):
        dist.all_reduce(p.grad)
        p.grad.div_(dist.get_world_size())
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)
    return lambda: None


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


def test_only_the_accumulated_grad_is_spared():
    """untouched.grad_spared leaves out of a kept hook's fingerprint only the gradient an
    AccumulateGrad node stored as p.grad: a tensor hook's gradient (before accumulation) and
    another node's gradients are still fingerprinted, so writing them in place still fails."""
    from helpers.checks._core.untouched import grad_spared
    seen = {}
    p = torch.nn.Parameter(torch.randn(3))
    node = _accumulate_grad_node(p)
    node.register_hook(lambda gi, go: seen.update(
        acc=grad_spared((gi, go)), shared=go[0].untyped_storage()._cdata
        == p.grad.untyped_storage()._cdata))
    (p * 2).sum().backward()
    assert seen["shared"] and seen["acc"] == ((), (None,))
    q = torch.nn.Parameter(torch.randn(3))
    y = q * 2
    y.grad_fn.register_hook(lambda gi, go: seen.update(mul=(gi, grad_spared((gi, go)))))
    q.register_hook(lambda g: seen.update(pre=grad_spared((g,))[0] is g))
    y.sum().backward()
    gi, spared = seen["mul"]
    assert spared[0] is gi and spared[1][0] is not None
    assert seen["pre"] is True
