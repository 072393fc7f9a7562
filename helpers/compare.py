"""Comparing results: a split run against the unsplit one, tensor by tensor.

`all_close` says whether two tensors (or lists) agree within rounding; `max_abs_diff` and
`max_diff` say by how much they differ (lists, or {name: tensor} dicts); `rel_diff` sizes a
difference against how far training moved.
"""
import torch

__all__ = ["all_close", "max_abs_diff", "max_diff", "rel_diff"]


def all_close(xs, ys, rtol=1e-4, atol=1e-5):
    """True when two tensors (or two lists of tensors) have equal shapes and values within
    rounding."""
    if isinstance(xs, torch.Tensor):
        xs, ys = [xs], [ys]
    return len(xs) == len(ys) and all(
        x.shape == y.shape
        and torch.allclose(x.detach().cpu(), y.detach().cpu(), rtol=rtol, atol=atol)
        for x, y in zip(xs, ys))


def max_abs_diff(xs, ys):
    """Largest absolute difference between two tensors or two lists of tensors."""
    if isinstance(xs, torch.Tensor):
        xs, ys = [xs], [ys]
    return max(float((x.detach().cpu().double() - y.detach().cpu().double()).abs().max())
               for x, y in zip(xs, ys))


def max_diff(a, b):
    """Largest absolute difference between two {name: tensor} dicts (same names)."""
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in a)


def rel_diff(a, b, start):
    """||a - b|| / ||b - start||: how far apart two runs ended, relative to how far training
    moved."""
    num = sum(float((a[k].float() - b[k].float()).pow(2).sum()) for k in a)
    den = sum(float((b[k].float() - start[k].float()).pow(2).sum()) for k in a)
    return (num / den) ** 0.5

