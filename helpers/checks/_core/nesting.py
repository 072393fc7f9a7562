"""A count of nested blocks per thread: `with n():` enters one, `bool(n)` says whether the
calling thread is inside one. Provenance's network work and answer calls, and the network's
deliveries that arrived.py notes, are each one (the ranks are threads: each keeps its own)."""
import contextlib
import threading

__all__ = ["Nesting"]


class Nesting:
    def __init__(self):
        self._local = threading.local()

    @contextlib.contextmanager
    def __call__(self):
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1

    def __bool__(self):
        return bool(getattr(self._local, "depth", 0))
