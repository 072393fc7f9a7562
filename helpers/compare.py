"""Comparing results, the one comparator: a split run against the unsplit one, tensor by tensor.

Both functions take two tensors, two lists (or tuples) of tensors, or two {name: tensor} dicts,
and refuse two things that do not pair up (other lengths, other names, other shapes) instead of
comparing part of them. `all_close` says whether they agree within rounding, `max_diff` by how
much they differ (in float64, on the CPU); `rel_diff` sizes a difference against how far
training moved.
"""
import torch

__all__ = ["all_close", "max_diff", "rel_diff", "cpu_copy"]


def _pairs(xs, ys):
    """The matching tensors of xs and ys; ValueError when they do not pair up."""
    if isinstance(xs, torch.Tensor) or isinstance(ys, torch.Tensor):
        pairs = [(xs, ys)]
    elif isinstance(xs, dict) or isinstance(ys, dict):
        if not (isinstance(xs, dict) and isinstance(ys, dict)) or xs.keys() != ys.keys():
            names = [sorted(d) if isinstance(d, dict) else type(d).__name__ for d in (xs, ys)]
            raise ValueError(f"the names differ: {names[0]} and {names[1]}")
        pairs = [(xs[k], ys[k]) for k in xs]
    else:
        xs, ys = list(xs), list(ys)
        if len(xs) != len(ys):
            raise ValueError(f"{len(xs)} tensors against {len(ys)}")
        pairs = list(zip(xs, ys, strict=True))
    for x, y in pairs:
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            raise ValueError(f"expected tensors, got {type(x).__name__} and {type(y).__name__}")
        if x.shape != y.shape:
            raise ValueError(f"shapes differ: {tuple(x.shape)} and {tuple(y.shape)}")
    if not pairs:
        raise ValueError("nothing to compare: both are empty")
    return pairs


def all_close(xs, ys, rtol=1e-4, atol=1e-5):
    """True when two tensors, lists or dicts of tensors pair up (lengths, names, shapes) and
    their values agree within rounding."""
    try:
        pairs = _pairs(xs, ys)
    except ValueError:
        return False
    return all(torch.allclose(x.detach().cpu(), y.detach().cpu(), rtol=rtol, atol=atol)
               for x, y in pairs)


def max_diff(xs, ys):
    """Largest absolute difference between two tensors, lists or dicts of tensors (float64)."""
    return max(float((x.detach().cpu().double() - y.detach().cpu().double()).abs().max())
               for x, y in _pairs(xs, ys))



def rel_diff(a, b, start):
    """||a - b|| / ||b - start|| over {name: tensor} dicts: how far apart two runs ended,
    relative to how far training moved."""
    num = sum(float((x.double() - y.double()).pow(2).sum()) for x, y in _pairs(a, b))
    den = sum(float((y.double() - s.double()).pow(2).sum()) for y, s in _pairs(b, start))
    return (num / den) ** 0.5


def cpu_copy(t):
    """What a rank hands back to be compared: `t` detached, on the CPU, in storage of its own."""
    return t.detach().cpu().clone()
