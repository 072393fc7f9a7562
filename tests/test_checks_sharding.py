"""The checks of DDP from scratch (helpers/checks/sharding.py; Part V's are tested in
tests/test_checks_part5.py): the reference solutions pass, a stub reports "not done", and
answers that skip the concept fail with their message."""
import pytest
import torch
import torch.distributed as dist

import helpers
from helpers.checks import (
    check_average_bucket,
    check_bucket_params,
    check_overlap_hooks,
)


# The reference solutions, as the notebooks have them between the nbgrader markers.
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


def average_bucket(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:   # write into each gradient (rebinding changes nothing)
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def stub(*args):
    raise NotImplementedError()


# Answers that look right but skip the idea.
def bucket_forward_order(params, bucket_mb):
    return bucket_params(list(params)[::-1], bucket_mb)


def bucket_with_frozen(params, bucket_mb):
    params = list(params)
    frozen = [p for p in params if not p.requires_grad]
    return bucket_params(params, bucket_mb) + [frozen]


def hooks_after_backward(model):
    def finish():   # all-reduces only once backward is over: no overlap
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, async_op=True).wait()
                p.grad.div_(dist.get_world_size())
    return finish


def hooks_sync(model):
    def hook(p):
        dist.all_reduce(p.grad)
        p.grad.div_(dist.get_world_size())
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)
    return lambda: None


def hooks_sum(model):
    handles = []
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(
                lambda p: handles.append(dist.all_reduce(p.grad, async_op=True)))
    return lambda: [h.wait() for h in handles]


def average_each(grads):
    for g in grads:   # one message per gradient: the latency is paid len(grads) times
        dist.all_reduce(g)
        g /= dist.get_world_size()


def average_no_copy_back(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()


def average_sum(grads):
    average_bucket(grads)
    for g in grads:
        g *= dist.get_world_size()


def average_rebind(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for i, g in enumerate(list(grads)):
        grads[i] = flat[:g.numel()].view_as(g)   # rebinds the list item, the tensor is untouched


CASES = [
    (check_bucket_params, bucket_params, [(bucket_forward_order, "reverse order"),
                                          (bucket_with_frozen, "frozen parameter")]),
    (check_overlap_hooks, overlap_hooks, [(hooks_after_backward, "during backward"),
                                          (hooks_sync, "async_op=True"),
                                          (hooks_sum, "divide it by the world size")]),
    (check_average_bucket, average_bucket, [(average_each, "expected one"),
                                            (average_no_copy_back, "unchanged"),
                                            (average_sum, "divide by the world size"),
                                            (average_rebind, "in place")]),
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
