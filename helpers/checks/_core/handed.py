"""The tensors a check hands an answer (provenance.py makes them the rank's it hands them to):
tensors with their gradients, the parameters, buffers and gradients of modules and optimizers,
inside lists, tuples, dicts and sets."""
import torch

__all__ = ["handed", "kept_aside", "in_place"]


def handed(tree, depth=0):
    """The tensors in `tree`, the arguments a check hands an answer (see above)."""
    if isinstance(tree, torch.Tensor):
        grad = tree.grad if tree.is_leaf else None
        return [tree] if grad is None else [tree, grad]
    if isinstance(tree, torch.nn.Module):
        return [t for x in (*tree.parameters(), *tree.buffers()) for t in handed(x)]
    if isinstance(tree, torch.optim.Optimizer):
        return handed([g["params"] for g in tree.param_groups], depth)
    if depth < 4 and isinstance(tree, (list, tuple, dict, set, frozenset)):
        items = tree.values() if isinstance(tree, dict) else tree
        return [t for x in items for t in handed(x, depth + 1)]
    return []



def kept_aside(container):
    """The tensor objects of a list or dict a check hands an answer to change in place, kept
    before the call: the caller holds these, so the check judges them, never the container."""
    return dict(container) if type(container) is dict else list(container)


def in_place(call, container, kept, name="grads",
             fix="average in place (g.div_(...) / g.copy_(...))"):
    """The tensors `kept` before the call, after failing an answer that rebound the container's
    entries (`grads[i] = g / n`, `grads[:] = [...]`): its values never reach the caller's."""
    from .run import expect
    tail = f"{fix}, the caller holds the tensors you were given"
    expect(len(container) == len(kept),
           f"{call}: {name} now has {len(container)} items, not {len(kept)}: {tail}")
    is_dict = type(kept) is dict
    for key in (kept if is_dict else range(len(kept))):
        now = container.get(key) if is_dict else container[key]
        expect(now is kept[key], f"{call}: {name}[{key!r}] was replaced by a new tensor: {tail}")
    return list(kept.values()) if is_dict else list(kept)
