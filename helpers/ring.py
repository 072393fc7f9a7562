"""The ring collectives on simulated devices (lists of tensors, one per device): a reduce-scatter,
an all-gather, and the all-reduce made of the two. Every chunk moves with `runtime.traffic.send`,
so a ByteLog counts the bytes each device puts on its link. Part I's tensor parallelism and
Part IV's in-place `ring_allreduce` both run these.
"""
import torch

from .runtime.traffic import send

__all__ = ["ring_reduce_scatter", "ring_all_gather", "ring_all_reduce"]


def ring_reduce_scatter(xs, devices, log=None, what="reduce-scatter", cut=None):
    """Ring reduce-scatter of k same-shape tensors (xs[i] on devices[i]): each is cut into k
    chunks (flat, near-equal; or cut(x)'s k chunks); in k-1 steps device i passes one chunk to
    device i+1, which adds its own.
    Returns chunks[i][c], device i's copy of chunk c: chunk (i+1) % k holds the full sum."""
    k = len(xs)
    chunks = [list(cut(x) if cut else x.reshape(-1).tensor_split(k)) for x in xs]
    for step in range(k - 1):
        for i in range(k):
            c, dst = (i - step) % k, (i + 1) % k
            chunks[dst][c] = chunks[dst][c] + send(chunks[i][c], i, dst, devices, log, what)
    return chunks


def ring_all_gather(chunks, devices, log=None, what="all-gather"):
    """Ring all-gather after ring_reduce_scatter: device i starts with the full chunk (i+1) % k
    and in k-1 steps passes the newest chunk it holds to device i+1. Returns the chunks."""
    k = len(chunks)
    chunks = [list(c) for c in chunks]
    for step in range(k - 1):
        for i in range(k):
            c, dst = (i + 1 - step) % k, (i + 1) % k
            chunks[dst][c] = send(chunks[i][c], i, dst, devices, log, what)
    return chunks


def ring_all_reduce(xs, devices, log=None, what="all-reduce"):
    """Sum of the k tensors xs (xs[i] on devices[i]), returned to every device as a new tensor:
    reduce-scatter, then all-gather. Each device sends 2(k-1) chunks, 2(k-1)/k of a tensor.
    (Part IV's `helpers.ring_allreduce`, data_parallel/allreduce.py, does it in place and
    returns the elements each device sent.)"""
    if len(xs) != len(devices):
        raise ValueError(f"{len(xs)} tensors for {len(devices)} devices: give one per device")
    if len(xs) == 1:
        return [xs[0]]
    chunks = ring_reduce_scatter(xs, devices, log, f"{what}: reduce-scatter")
    chunks = ring_all_gather(chunks, devices, log, f"{what}: all-gather")
    return [torch.cat(c).reshape(x.shape) for c, x in zip(chunks, xs)]  # noqa: B905
