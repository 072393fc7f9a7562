"""Bytes a World rank received in a message are its own to reinterpret (provenance.py's rules on
bits viewed as floats and on numbers read from memory outside torch): a rank that packs int8
values and its float scales' bytes into one all-gather and reads the scales back with
`.view(torch.float32)`, or through numpy, made those floats from what arrived, not from numbers
another rank left in a global.

What arrived is kept as a copy, made as the network delivers it (inside `World._delivering`, of
each tensor the delivery wrote), for the World's run: a write of the rank's own into a received
buffer afterwards (an in-place clamp, its own slot rewritten, numpy's view of it) changes nothing
of what arrived, and bits smuggled past the comm and copied into a received buffer are in no copy,
so they cannot be laundered that way.
"""
import threading

import torch
from torch.utils._python_dispatch import _disable_current_modes

from . import rank_numbers
from .nesting import Nesting

__all__ = ["Arrived", "viewed_bits"]


class Arrived:
    """Copies of the bytes the network delivered to each rank, for one World run."""

    def __init__(self):
        self.copies = {}        # rank -> [uint8 tensors: what one delivery wrote, in order]
        self.lock = threading.Lock()
        self.delivering = Nesting()     # around the network's delivery (World._delivering)

    def clear(self):
        with self.lock:
            self.copies.clear()

    def wrote(self, rank, tensors):
        """The network's work in rank `rank` wrote `tensors`: kept as copies, inside a
        delivery (a CPU tensor's elements, in order, as bytes)."""
        if not self.delivering:
            return
        kept = []
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            for t in tensors:
                copy = _bytes_of(t)
                if copy is not None:
                    kept.append(copy)
        with self.lock:
            self.copies.setdefault(rank, []).extend(kept)

    def floats(self, rank, dtype):
        """Every value of `dtype` the bytes `rank` received hold, read at each byte alignment
        (a packed buffer puts them at any offset)."""
        with self.lock:
            copies = list(self.copies.get(rank, ()))
        found, size = set(), dtype.itemsize
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            for raw in copies:
                for start in range(size):
                    n = (raw.numel() - start) // size
                    if n > 0:
                        bits = raw[start:start + n * size].clone().view(dtype)
                        found.update(rank_numbers.values(bits))
        return found

    def not_arrived(self, rank, made, dtype, exited):
        """The numbers of `made` (read as `dtype` by rank `rank`) that did not arrive at it in a
        message, when some of them are numbers only other ranks read out (`exited`); else []."""
        if not rank_numbers.foreign_in(made, rank, exited):
            return []
        arrived = self.floats(rank, dtype)
        return [v for v in made if v not in arrived]


def _bytes_of(t):
    """A copy of CPU tensor `t`'s elements as bytes (read through a plain tensor over its
    storage: no subclass's code runs), or None (no storage of its own, another device)."""
    try:
        storage = torch._C.TensorBase.untyped_storage(t)
        if storage.device.type != "cpu" or t.layout != torch.strided:
            return None
        plain = torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.size(),
                                                   t.stride())
        return plain.clone(memory_format=torch.contiguous_format).view(-1).view(torch.uint8)
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None


def viewed_bits(p, rank, t, view):
    """`t` viewed as `view` (another dtype) in rank `rank` of provenance `p`: a float tensor's
    values count as read out (its bits may leave torch in pieces too small to fingerprint); floats
    made from bits fail if only other ranks read them out and they did not arrive at this rank in
    a message (as if made from Python data)."""
    if t.dtype == view.dtype:
        return
    if t.is_floating_point():
        p.read_out(rank, rank_numbers.values(t))
    if view.is_floating_point() and p.exited:
        made = rank_numbers.values(view)
        p.refuse_foreign(rank, p.arrived.not_arrived(rank, made, view.dtype, p.exited),
                         "made floats from the bits of another dtype holding")
