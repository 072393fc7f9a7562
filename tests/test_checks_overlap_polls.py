"""check_overlap_hooks and when an async all-reduce completes (helpers/runtime/work.py): on the
checks' World, as on gloo, the Work is complete once every rank launched it, so a finish() that
polls is_completed() passes at once, and a hook that spins on is_completed() or on its future's
done() has waited inside backward, as a wait() there would (tests/check_cases.py)."""
import time

import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut


def _on_each_gradient(model, hook):
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)


@other("check_overlap_hooks", "finish() polls each handle's is_completed()")
def overlap_hooks_polls(model):
    handles = []
    _on_each_gradient(model, lambda p: handles.append(dist.all_reduce(p.grad, async_op=True)))

    def finish():
        for h in handles:
            while not h.is_completed():
                time.sleep(0.001)
        handles.clear()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(dist.get_world_size())
    return finish


@shortcut("check_overlap_hooks", "spins on its future's done() inside the hook, waits again "
          "in finish", "inside backward")
def overlap_hooks_spins_on_done(model):
    futures, world = [], dist.get_world_size()

    def hook(p):
        fut = dist.all_reduce(p.grad, async_op=True).get_future()
        while not fut.done():
            pass
        p.grad.div_(world)
        futures.append(fut)
    _on_each_gradient(model, hook)
    return lambda: [f.wait() for f in futures]


@shortcut("check_overlap_hooks", "spins on is_completed() inside the hook, waits again in "
          "finish", "inside backward")
def overlap_hooks_spins_on_is_completed(model):
    handles, world = [], dist.get_world_size()

    def hook(p):
        work = dist.all_reduce(p.grad, async_op=True)
        while not work.is_completed():
            pass
        p.grad.div_(world)
        handles.append(work)
    _on_each_gradient(model, hook)
    return lambda: [h.wait() for h in handles]


test_case = parametrize_cases(__name__)
