"""Data provenance between thread ranks: a rank may use only tensors it made, tensors the check
handed in, and what came to it through the network.

Thread ranks share one process, so an answer could pass a tensor past the comm a check judges:
rank 0 appends its gradient to a module global, rank 1 reads it after a decoy all-reduce. Each
rank's thread runs under a dispatch mode that records, per storage, which rank made it or last
wrote into it (a view is not a new storage; an in-place or out= operation writes its target),
and refuses an operation of one rank that reads or writes a storage another rank made. The
storages are kept alive for the run, so no address is reused meanwhile. The network's own work
(sending, receiving, combining a collective, delivering a result) runs exempt, and what it
hands over is the receiver's. The exits that read memory without an aten operation (exits.py:
tolist, numpy, __array__, repr, pickling, the storage) are checked as one.

What it does not see: values that leave as Python numbers through an operation the rank is
entitled to (rank 0 calls .item() on its own tensor and puts the float in a global), and work
in threads that carry no dispatch mode (guard.py carries the rank's modes into the threads an
answer starts).
"""
import contextlib
import functools
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_leaves

from . import rank_arrays, rank_builtins, rank_numbers
from .exits import watch_exits
from .run import CheckFailed

__all__ = ["Provenance"]


def _storage(t):
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None                     # no storage of its own (a wrapper subclass, sparse ...)


_LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)
_SCALAR = torch.ops.aten._local_scalar_dense.default


@functools.cache
def _writes(func):
    """(positions and names of the arguments `func` writes, whether each return is fresh)."""
    schema = func._schema
    args = tuple((i, a.name) for i, a in enumerate(schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)
    fresh = tuple(r.alias_info is None or r.alias_info.is_write for r in schema.returns)
    return args, fresh


class Provenance:
    """Which rank made each storage, for one World (see the module's docstring)."""

    def __init__(self, world):
        self.world = world
        self.owner = {}       # storage key -> (rank, operation) that made or wrote it, storage
        self.exited = {}      # floating value -> the ranks that read it out of torch
        self.exited_last = {}  # the same, of the last run (a rank's result is judged after it)
        self._local = threading.local()

    def mode(self, rank):
        return _Mode(self, rank)

    @contextlib.contextmanager
    def network(self):
        """The network's own work in a rank: exempt (it is how data is meant to travel)."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1

    def touch(self, rank, tensors, what):
        if getattr(self._local, "depth", 0):
            return
        for t in tensors:
            storage = _storage(t)
            made = self.owner.get(storage._cdata) if storage is not None else None
            if made is not None and made[0] != rank:
                raise CheckFailed(
                    f"rank {rank} used a tensor that rank {made[0]} made ({made[1]}) in {what}, "
                    "and it never travelled through the comm: ranks share data only by sending "
                    "it (send/recv or a collective), not through a Python object every rank "
                    "can reach (a module global, a list in a closure)")

    def mark(self, rank, tensors, what):
        for t in tensors:
            storage = _storage(t)
            if storage is not None:     # kept alive for the run: no address is reused meanwhile
                self.owner[storage._cdata] = (rank, what, storage)

    def rank_here(self):
        """The rank whose work this thread does: its own, or that of the rank that started it."""
        if self.world.rank is not None:
            return self.world.rank
        for mode in _get_current_dispatch_mode_stack():
            if isinstance(mode, _Mode) and mode.p is self:
                return mode.rank
        return None

    def exempt(self):
        return bool(getattr(self._local, "depth", 0))

    def read_out(self, rank, numbers):
        """Rank `rank` read these floating values out of torch (rank_numbers.py)."""
        for v in numbers:
            if not rank_numbers.is_round(v):
                self.exited.setdefault(v, set()).add(rank)

    def refuse_foreign(self, rank, tree, how):
        """Fail if a number in `tree` is one only other ranks read out (rank_numbers.py)."""
        if self.exited and not self.exempt():
            others = rank_numbers.foreign_in(tree, rank, self.exited)
            if others:
                raise CheckFailed(rank_numbers.foreign_message(rank, others, how))

    @contextlib.contextmanager
    def python_exits(self):
        """For one run: a fresh record; the exits without an aten operation (exits.py: tolist,
        numpy, __array__, repr, pickling, the storage) checked like an operation; the floats a
        rank reads out kept, and tagged with the rank (rank_numbers.py)."""
        self.owner.clear()
        self.exited.clear()

        def exit_(t, how):
            rank = self.rank_here()
            if rank is not None:
                self.touch(rank, [t], how)
                if not self.exempt():
                    self.read_out(rank, rank_numbers.values(t))

        def tagging(name):
            original = getattr(torch.Tensor, name)

            @functools.wraps(original)
            def call(t, *args, **kwargs):
                out = original(t, *args, **kwargs)
                rank = self.rank_here()
                if rank is None or self.exempt() or t.dtype == torch.bool:
                    return out
                if name in ("numpy", "__array__"):
                    return rank_arrays.own_array(out, rank)
                if t.is_floating_point():
                    self.read_out(rank, [out] if isinstance(out, float) else tree_leaves(out))
                return rank_numbers.tag(out, rank)
            return call
        # float(t), int(t) must return a plain number: float(t) is fingerprinted in _Mode
        names = ("item", "tolist", "numpy", "__array__")
        try:
            with watch_exits(exit_), rank_arrays.watch_numbers(
                    lambda: None if self.exempt() else self.rank_here()), \
                    rank_builtins.shadowing():
                saved = {name: torch.Tensor.__dict__.get(name) for name in names}
                for name in names:
                    setattr(torch.Tensor, name, tagging(name))
                try:
                    yield
                finally:
                    for name, original in saved.items():
                        if original is None:
                            delattr(torch.Tensor, name)
                        else:
                            setattr(torch.Tensor, name, original)
        finally:
            self.owner.clear()
            self.exited_last, self.exited = self.exited, {}


class _Mode(TorchDispatchMode):
    """One rank's watch: refuse another rank's storages, record what this rank makes."""

    def __init__(self, provenance, rank):
        super().__init__()
        self.p, self.rank = provenance, rank

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        self.p.touch(self.rank, [t for t in leaves if isinstance(t, torch.Tensor)], func)
        if self.p.exited:        # numbers from Python: a scalar argument, a tensor made from data
            self.p.refuse_foreign(self.rank, [x for x in leaves if isinstance(x, float)],
                                  f"passed to {func}")
            if func in _LIFTS:
                self.p.refuse_foreign(self.rank, rank_numbers.values(args[0]),
                                      "made a tensor from")
        out = func(*args, **kwargs)
        if func is _SCALAR and isinstance(out, float) and not self.p.exempt():
            self.p.read_out(self.rank, [out])       # item(), float(t): kept as a fingerprint
        positions, fresh = _writes(func)
        written = [args[i] if i < len(args) else kwargs.get(name) for i, name in positions]
        outs = out if isinstance(out, (tuple, list)) and len(fresh) > 1 else (out,)
        written += [o for o, new in zip(outs, fresh) if new]
        self.p.mark(self.rank, [t for t in tree_leaves(written) if isinstance(t, torch.Tensor)],
                    func)
        return out
