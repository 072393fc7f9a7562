"""Memory outside torch between thread ranks: storages over memory torch did not allocate.

`torch.from_numpy`, `as_tensor`/`asarray` of an array, `frombuffer`, `from_file` and dlpack wrap
memory that torch did not allocate (the storage is not `resizable()`). One module-level numpy
array, bytearray, mmap or file wrapped in every rank gives each rank a different storage over the
same memory, so provenance.py, which keeps an owner per storage, would not see one rank read what
another wrote there. For one run of a World, `Outside` links a storage over such memory, when a
rank first uses it, to every storage already seen whose bytes overlap it (another rank's wrapper,
or a tensor whose memory reached numpy): provenance.py then treats linked storages as one (a write
through one is a write through all). Memory written without torch (numpy, a file) is judged by its
values instead: provenance.py compares the values a rank reads from such a storage with the floats
only other ranks read out (rank_numbers.py).

A storage whose address a rank took (`data_ptr()`, addresses.py) is exposed: any memory made
from the address reads it raw at any time, so provenance.py counts every write into it as read
out by that rank.

What it does not see: one file mapped by each rank at its own address (`from_file` with
`shared=True`) holding round values (rank_numbers.is_round). torch's own memory written through a
numpy view of it (`t.numpy()[:] = ...`) is provenance.py's: the views a rank gets are read-only.
"""
import threading

import torch
from torch.utils._python_dispatch import _disable_current_modes

from . import addresses
from .storage_exits import HOWS

__all__ = ["Outside", "span", "rebuilt_views", "as_read"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def span(storage):
    """(device, first byte, end) of `storage`'s memory, or None (no bytes, no address)."""
    try:
        n, p = storage.nbytes(), storage.data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    return (str(storage.device), p, p + n) if n and p else None


def _outside(storage):
    """Whether torch did not allocate `storage`'s memory (numpy's, a buffer's, a file's)."""
    try:
        return not storage.resizable()
    except (RuntimeError, NotImplementedError, TypeError):
        return False


class Outside:
    """The storages over memory outside torch seen in one run, and which overlap which."""

    def __init__(self):
        self.lock = threading.Lock()
        self.keys = set()       # keys of storages over memory torch did not allocate
        self.alias = {}         # key -> {key of another storage over the same bytes: storage}
        self.exposed = {}       # key -> the ranks that took its address (addresses.py)

    def clear(self):
        with self.lock:
            self.keys.clear()
            self.alias.clear()
            self.exposed.clear()

    def expose(self, key, rank):
        """Rank `rank` took the address of storage `key`'s memory (`data_ptr()`): whatever it
        holds from now on may be read raw at any time, so every write into it counts as read
        out by that rank (provenance.py)."""
        with self.lock:
            self.exposed.setdefault(key, set()).add(rank)

    def exposed_by(self, key):
        """The ranks that took the address of storage `key` (empty if none)."""
        with self.lock:
            return set(self.exposed.get(key, ()))

    def first_sight(self, key, storage, known):
        """`storage` (key `key`) is used for the first time: if its memory is outside torch,
        link it with each storage of `known()` ((key, storage) pairs) whose bytes overlap its
        own; returns those keys. Torch's own storages never overlap while they are kept alive,
        so only a storage outside torch is compared."""
        if not _outside(storage):
            return []
        mine = span(storage)
        if mine is None:
            return []
        found = []
        for k, other in known():
            theirs = span(other) if k != key else None
            if theirs and theirs[0] == mine[0] and theirs[1] < mine[2] and mine[1] < theirs[2]:
                found.append((k, other))
        with self.lock:
            self.keys.add(key)
            for k, other in found:
                self.alias.setdefault(key, {})[k] = other
                self.alias.setdefault(k, {})[key] = storage
        return [k for k, _ in found]

    def written(self, key):
        """The storage `key` was written from outside torch (`_set_from_file`, `storage[i] =
        b`: storage_exits.py): its values are judged at every use, as memory outside torch."""
        with self.lock:
            self.keys.add(key)

    def aliases(self, key):
        """(key, storage) of the storages linked to `key`'s."""
        with self.lock:
            return list(self.alias.get(key, {}).items())


def rebuilt_views(storage, dtype):
    """All of `storage` read as each floating dtype and as `dtype`: a storage a rank set on a
    tensor that no rank's operation made (rebuilt in C from bytes: unpickling, torch.load, a
    storage from a buffer) is judged by its values, whatever dtype it is read as later."""
    views = []
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        for dt in dict.fromkeys((*_FLOATS, dtype)):
            n = storage.nbytes() // dt.itemsize
            if n and storage.device.type == "cpu":
                views.append(torch.empty(0, dtype=dt).set_(storage, 0, (n,)))
    return views


def as_read(t, how):
    """What an exit `how` of `t` read: `t`, or for a storage's own exit or an address
    (storage_exits.py, addresses.py: `t` is a uint8 tensor over its bytes, whose dtype nobody
    knows) all of it as each float dtype."""
    whole = how in HOWS or how in addresses.HOWS
    return rebuilt_views(t.untyped_storage(), t.dtype) if whole else [t]
