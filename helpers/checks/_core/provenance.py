"""Data provenance between thread ranks: a rank may use only tensors it made, tensors the check
handed to it, and what came to it through the network.

Thread ranks share one process, so an answer could pass a tensor past the comm a check judges:
rank 0 appends its gradient to a module global, rank 1 reads it after a decoy all-reduce. Each
rank's thread runs under a dispatch mode that records, per storage, which rank made it or last
wrote into it (a view is not a new storage; an in-place or out= operation writes its target),
and refuses an operation of one rank that reads or writes a storage another rank made. The
storages are kept alive for the run, so no address is reused meanwhile. The network's own work
(sending, receiving, combining a collective, delivering a result) runs exempt, and what it
hands over is the receiver's. The exits that read memory without an aten operation (exits.py:
tolist, numpy, __array__, repr, pickling, the storage, the Python-callback kernels apply_, map_
and map2_, whose other tensors are read too; a storage's own reads, storage_exits.py, as every
float dtype; an address, `data_ptr()`, addresses.py, and every later write into the storage
it exposes) are checked as one; a storage written from outside torch (`_set_from_file`,
`storage[i] = b`) is judged by its values at every use; the numbers a callback receives carry
the rank (rank_numbers.py); dlpack, whose array no one follows, is refused in a rank. The numpy
arrays `.numpy()` and `np.asarray(t)` hand a rank are read-only views (a write through one
would change the tensor with no operation to see: rank_arrays.read_only).

The tensors a check hands the answer in a rank's thread (its arguments, with the parameters,
buffers and gradients of modules among them) are that rank's: another rank's answer that reads
them (through a module dict, a closure list) fails as if the owner had made them; a storage
handed to more than one rank stays shared. The check's own code in a rank (slicing every rank's
inputs before the call) is exempt. Storages over memory torch did not allocate (a numpy array,
a bytearray, a file, wrapped in every rank) are linked by their bytes (outside.py), so a rank
that reads what another wrote there through its own wrapper fails too. A storage rebuilt in C
from bytes (unpickled, torch.load) that a rank sets on a tensor is judged by its values.

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

from . import addresses, outside, rank_arrays, rank_builtins, rank_numbers
from .arrived import Arrived, viewed_bits
from .composite import split_composite
from .exits import CALLBACKS, watch_exits
from .handed import handed
from .nesting import Nesting
from .run import CheckFailed, stand_in

__all__ = ["world_run", "Provenance", "handed_in"]


def _storage(t):
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None                     # no storage of its own (a wrapper subclass, sparse ...)


_SHARED = "shared"       # a storage the check handed to more than one rank
_THROUGH = (
    "and it never travelled through the comm: ranks share data only by sending it (send/recv or "
    "a collective), not through a Python object every rank can reach (a module global, a list "
    "in a closure)")


def _used(rank, made, what):
    """The refusal of rank `rank`'s use of a storage made as `made` says (rank, how[, memory])."""
    if len(made) > 3:
        return (f"rank {rank} used memory that rank {made[0]} wrote ({made[1]}) through its own "
                f"tensor over the same bytes, outside torch (a numpy array, buffer or file every "
                f"rank wraps with torch.from_numpy, frombuffer, dlpack or from_file), in {what}: "
                "pass it through the comm (send/recv or a collective)")
    return f"rank {rank} used a tensor that rank {made[0]} made ({made[1]}) in {what}, {_THROUGH}"


def in_world():
    """Whether this thread is a World rank's (its provenance mode is active)."""
    return any(isinstance(m, _Mode) for m in _get_current_dispatch_mode_stack())


class _Run:
    """One World run: `live` until it ends (hashable, one per run)."""
    __slots__ = ("live",)

    def __init__(self):
        self.live = True


def world_run():
    """The World run this thread is a rank of (its provenance), or None outside a World."""
    return next((getattr(m.p, "run", None) for m in _get_current_dispatch_mode_stack()
                 if isinstance(m, _Mode)), None)


@contextlib.contextmanager
def handed_in(args, kwargs):
    """Around a check's call of the answer: in a World rank's thread, the tensors handed to it
    are that rank's (see the module's docstring), and the call is the answer's work."""
    mode = next((m for m in _get_current_dispatch_mode_stack() if isinstance(m, _Mode)), None)
    if mode is None:
        yield
        return
    mode.p.hand_in(mode.rank, handed((args, kwargs)))
    with mode.p.answering():
        yield


_LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)
_SCALAR = torch.ops.aten._local_scalar_dense.default
_VIEW_DTYPE = torch.ops.aten.view.dtype


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
        self.seen = {}        # storage key -> storage, of those used or handed but not made
        self.handed = {}      # storage key -> the rank the check handed it to, or _SHARED
        self.memory = outside.Outside()
        self.arrived = Arrived()     # copies of what the network delivered to each rank
        self._lock = threading.Lock()
        self.exited = {}      # floating value -> the ranks that read it out of torch
        self.exited_last = {}  # the same, of the last run (a rank's result is judged after it)
        self.network = Nesting()   # the network's own work in a rank: exempt (how data travels)
        self.answering = Nesting()  # a rank's thread inside the answer's call (handed_in)

    def mode(self, rank):
        return _Mode(self, rank)

    def touch(self, rank, tensors, what):
        if self.network:
            return
        for t in tensors:
            storage = _storage(t)
            if storage is None:
                continue
            key = storage._cdata
            made = self.owner.get(key)
            if made is None:
                if key not in self.seen:
                    made = self._first_sight(rank, key, storage)
                if made is None and self.handed:
                    self._refuse_handed(rank, key, what)
            if made is not None and made[0] != rank:
                raise CheckFailed(_used(rank, made, what))
            if self.exited and key in self.memory.keys:     # written there outside torch?
                made = rank_numbers.values(t)       # (what arrived in a message is the rank's)
                self.refuse_foreign(rank, self.arrived.not_arrived(rank, made, t.dtype,
                                                                   self.exited),
                                    "read from memory outside torch (numpy, a buffer, a file)")

    def _first_sight(self, rank, key, storage):
        """A storage not made by a rank, used for the first time: kept, and linked to the
        storages over the same memory (outside.py); what made the first of those another rank
        wrote, as a refusal, or None."""
        def known():     # copied in C, at once: another rank's thread may add a storage
            owner, seen = dict.copy(self.owner), dict.copy(self.seen)
            return [(k, m[2]) for k, m in owner.items()] + list(seen.items())
        self.seen[key] = storage
        for k in self.memory.first_sight(key, storage, known):
            made = self.owner.get(k)
            if made is not None and made[0] != rank:
                return (*made[:3], "memory")
        return None

    def _refuse_handed(self, rank, key, what):
        to = self.handed.get(key)
        if to is None or to == _SHARED or to == rank:
            return
        if self.answering or self.world.rank is None:
            raise CheckFailed(f"rank {rank} used a tensor the check handed to rank {to} (one of "
                              f"its inputs) in {what}, {_THROUGH}")

    def hand_in(self, rank, tensors):
        """The check hands rank `rank` these tensors: its own, unless handed to another too."""
        with self._lock:
            for t in tensors:
                storage = _storage(t)
                if storage is None:
                    continue
                key = storage._cdata
                self.seen.setdefault(key, storage)
                to = self.handed.setdefault(key, rank)
                if to != rank:
                    self.handed[key] = _SHARED

    def mark(self, rank, tensors, what):
        for t in tensors:
            storage = _storage(t)
            if storage is not None:     # kept alive for the run: no address is reused meanwhile
                key = storage._cdata
                made = self.owner.get(key)     # the network writes only into the rank's own:
                if made and made[0] != rank and self.exempt():    # refused whatever the timing
                    self.world._refuse(rank, f"the network wrote rank {rank}'s result ({what}) "
                                       f"into a tensor that rank {made[0]} made ({made[1]}), "
                                       + _THROUGH)
                self.owner[key] = (rank, what, storage)
                aliases = self.memory.aliases(key) if self.memory.alias else ()
                for k, other in aliases:    # a write through one wrapper is a write through all
                    self.owner[k] = (rank, what, other, "memory")
                if self.exempt():       # inside a delivery: a copy of what arrived
                    self.arrived.wrote(rank, [t])
                for r in self.memory.exposed_by(key) if self.memory.exposed else ():
                    for view in outside.rebuilt_views(storage, t.dtype):   # its address known
                        self.read_out(r, rank_numbers.values(view))

    def rank_here(self):
        """The rank whose work this thread does: its own, or that of the rank that started it."""
        if self.world.rank is not None:
            return self.world.rank
        for mode in _get_current_dispatch_mode_stack():
            if isinstance(mode, _Mode) and mode.p is self:
                return mode.rank
        return None

    def exempt(self):
        return bool(self.network)

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
        self._clear()
        self.exited.clear()
        self.run = _Run()           # this run, while it lasts (patched.py)

        def exit_(t, how):
            rank = self.rank_here()
            if rank is not None:
                self.touch(rank, [t], how)
                if not self.exempt():
                    if how == "dlpack":      # the array it makes is out of sight: not a RankArray
                        raise CheckFailed(f"rank {rank} handed a tensor to another library "
                                          "through dlpack: in a world of ranks, read values out "
                                          "with .numpy() or .tolist(), which the check follows")
                    if how in addresses.HOWS:       # any later write can be read there too
                        self.memory.expose(t.untyped_storage()._cdata, rank)
                    for read in outside.as_read(t, how):    # a storage: as any float
                        self.read_out(rank, rank_numbers.values(read))

        def entered(t, how):      # written from outside torch: its values judged at every use
            if self.rank_here() is not None and not self.exempt():
                self.memory.written(t.untyped_storage()._cdata)

        def tagging(name):
            original = getattr(torch.Tensor, name)

            @stand_in(original)
            def call(t, *args, **kwargs):
                out = original(t, *args, **kwargs)
                rank = self.rank_here()
                if rank is None or self.exempt():
                    return out
                if name in ("numpy", "__array__"):      # a view: writes through it unseen
                    out = rank_arrays.read_only(out)
                    return out if t.dtype == torch.bool else rank_arrays.own_array(out, rank)
                if t.dtype == torch.bool:
                    return out
                if not t.is_complex():        # floats, and integers not round
                    self.read_out(rank, [out] if isinstance(out, (float, int))
                                  else tree_leaves(out))
                return rank_numbers.tag(out, rank)
            return call
        def tagging_callback(name):      # apply_(fn), map_(t, fn): fn gets tagged numbers
            original = getattr(torch.Tensor, name)

            @stand_in(original)
            def call(t, *args):
                rank = self.rank_here()
                if rank is None or self.exempt() or not args or not callable(args[-1]):
                    return original(t, *args)
                fn = args[-1]
                return original(t, *args[:-1],
                                lambda *xs: fn(*(rank_numbers.tag(x, rank) for x in xs)))
            return call
        # float(t), int(t) must return a plain number: float(t) is fingerprinted in _Mode
        names = ("item", "tolist", "numpy", "__array__") + CALLBACKS
        try:
            with watch_exits(exit_, entered), rank_arrays.watch_numbers(
                    lambda: None if self.exempt() else self.rank_here()), \
                    rank_builtins.shadowing():
                saved = {name: torch.Tensor.__dict__.get(name) for name in names}
                for name in names:
                    setattr(torch.Tensor, name, tagging_callback(name) if name in CALLBACKS
                            else tagging(name))
                try:
                    yield
                finally:
                    for name, original in saved.items():
                        if original is None:
                            if name in torch.Tensor.__dict__:
                                delattr(torch.Tensor, name)
                        else:
                            setattr(torch.Tensor, name, original)
        finally:
            self.run.live = False
            self._clear()
            self.exited_last, self.exited = self.exited, {}

    def _clear(self):
        self.owner.clear()
        self.seen.clear()
        self.handed.clear()
        self.memory.clear()
        self.arrived.clear()


class _Mode(TorchDispatchMode):
    """One rank's watch: refuse another rank's storages, record what this rank makes."""

    def __init__(self, provenance, rank):
        super().__init__()
        self.p, self.rank = provenance, rank

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        parts = split_composite(self, func, args, kwargs)
        if parts is not NotImplemented:      # inference mode: its parts were watched
            return parts
        leaves = tree_leaves((args, kwargs))
        self.p.touch(self.rank, [t for t in leaves if isinstance(t, torch.Tensor)], func)
        if not self.p.exempt():     # an async call's tensors before its wait (inflight.py)
            self.p.world.in_flight.check(self.rank, func, args, kwargs)
        if self.p.exited and not self.p.exempt():     # set_ on a storage rebuilt from bytes
            for s in leaves:
                if isinstance(s, (torch.UntypedStorage, torch.TypedStorage)):
                    self._rebuilt(s, getattr(args[0], "dtype", torch.uint8))
        if self.p.exited:        # numbers from Python: a scalar argument, a tensor made from data
            self.p.refuse_foreign(self.rank, [x for x in leaves if isinstance(x, (float, int))
                                              and not isinstance(x, bool)], f"passed to {func}")
            if func in _LIFTS:      # (numbers whose bytes arrived in a message: the rank's)
                self.p.refuse_foreign(self.rank, self.p.arrived.not_arrived(
                    self.rank, rank_numbers.values(args[0]), args[0].dtype, self.p.exited),
                    "made a tensor from")
        out = func(*args, **kwargs)
        if func is _SCALAR and isinstance(out, (float, int)) and not self.p.exempt():
            self.p.read_out(self.rank, [out])       # item(), float(t): kept as a fingerprint
        if func is _VIEW_DTYPE and not self.p.exempt():
            viewed_bits(self.p, self.rank, args[0], out)
        positions, fresh = _writes(func)
        written = [args[i] if i < len(args) else kwargs.get(name) for i, name in positions]
        outs = out if isinstance(out, (tuple, list)) and len(fresh) > 1 else (out,)
        outs = outs if fresh else ()                # an operation that returns nothing
        written += [o for o, new in zip(outs, fresh, strict=True) if new]
        self.p.mark(self.rank, [t for t in tree_leaves(written) if isinstance(t, torch.Tensor)],
                    func)
        return out

    def _rebuilt(self, storage, dtype):
        """A storage no rank's operation made nor the check handed (made in C from bytes):
        its values, read as any dtype, fail if only other ranks read them out."""
        storage = getattr(storage, "_untyped_storage", storage)
        if storage._cdata not in self.p.owner and storage._cdata not in self.p.seen:
            for view in outside.rebuilt_views(storage, dtype):
                self.p.refuse_foreign(self.rank, rank_numbers.values(view), "rebuilt a tensor "
                                      "from bytes (pickle.loads, torch.load) holding")
