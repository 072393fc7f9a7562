"""The tensors a check hands an answer (provenance.py makes them the rank's it hands them to):
tensors with their gradients, the parameters, buffers and gradients of modules and optimizers,
inside lists, tuples, dicts and sets."""
import torch

__all__ = ["handed"]


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
