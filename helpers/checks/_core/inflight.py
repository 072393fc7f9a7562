"""A rank that reads or writes the tensors of its own async call before waiting for it fails.

The simulated Work completes as its launch returns (runtime/work.py) and a send is copied at
launch, so the values come out right whatever the rank does in between. On gloo the collective
runs on a background thread and on NCCL on its own stream: until the rank waits, the input and
output of a collective, the buffer of an isend and the buffer of an irecv are still in use, and
`p.grad.div_(world)` after `all_reduce(p.grad, async_op=True)` races the reduction. So, from
the launch until the rank's wait (as work.py records it: `wait()`, `result()`, `is_completed()`,
the future's `wait()`/`value()`/`done()`, `wait_all`), the byte ranges of those tensors are in
flight for that rank, and any aten operation of the rank's threads (provenance.py's dispatch
mode) that touches one of them, through any view, fails the check (memory the call only reads,
an isend's buffer or an all-gather's input, only when written: reading it meanwhile is safe).
So does reading their values out of torch without an aten operation (exits.py's exits, which
the World's watch hands to `exit`: `.tolist()`, `.numpy()`, `np.asarray`, printing, a storage's
own reads) or writing into them from outside torch (`.apply_()`, `storage._set_from_file`).
A thread rank's comm send (`comm.send`, the sends of `isendrecv` and `sendrecv`) is copied as it
is posted, yet on processes DistComm posts an isend that `comm.wait()` finishes: its tensor is in
flight the same way (`posted`), from the send until the rank's `comm.wait()` (isendrecv's: the
Exchange's `wait()`), where runtime/comm.py records the wait; a write names that wait.
Not counted: making a view or a tensor of the same shape (no values move), the network's own
work (provenance's exempt `network()`), and a `then()` / `add_done_callback()` callback of the
work's future, which runs once the work completed (`landed`).
"""
import contextlib
import inspect
import threading

import torch
from torch.utils._pytree import tree_leaves

from . import addresses
from .waits import comm_what, what

__all__ = ["InFlight", "launched", "posted"]

FIX = ("wait() for the work before reading or writing its tensors: on gloo and NCCL the "
       "{what} is still running")
_WRITES = (" before writing a tensor {}, or send a copy (`t.clone()`): on processes (gloo, "
           "NCCL) the send may still be reading it")
COMM_FIX = {"send": "call comm.wait()" + _WRITES.format("you passed to comm.send"),
            "isendrecv": "call the wait() of the Exchange isendrecv returned (after a sendrecv: "
                         "comm.wait())" + _WRITES.format("it sends")}
# operations that read only a tensor's shape, dtype and device, never its values
_METADATA = frozenset({"empty_like", "new_empty", "new_empty_strided", "zeros_like",
                       "ones_like", "full_like", "rand_like", "randn_like", "randint_like",
                       "new_zeros", "new_ones", "new_full"})
# exits (exits.py's `how`) that read no values: an address, the storage object itself (its own
# reads are exits of their own); and the one that writes the tensor it is called on
_NO_VALUES = frozenset({*addresses.HOWS, ".untyped_storage()", ".storage()", "._typed_storage()"})
_WRITES_SELF = frozenset({".apply_()"})


def _span(t):
    """(storage key, first byte, end byte) of the memory tensor `t` covers, or None."""
    try:
        if t.numel() == 0:
            return None
        key = t.untyped_storage()._cdata
        size = t.element_size()
        extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))
        start = t.storage_offset() * size
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None                 # no storage of its own (a wrapper subclass, sparse ...)
    return key, start, start + extent * size


def _touches(func):
    """Whether aten `func` reads or writes values (not a view, not a same-shape maker)."""
    schema = func._schema
    if func.overloadpacket.__name__ in _METADATA:
        return False
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    views = schema.returns and all(r.alias_info is not None and not r.alias_info.is_write
                                   for r in schema.returns)
    return writes or not views


def _written(func, args, kwargs):
    """The ids of the tensors aten `func` writes (its in-place and out= arguments)."""
    ids = set()
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            v = args[i] if i < len(args) else kwargs.get(a.name)
            ids.update(id(t) for t in tree_leaves(v) if isinstance(t, torch.Tensor))
    return ids


class _Entry:
    """Tensors of one async call; `read_only`: the call only reads them (an isend's buffer, an
    out-of-place collective's input), so reading them meanwhile is no race, writing is; `fix`:
    the words that name the wait (None: a torch.distributed work's)."""
    __slots__ = ("message", "what", "role", "spans", "tensors", "read_only", "fix")

    def __init__(self, message, what, role, tensors, fix=None):
        self.message, self.what, self.role, self.tensors = message, what, role, tensors
        self.fix = fix
        self.spans = [s for s in map(_span, tensors) if s is not None]
        self.read_only = role == "input" or message.op == "send"


class InFlight:
    """Each rank's async calls not yet waited for, and the memory they hold (module docstring).
    `refuse(rank, words)`: how a World fails the answer (recorded, so a caught one fails too)."""

    def __init__(self, refuse):
        self._refuse = refuse
        self._pending = {}          # rank -> [_Entry]
        self._local = threading.local()

    def add(self, rank, message, what, roles, fix=None):
        """Rank `rank` launched `message` (`what`: "rank 0's all_reduce ..."); `roles`:
        [(role, tensors)], e.g. [("output", [out]), ("input", [x])]; `fix`: _Entry's."""
        if rank is None or message is None:
            return
        entries = self._pending.setdefault(rank, [])
        for role, tensors in roles:
            tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
            if tensors:
                entries.append(_Entry(message, what, role, tensors, fix))

    @contextlib.contextmanager
    def landed(self, message):
        """A callback of `message`'s future runs: the work completed, its tensors are free."""
        done = getattr(self._local, "landed", ())
        self._local.landed = (*done, message)
        try:
            yield
        finally:
            self._local.landed = done

    def _live(self, rank):
        """Rank `rank`'s entries not yet waited for, but those whose callback runs here."""
        entries = self._pending.get(rank)
        if not entries:
            return ()
        entries[:] = [e for e in entries if e.message.waited is None]
        landed = getattr(self._local, "landed", ())
        return [e for e in entries if e.message not in landed]

    def check(self, rank, func, args, kwargs):
        """Fail if aten `func(*args, **kwargs)`, run by rank `rank`, reads or writes memory in
        flight (only writes, for memory the call only reads)."""
        live = self._live(rank)
        if not live or not _touches(func):
            return
        written = _written(func, args, kwargs)
        for t in tree_leaves((args, kwargs)):
            span = _span(t) if isinstance(t, torch.Tensor) else None
            for e in live if span is not None else ():
                if (id(t) in written or not e.read_only) and _overlaps(e, span):
                    self._fail(rank, e, f"ran torch's {func.overloadpacket.__name__} on")

    def exit(self, rank, t, how, writes=False):
        """Rank `rank` read `t`'s values out of torch without an aten operation (exits.py's
        `how`: `.tolist()`, `.numpy()`, `np.asarray()`, a storage's reads ...), or wrote into
        its memory from outside torch (`writes`): fail as an aten read or write of `t` does."""
        live = self._live(rank)
        span = _span(t) if live and how not in _NO_VALUES else None
        writes = writes or how in _WRITES_SELF
        for e in live if span is not None else ():
            if (writes or not e.read_only) and _overlaps(e, span):
                self._fail(rank, e, "wrote" if writes else "read", f" ({how})")

    def _fail(self, rank, e, did, how=""):
        what = "collective" if e.message.op not in ("send", "irecv") else "transfer"
        self._refuse(rank, f"rank {rank} {did} the {e.role} of {e.what}{how} before waiting for "
                     "it: " + (e.fix or FIX.format(what=what)))


def _overlaps(e, span):
    """Whether memory `span` (_span's) shares a byte with one of entry `e`'s tensors."""
    return any(k == span[0] and a < span[2] and span[1] < b for k, a, b in e.spans)


def _role(name):
    return "output" if name.startswith("output") or name == "tensor_list" else (
        "input" if name.startswith("input") else "tensor")


def launched(world, call, args, kwargs):
    """torch.distributed's `call(world, *args, **kwargs)` returned an async Work in a rank: its
    tensors (by the parameter that took them: output, input, tensor) are in flight."""
    rank = world.rank
    line = world.timeline[rank][-1] if rank is not None and world.timeline[rank] else None
    if line is None or line[1] != "launch":
        return
    bound = inspect.signature(call).bind(world, *args, **kwargs).arguments
    roles = [(_role(k), v if isinstance(v, (list, tuple)) else [v]) for k, v in bound.items()]
    world.in_flight.add(rank, line[2], what(rank, line[2]), roles)


def posted(in_flight, rank, m, t, call):
    """Rank `rank`'s comm call `call` ("send", "isendrecv") posted `t` as Message `m`: `t` is in
    flight, for writes, until the rank's wait records `m.waited` (runtime/comm.py)."""
    in_flight.add(rank, m, comm_what(rank, m, call), [("buffer", [t])], COMM_FIX[call])
