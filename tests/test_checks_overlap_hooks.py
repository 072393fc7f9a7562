"""check_overlap_hooks, DDP from scratch's overlap of all-reduce with backward
(helpers/checks/ddp_scratch.py), on the harness's World: the worked answer, shortcuts of
different kinds (known cheats included: a hook that waits inside itself, an all-reduce of a
discarded clone), other right answers (tests/check_cases.py); and which gradient a kept hook's
fingerprint spares."""
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut, worked
from torch.futures import collect_all, wait_all


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


@shortcut("check_overlap_hooks", "the tutorial's tensor hook all-reducing its argument",
          ["changed its inputs", "register_post_accumulate_grad_hook"])
def overlap_tensor_hook_in_place(model):
    for p in model.parameters():
        if p.requires_grad:
            p.register_hook(lambda g: dist.all_reduce(g))

    def finish():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(dist.get_world_size())
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
