"""The checks of Part III's custom-modules chapter (helpers/checks/custom_modules.py): the worked
answers, shortcuts of different kinds (known cheats included: torch's consume_prefix bound
earlier, the course's loader), other right answers (tests/check_cases.py)."""
import contextlib

import torch
from check_cases import not_grading, other, parametrize_cases, shortcut, worked  # noqa: F401
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

import helpers


# ---- strip_module_prefix -----------------------------------------------------------------------
@worked("check_strip_module_prefix")
def strip_module_prefix(state_dict):
    return {k.removeprefix("module."): v for k, v in state_dict.items()}


@other("check_strip_module_prefix", "slicing, an ordered loop")
def strip_module_prefix_loop(state_dict):
    out = {}
    for key, value in state_dict.items():
        out[key[7:] if key.startswith("module.") else key] = value
    return out


@shortcut("check_strip_module_prefix", "str.replace everywhere", "LEADING")
def strip_module_prefix_replace(state_dict):
    return {k.replace("module.", ""): v for k, v in state_dict.items()}


_CONSUME = consume_prefix_in_state_dict_if_present


@shortcut("check_strip_module_prefix", "torch's consume_prefix (bound earlier)", "does it for you")
def strip_module_prefix_torch(state_dict):
    out = dict(state_dict)
    _CONSUME(out, "module.")
    return out


@shortcut("check_strip_module_prefix", "the course's loader", "course's own answer")
def strip_module_prefix_course(state_dict):
    return helpers.load_checkpoint(state_dict, "module.")


@shortcut("check_strip_module_prefix", "changes its argument", "changed its input")
def strip_module_prefix_in_place(state_dict):
    for k in list(state_dict):
        if k.startswith("module."):
            state_dict[k[7:]] = state_dict.pop(k)
    return state_dict


# ---- accumulate_gradients ----------------------------------------------------------------------
@worked("check_accumulate_gradients")
def accumulate_gradients(model, loss_fn, micro_batches):
    total = sum(len(y) for _, y in micro_batches)
    for i, (X, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with (contextlib.nullcontext() if last else model.no_sync()):
            (loss_fn(model(X), y) * len(y) / total).backward()


@other("check_accumulate_gradients", "an ExitStack, summed losses scaled by the rows")
def accumulate_gradients_stack(model, loss_fn, micro_batches):
    total = sum(len(X) for X, _ in micro_batches)
    for i, (X, y) in enumerate(micro_batches):
        with contextlib.ExitStack() as stack:
            if i < len(micro_batches) - 1:
                stack.enter_context(model.no_sync())
            ((model(X) - y).pow(2).sum() / total).backward()


@other("check_accumulate_gradients", "no_sync around the forwards only, a no_grad look between")
def accumulate_gradients_forward_context(model, loss_fn, micro_batches):
    total = sum(len(y) for _, y in micro_batches)
    for i, (X, y) in enumerate(micro_batches):
        with torch.no_grad():
            model(X)                  # a look outside no_sync, without grad: arms nothing
        with (contextlib.nullcontext() if i == len(micro_batches) - 1 else model.no_sync()):
            loss = loss_fn(model(X), y) * len(y) / total
        loss.backward()


@shortcut("check_accumulate_gradients", "every forward first, then the backwards",
          "ran after another micro-batch's forward")
def accumulate_gradients_forwards_first(model, loss_fn, micro_batches):
    total, k = sum(len(y) for _, y in micro_batches), len(micro_batches)
    losses = []
    for i, (X, y) in enumerate(micro_batches):     # on DDP the last forward arms the all-reduce
        with (contextlib.nullcontext() if i == k - 1 else model.no_sync()):
            losses.append(loss_fn(model(X), y) * len(y) / total)
    for i, loss in enumerate(losses):               # and micro-batch 0's backward fires it
        with (contextlib.nullcontext() if i == k - 1 else model.no_sync()):
            loss.backward()


@shortcut("check_accumulate_gradients", "one backward for all", "once per micro-batch")
def accumulate_gradients_one_backward(model, loss_fn, micro_batches):
    total = sum(len(y) for _, y in micro_batches)
    losses = []
    for i, (X, y) in enumerate(micro_batches):
        with (contextlib.nullcontext() if i == len(micro_batches) - 1 else model.no_sync()):
            losses.append(loss_fn(model(X), y) * len(y) / total)
    sum(losses).backward()


@shortcut("check_accumulate_gradients", "every backward synchronises", "only the last one")
def accumulate_gradients_always_sync(model, loss_fn, micro_batches):
    total = sum(len(y) for _, y in micro_batches)
    for X, y in micro_batches:
        (loss_fn(model(X), y) * len(y) / total).backward()


@shortcut("check_accumulate_gradients", "divides by k (the chapter's loop)", "share of all")
def accumulate_gradients_by_k(model, loss_fn, micro_batches):
    k = len(micro_batches)
    for i, (X, y) in enumerate(micro_batches):
        with (contextlib.nullcontext() if i == k - 1 else model.no_sync()):
            (loss_fn(model(X), y) / k).backward()


# ---- unused_parameters -------------------------------------------------------------------------
@worked("check_unused_parameters")
def unused_parameters(model, loss):
    seen, stack = set(), [loss.grad_fn]
    while stack:   # walk the autograd graph from the loss, as DDP does
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):   # AccumulateGrad: a leaf reached
            seen.add(node.variable)
        stack += [f for f, _ in node.next_functions]
    reached = [v for v in seen if isinstance(v, torch.Tensor)]
    return sorted(n for n, p in model.named_parameters()
                  if not any(p is v for v in reached))


@other("check_unused_parameters", "recursive walk, ids of leaves")
def unused_parameters_recursive(model, loss):
    leaves, visited = set(), set()

    def walk(node):
        if node is None or node in visited:
            return
        visited.add(node)
        if hasattr(node, "variable"):
            leaves.add(id(node.variable))
        for nxt, _ in node.next_functions:
            walk(nxt)
    walk(loss.grad_fn)
    return [n for n, p in sorted(model.named_parameters()) if id(p) not in leaves]


@shortcut("check_unused_parameters", "autograd.grad", "torch.autograd.grad runs one")
def unused_parameters_grad(model, loss):
    names, params = zip(*model.named_parameters())
    grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
    return sorted(n for n, g in zip(names, grads) if g is None)


@shortcut("check_unused_parameters", "runs backward", "ran a backward pass")
def unused_parameters_backward(model, loss):
    loss.backward(retain_graph=True)
    return sorted(n for n, p in model.named_parameters() if p.grad is None)


test_case = parametrize_cases(__name__)
