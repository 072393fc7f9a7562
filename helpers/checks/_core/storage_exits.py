"""Where a storage object moves tensor memory without an aten operation, in or out.

A storage the answer holds (`torch.UntypedStorage(n)`, a `TypedStorage`, or one taken from a
tensor with `.untyped_storage()`/`.storage()`, before or after its values were written) reads
and writes its memory in C, at any later time: `_write_file`, pickling, `torch.save`, `tolist`,
`storage[i]` read it out; `_set_from_file` and `storage[i] = b` write into it. Its methods live
on the C base `torch._C.StorageBase`, which cannot be changed, so while exits.py watches they are
replaced on `torch.UntypedStorage` (a TypedStorage reaches its memory through that class or
through tensor operations, which the dispatch modes see), as three kinds:

- exits, as exits.py's for tensors: `_write_file` (pickling and torch.save's old format write
  through it), `__getitem__` with an index, `tolist`, iteration, `repr`, `__reduce__`,
  `__reduce_ex__`, and torch.save's zip writer (`torch._C.PyTorchFileWriter.write_record`)
  handed a storage: every watcher gets a uint8 tensor over the whole storage;
- entries, values arriving from outside torch: `_set_from_file`, `__setitem__`; every `entered`
  callback gets that tensor after the write (provenance.py judges the values);
- refused while an answer runs: shared memory by handle (`_share_*`, `_new_shared*`,
  `_new_using_*`, `_get_shared_fd`: two storages over one memory at two addresses) and moving a
  storage's memory pointer (`_swap_data_ptr_`, `_resize_with_addr_`).

A right answer's uses pass unwatched: `nbytes()`, `size()`, `element_size()`,
`is_shared()`, `resize_` (FSDP's freeing), and `copy_`/`fill_`, which run aten operations;
`data_ptr()` too, as an exit that exposes the storage (addresses.py).
"""
import inspect
import sys
import types

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .guard import _EXITS, armed, refuse
from .reader_objects import is_a
from .run import EMPTIED, stand_in, stand_in_below

__all__ = ["EXITS", "ENTRIES", "REFUSED", "HOWS", "install", "patched", "unwatched", "whole"]

EXITS = ("_write_file", "__getitem__", "__iter__", "tolist", "__repr__", "__reduce__",
         "__reduce_ex__")
ENTRIES = ("_set_from_file", "__setitem__")
REFUSED = ("_share_fd_cpu_", "_share_filename_cpu_", "_share_cuda_", "_new_shared_fd_cpu",
           "_new_shared_filename_cpu", "_new_shared_cuda", "_new_using_fd_cpu",
           "_new_using_filename_cpu", "_get_shared_fd", "_swap_data_ptr_", "_resize_with_addr_")
_HOW = types.MappingProxyType({
    "_write_file": "storage._write_file()", "__getitem__": "storage[i]",
    "__iter__": "iterating over a storage", "tolist": "storage.tolist()",
    "__repr__": "printing a storage", "__reduce__": "pickling a storage",
    "__reduce_ex__": "pickling a storage", "write_record": "torch.save of a storage",
    "_set_from_file": "storage._set_from_file()", "__setitem__": "storage[i] = value"})
HOWS = frozenset(_HOW.values())      # the `how` of a storage's exit or entry
_STORAGE = torch.UntypedStorage
_WRITER = torch._C.PyTorchFileWriter
_WATCHERS, _ENTERED = _EXITS.watchers, _EXITS.entered
_REFUSED = ("your code called storage.{name}, which shares a storage's memory by a handle or "
            "moves its memory pointer, past every operation the check sees: work with tensors "
            "and their operations (in a world of ranks, data travels through the comm)")
_HERE = __file__


def whole(storage):
    """A uint8 tensor over all of `storage`, made out of every dispatch mode's sight, or None
    (a storage with no memory to read: a fake device's)."""
    storage = getattr(storage, "_untyped_storage", storage)
    if not is_a(storage, _STORAGE):
        return None
    try:
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _tell(callbacks, storage, how):
    over = whole(storage)
    if over is not None:
        for callback in list(callbacks):
            callback(over, how)


def _wrap(name, original):
    how = _HOW.get(name)

    @stand_in(original)
    def method(*args, **kwargs):
        if not _WATCHERS and armed():
            refuse(EMPTIED)       # installed while one watches: emptied by the answer
        if name in REFUSED:
            if armed():
                refuse(_REFUSED.format(name=name))
            return original(*args, **kwargs)
        if name == "write_record":
            subject = args[2] if len(args) > 2 else kwargs.get("data")
        else:
            subject = args[0] if args else None
        indexed = name not in ("__getitem__", "__setitem__") or (
            len(args) > 1 and not is_a(args[1], slice))      # a slice is a view, no values
        outer = indexed and _WATCHERS and not stand_in_below(sys._getframe(1), _HERE)
        if outer and name in EXITS + ("write_record",):
            _tell(_WATCHERS, subject, how)
        out = original(*args, **kwargs)
        if name in ENTRIES and _WATCHERS and not stand_in_below(sys._getframe(1), _HERE):
            _tell(_ENTERED, subject, how)
        return out
    return method


def install(saved):
    """Put the stand-ins in, noting the originals in `saved` ((owner, name) -> what the owner's
    own dict held, or None), as exits.py restores them."""
    for name in EXITS + ENTRIES + REFUSED:
        raw = inspect.getattr_static(_STORAGE, name)
        saved[_STORAGE, name] = _STORAGE.__dict__.get(name)
        if is_a(raw, staticmethod):
            setattr(_STORAGE, name, staticmethod(_wrap(name, raw.__func__)))
        elif is_a(raw, classmethod):
            setattr(_STORAGE, name, classmethod(_wrap(name, raw.__func__)))
        else:
            setattr(_STORAGE, name, _wrap(name, getattr(_STORAGE, name)))
    saved[_WRITER, "write_record"] = _WRITER.__dict__.get("write_record")
    _WRITER.write_record = _wrap("write_record", _WRITER.write_record)


def patched(owner, name):
    """Whether `owner.name` is a storage method replaced while exits.py watches."""
    return (owner is _STORAGE and name in EXITS + ENTRIES + REFUSED) or (
        owner is _WRITER and name == "write_record")


def unwatched(obj, objclass, name):
    """The name of the storage method `obj` is an original of (the C base's, which cannot be
    replaced, or one bound to a storage or saved before the watch), or None."""
    if name not in EXITS + ENTRIES + REFUSED + ("write_record",):
        return None
    if objclass is torch._C.StorageBase or objclass is _WRITER:
        return f"{objclass.__name__}.{name} (a storage's memory read or written in C)"
    if is_a(obj, types.BuiltinMethodType) and is_a(obj.__self__, (_STORAGE, _WRITER)):
        return f"storage.{name} (bound before the check ran)"
    key = (_STORAGE, name)
    original = _EXITS.saved[key] if key in _EXITS.saved else _STORAGE.__dict__.get(name)
    if original is not None and obj is original:
        return f"torch.UntypedStorage.{name} (bound before the check ran)"
    return None
