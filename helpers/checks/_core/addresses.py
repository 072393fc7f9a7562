"""Addresses of tensor memory, and memory made from an address (installed by exits.py).

`data_ptr()` hands the answer an integer, and plainly named routes make memory of an integer
with no tensor operation or exit between: numpy's raw-pointer protocols (an object with
`__array_interface__`, `__array_struct__` or `__cuda_array_interface__` handed to `np.asarray`),
`torch._C._construct_storage_from_data_pointer`, `torch._from_blob`, ctypes, `numpy.ctypeslib`,
`/proc/self/mem`. Whatever reads there, and whenever, the address is where the values left, so
while exits.py watches:

- `Tensor.data_ptr`, `Tensor.const_data_ptr` and a storage's `data_ptr` (untyped or typed),
  called by the reader's code, are exits of the whole storage (every watcher gets a uint8
  tensor over it, as for a storage's own exits: its bytes, read as any dtype); the storage is
  then exposed: provenance.py counts every later write into it as read out by the rank that
  took the address (outside.py);
- the functions that make memory from an integer (`MAKERS`) are stand-ins that refuse while an
  answer runs; references.py's scan refuses their originals held by the answer (`unwatched`) and
  reader code naming them or numpy's protocols (`NAMES`).

A right answer that compares addresses (`shard.data_ptr() == flat.data_ptr()`, FSDP's views)
passes: its own values, read out by itself, are no other rank's.
"""
import sys
import types

import torch

from .guard import _EXITS, armed, refuse
from .reader_objects import is_a
from .run import EMPTIED, is_reader_code, stand_in
from .storage_exits import whole

__all__ = ["HOWS", "NAMES", "TENSOR_HOWS", "expose", "install", "patched", "unwatched"]

_STORAGE = torch.UntypedStorage
_TENSOR_ADDRESSES = ("data_ptr", "const_data_ptr")
_STORAGE_ADDRESSES = ((_STORAGE, "data_ptr"), (torch.TypedStorage, "data_ptr"),
                      (torch.TypedStorage, "_data_ptr"))
_HOW = types.MappingProxyType({"data_ptr": "data_ptr() (its memory's address)",
                               "const_data_ptr": "const_data_ptr() (its memory's address)",
                               "storage": "storage.data_ptr() (its memory's address)"})
HOWS = frozenset(_HOW.values())      # an address exit: the storage exposed from then on
TENSOR_HOWS = types.MappingProxyType({name: _HOW[name] for name in _TENSOR_ADDRESSES})
MAKERS = ((torch._C, "_construct_storage_from_data_pointer"), (torch, "_from_blob"),
          (torch._C, "_data_address"))
NAMES = frozenset({"_construct_storage_from_data_pointer", "_from_blob", "from_blob",
                   "_data_address", "ctypeslib", "__array_interface__", "__array_struct__",
                   "__cuda_array_interface__"})
_WATCHERS = _EXITS.watchers
_MADE = ("your code called {name}, which makes memory from an integer address (a tensor's "
         "data_ptr()), past every operation and exit the check sees: work with tensors and their "
         "operations (in a world of ranks, data travels through the comm)")


def _address(name, original, how):
    @stand_in(original)
    def method(subject, *args, **kwargs):
        if not _WATCHERS and armed():
            refuse(EMPTIED)       # installed while one watches: emptied by the answer
        if _WATCHERS and is_reader_code(sys._getframe(1).f_code.co_filename):
            expose(subject, how)
        return original(subject, *args, **kwargs)
    return method


def expose(subject, how):
    """The reader's code took the address of `subject` (a tensor or a storage): an exit of all
    its storage's bytes, for every watcher."""
    try:
        over = whole(subject.untyped_storage() if isinstance(subject, torch.Tensor)
                     else subject)
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        over = None        # no storage of its own (sparse, a wrapper subclass)
    if over is not None:
        for callback in list(_WATCHERS):
            callback(over, how)


def _maker(name, original):
    @stand_in(original)
    def method(*args, **kwargs):
        if armed():
            refuse(_MADE.format(name=name))
        return original(*args, **kwargs)
    return method


def install(saved):
    """Put the stand-ins in, noting the originals in `saved` ((owner, name) -> what the owner's
    own dict held, or None), as exits.py restores them."""
    for name in _TENSOR_ADDRESSES:
        saved[torch.Tensor, name] = torch.Tensor.__dict__.get(name)
        setattr(torch.Tensor, name, _address(name, getattr(torch.Tensor, name), _HOW[name]))
    for owner, name in _STORAGE_ADDRESSES:
        saved[owner, name] = owner.__dict__.get(name)
        setattr(owner, name, _address(name, getattr(owner, name), _HOW["storage"]))
    for module, name in MAKERS:
        saved[module, name] = vars(module)[name]
        setattr(module, name, _maker(f"{module.__name__}.{name}", vars(module)[name]))


def patched(owner, name):
    """Whether `owner.name` is replaced here while exits.py watches."""
    return (owner is torch.Tensor and name in _TENSOR_ADDRESSES) or any(
        owner is m and name == n for m, n in _STORAGE_ADDRESSES + MAKERS)


def unwatched(obj, objclass, name):
    """The name of the address exit or maker of memory from an address `obj` is an original of
    (the C base's method, one bound before the watch), or None."""
    if name in _TENSOR_ADDRESSES + ("_data_ptr",) and (
            objclass is torch._C.TensorBase or objclass is torch._C.StorageBase or (
                is_a(obj, types.BuiltinMethodType) and is_a(obj.__self__, (torch.Tensor,
                                                                           _STORAGE)))):
        return f"{name} (a tensor's address, bound before the check ran or from its C base)"
    for owner, kept in _STORAGE_ADDRESSES[1:]:
        key = (owner, kept)
        if obj is (_EXITS.saved[key] if key in _EXITS.saved else owner.__dict__.get(kept)):
            return f"TypedStorage.{kept} (a storage's address, bound before the check ran)"
    for module, name in MAKERS:
        key = (module, name)
        if obj is (_EXITS.saved[key] if key in _EXITS.saved else vars(module).get(name)):
            return f"{module.__name__}.{name} (memory made from an integer address)"
    return None
