"""Models built from a seed: the same weights in every rank, also when the ranks are threads.

torch has one random generator per process. Thread ranks (launch(..., threads=True), the
exercise checks) share it: one that seeds it and builds its layers while another draws from it
gets numbers from both, and the "same" model differs between ranks now and then. A build inside
`seeded(seed)` holds one lock and works on a copy of the generator's state: the weights the seed
gives whatever runs beside it, and the caller's random numbers left as they were. Every seeded
builder of the course goes through it; code run on thread ranks draws nothing outside it (or
from a torch.Generator of its own).
"""
import threading
from contextlib import contextmanager

import torch

__all__ = ["seeded"]

_BUILDING = threading.RLock()   # re-entrant: a seeded builder may call another


@contextmanager
def seeded(seed):
    """Inside: torch's CPU generator seeded with `seed`, for this thread alone; after: the
    generator as it was before (CUDA's untouched: the course builds on the CPU, then moves)."""
    with _BUILDING, torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        yield
