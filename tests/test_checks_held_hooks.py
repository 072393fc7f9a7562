"""What an overlap_hooks answer still holds is read from its hooks too (helpers/checks/_core/
held.py walks from finish() and from the reader's kept hooks, kept_hooks.recording): state only
a hook holds (a debug log of handles in its closure, every gradient), a pending list in a
contextvars.ContextVar, a module dict reached as globals()["NAME"], or a torch future's value
(a collect_all chained with the step before's), or a list set on torch.distributed by a built
name fails when it keeps an earlier step's handles or
gradients; the same state cleared every step passes, and so does one
reaching an earlier run's leftovers (tests/check_cases.py's form)."""
import contextvars

import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut

KEPT = "clear the pending list in finish() every step"


def _hook_each(model, hook):
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)


def _average(model):
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(dist.get_world_size())


@shortcut("check_overlap_hooks", "the hook also logs every handle in a list only it holds",
          KEPT)
def overlap_hooks_hook_logs_handles(model):
    pending, every = [], []

    def hook(p):
        work = dist.all_reduce(p.grad, async_op=True)
        pending.append(work)
        every.append(work)                  # grows by one per gradient each step
    _hook_each(model, hook)

    def finish():
        for work in pending:
            work.wait()
        pending.clear()
        _average(model)
    return finish


@shortcut("check_overlap_hooks", "the hook appends every gradient to a log", KEPT)
def overlap_hooks_hook_logs_grads(model):
    pending, log = [], []

    def hook(p):
        pending.append(dist.all_reduce(p.grad, async_op=True))
        log.append(p.grad)
    _hook_each(model, hook)

    def finish():
        for work in pending:
            work.wait()
        pending.clear()
        _average(model)
    return finish


_PENDING = contextvars.ContextVar("pending")       # each thread rank: its own context


@shortcut("check_overlap_hooks", "handles in a ContextVar's list, never cleared", KEPT)
def overlap_hooks_context_var_kept(model):
    _PENDING.set([])
    _hook_each(model, lambda p: _PENDING.get().append(dist.all_reduce(p.grad, async_op=True)))

    def finish():
        for work in _PENDING.get():
            work.wait()
        _average(model)
    return finish


@other("check_overlap_hooks", "handles in a ContextVar's list, cleared every step")
def overlap_hooks_context_var_cleared(model):
    _PENDING.set([])
    _hook_each(model, lambda p: _PENDING.get().append(dist.all_reduce(p.grad, async_op=True)))

    def finish():
        for work in _PENDING.get():
            work.wait()
        _PENDING.get().clear()
        _average(model)
    return finish


_STORE = {}


@shortcut("check_overlap_hooks", "handles in a module dict reached as globals()[...], never "
          "cleared", KEPT)
def overlap_hooks_globals_kept(model):
    rank = dist.get_rank()
    globals()["_STORE"][("kept", rank)] = []
    _hook_each(model, lambda p: globals()["_STORE"][("kept", rank)].append(
        dist.all_reduce(p.grad, async_op=True)))

    def finish():
        for work in globals()["_STORE"][("kept", rank)]:
            work.wait()
        _average(model)
    return finish


@other("check_overlap_hooks", "a pending list only the hook and finish() hold, cleared every "
       "step, through globals()")
def overlap_hooks_globals_cleared(model):
    rank = dist.get_rank()
    globals()["_STORE"][(id(model), rank)] = pending = []
    _hook_each(model, lambda p: globals()["_STORE"][(id(model), rank)].append(
        dist.all_reduce(p.grad, async_op=True)))

    def finish():
        for work in pending:
            work.wait()
        pending.clear()
        _average(model)
    return finish


@shortcut("check_overlap_hooks", "each step's collect_all chained with the step before's",
          KEPT)
def overlap_hooks_future_chain(model):
    state = {"all": None, "step": []}
    _hook_each(model, lambda p: state["step"].append(
        dist.all_reduce(p.grad, async_op=True).get_future()))

    def finish():
        futures, state["step"] = state["step"], []
        earlier = [state["all"]] if state["all"] is not None else []
        state["all"] = torch.futures.collect_all(futures + earlier)   # holds every step's
        state["all"].wait()
        _average(model)
    return finish


@other("check_overlap_hooks", "each step's futures in a collect_all kept until the next step")
def overlap_hooks_future_replaced(model):
    state = {"all": None, "step": []}
    _hook_each(model, lambda p: state["step"].append(
        dist.all_reduce(p.grad, async_op=True).get_future()))

    def finish():
        futures, state["step"] = state["step"], []
        state["all"] = torch.futures.collect_all(futures)     # this step's only
        state["all"].wait()
        _average(model)
    return finish


def _kept_on_torch_distributed(model, name, cleared):
    """Handles appended by the hooks to a list set on torch.distributed under `name` (a name
    built at run time); `cleared`: emptied once finish() has waited for them."""
    setattr(torch.distributed, name, [])
    _hook_each(model, lambda p: getattr(torch.distributed, name).append(
        dist.all_reduce(p.grad, async_op=True)))

    def finish():
        for work in getattr(torch.distributed, name):
            work.wait()
        if cleared:
            getattr(torch.distributed, name).clear()
        _average(model)
    return finish


@shortcut("check_overlap_hooks", "handles in a list set on torch.distributed by a built name, "
          "never cleared", KEPT)
def overlap_hooks_module_attribute_kept(model):
    return _kept_on_torch_distributed(model, f"_held_hooks_case_{dist.get_rank()}", False)


@other("check_overlap_hooks", "handles in a list set on torch.distributed by a built name, "
       "cleared every step")
def overlap_hooks_module_attribute_cleared(model):
    return _kept_on_torch_distributed(model, f"_held_hooks_cleared_{dist.get_rank()}", True)


test_case = parametrize_cases(__name__)
