"""Bytes a World rank received in a message are its own to reinterpret (provenance.py's rule on
bits viewed as floats): a rank that packs int8 values and its float scales' bytes into one
all-gather and reads the scales back with `.view(torch.float32)` made those floats from what
arrived, not from numbers another rank left in a global.

A storage counts as arrived while it holds what the network delivered into it (a recv, a
collective's delivery: `World._delivering`) and nothing since: a write of the rank's own into it
(an operation, or from outside torch), or memory outside torch or with its address taken, drops
it, so bits smuggled past the comm cannot be laundered by copying them into a received buffer.
"""
import threading

import torch
from torch.utils._python_dispatch import _disable_current_modes

from . import rank_numbers
from .nesting import Nesting

__all__ = ["Arrived", "viewed_bits"]


class Arrived:
    """The storages each rank received and has not written since, for one World run."""

    def __init__(self):
        self.storages = {}      # storage key -> (rank, storage)
        self.lock = threading.Lock()
        self.delivering = Nesting()     # around the network's delivery (World._delivering)

    def clear(self):
        with self.lock:
            self.storages.clear()

    def wrote(self, rank, keys, storage, exempt):
        """Rank `rank`'s thread wrote the storages `keys` (`storage`: the first's): arrived if
        the network delivered it, no longer arrived if the rank wrote it itself."""
        with self.lock:
            if exempt and self.delivering:
                self.storages[keys[0]] = (rank, storage)
            elif not exempt:
                for key in keys:
                    self.storages.pop(key, None)

    def floats(self, rank, dtype, memory):
        """Every value of `dtype` the bytes `rank` received hold, read at each byte alignment
        (a packed buffer puts them at any offset); memory outside torch (outside.py's `memory`)
        or whose address was taken is skipped: writes into it are not seen."""
        with self.lock:
            held = [s for k, (r, s) in self.storages.items() if r == rank and
                    k not in memory.keys and k not in memory.exposed]
        found, size = set(), dtype.itemsize
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            for storage in held:
                if storage.device.type != "cpu":
                    continue
                raw = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),))
                for start in range(size):
                    n = (raw.numel() - start) // size
                    if n > 0:
                        bits = raw[start:start + n * size].clone().view(dtype)
                        found.update(rank_numbers.values(bits))
        return found


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
        if rank_numbers.foreign_in(made, rank, p.exited):
            arrived = p.arrived.floats(rank, view.dtype, p.memory)
            p.refuse_foreign(rank, [v for v in made if v not in arrived],
                             "made floats from the bits of another dtype holding")
