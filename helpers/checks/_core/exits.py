"""Where tensor values leave torch without an aten operation: into Python lists, numpy arrays,
bytes or text.

`.item()`, `float(t)`, `int(t)`, `bool(t)` and iterating to 0-d tensors run aten operations
(`_local_scalar_dense`, `unbind`), which a dispatch mode (the Recorder, provenance) sees. These do
not, so they are watched here, as one family:

- `Tensor.tolist`, `Tensor.numpy`, `Tensor.__array__` (`np.asarray(t)`, `np.array(t)`),
  `Tensor.__dlpack__` (`np.from_dlpack`), `Tensor.__reduce_ex__` (pickle, `torch.save`), and
  `Tensor.__repr__` (print, str, f-strings: the printed digits are values too);
- `Tensor.apply_`, `map_` and `map2_`: kernels that hand every element to a Python callback (for
  `map_` and `map2_`, the elements of the other tensors too: each is an exit of its own, so
  provenance sees another rank's tensor read there);
- `torch.utils.dlpack.to_dlpack` (`torch.to_dlpack`), the module function behind `__dlpack__`;
- `Tensor.untyped_storage`, `storage` and `_typed_storage` when the reader's code calls them (the
  storage object reads its bytes or values without a tensor operation; torch itself calls these
  all the time, which is not an exit);
- a storage's own methods that read its memory out or write into it in C (`_write_file`,
  pickling, `torch.save`, `storage[i]`, `_set_from_file` ...), whenever they run:
  storage_exits.py, installed and restored with these;
- a tensor's or storage's address, `data_ptr()`, when the reader's code takes it: the storage is
  exposed from then on, and the functions that make memory from an address are refused while an
  answer runs: addresses.py, installed and restored with these.

`watch_exits(callback, entered)`: while active, every such call, in any thread, calls
`callback(t, how)` first (once per outermost call: a repr that calls tolist inside is one exit),
and a write into a storage from outside torch calls `entered(t, how)` after it. The originals
stay reachable where they cannot be replaced: the C base class `torch._C.TensorBase` (its `tolist`,
`numpy`, `apply_` ...); references.scan refuses an answer whose code names them (or
`torch._C._to_dlpack`) or holds an original bound before the watch (`unwatched`), and one that
reaches ctypes (a tensor's memory at its `data_ptr()`). Reached by a name built at run time, the
base's methods are exits all the same: `BaseExitsCarriedMode`, a function mode active in every
thread the checks observe (`watched_here`), is handed each call. What it does not see: ctypes
reached by a name built at run time, C extensions, the base's methods called under
`torch._C.DisableTorchFunction()` reached so (book/teachers.md).
"""
import contextlib
import sys
import types

import torch
import torch.utils.dlpack

from . import addresses, storage_exits
from .carried import CarriedFunctionMode, carried_function_modes
from .guard import _EXITS, armed, refuse
from .reader_objects import is_a
from .run import EMPTIED, is_reader_code, stand_in, stand_in_below

__all__ = ["watch_exits", "watched_here", "EXITS", "CALLBACKS", "patched", "unwatched",
           "UNWATCHED_NAMES", "SCRIPTED", "SCRIPT_NAMES", "RAW_MEMORY", "RAW_NAMES"]

CALLBACKS = ("apply_", "map_", "map2_")      # Python callbacks handed every element
EXITS = ("tolist", "numpy", "__array__", "__dlpack__", "__reduce_ex__", "__repr__", *CALLBACKS)
_READER_ONLY = ("untyped_storage", "storage", "_typed_storage")
# modules bound now; torch._C's dlpack makers are looked up by name (Tensor.__dlpack__ too)
_FUNCTIONS = ((torch.utils.dlpack, "to_dlpack"), (torch, "to_dlpack"), *(
    (torch._C, name) for name in ("_to_dlpack", "_to_dlpack_versioned") if hasattr(torch._C, name)))
_HOW = {"tolist": ".tolist()", "numpy": ".numpy()", "__array__": "np.asarray()",
        "__dlpack__": "dlpack", "__reduce_ex__": "pickling", "__repr__": "printing (repr)",
        "apply_": ".apply_()", "map_": ".map_()", "map2_": ".map2_()", "to_dlpack": "dlpack",
        "_to_dlpack": "dlpack", "_to_dlpack_versioned": "dlpack",
        "untyped_storage": ".untyped_storage()", "storage": ".storage()",
        "_typed_storage": "._typed_storage()"}
_HOW = types.MappingProxyType(_HOW)
_SCRIPTING = frozenset({"script", "trace", "trace_module", "load", "freeze", "fork",
                        "script_if_tracing", "optimize_for_inference", "script_method"})
# what an answer may not name: the unpatchable class and functions that hold the originals
# TorchScript runs code in its own C++ interpreter (prim::tolist, aten::Float), where values leave
# torch without calling any method replaced here: code that scripts, traces or loads is refused
SCRIPTED = "TorchScript (torch.jit: its interpreter reads values out in C++, where no watch sees)"
SCRIPT_NAMES = frozenset({"jit", "ScriptFunction", "ScriptModule", "CompilationUnit",
                          "_jit_script_compile", "_jit_script_class_compile", "import_ir_module"})
RAW_MEMORY = ("ctypes (a tensor's memory read or written in C, at its data_ptr(), where no "
              "watch sees)")
RAW_NAMES = frozenset({"ctypes", "memmove", "memset", "string_at", "from_address"})
UNWATCHED_NAMES = frozenset({"TensorBase", "_TensorBase", "_to_dlpack", "_to_dlpack_versioned",
                             "_dlpack_exchange_api", "_const_dlpack_exchange_api", "StorageBase",
                             *SCRIPT_NAMES, *RAW_NAMES, *addresses.NAMES})
_SCRIPT_TYPES = (torch.jit.ScriptFunction, torch.jit.ScriptModule, torch._C.CompilationUnit)



# One state for every import of the course (fresh.py imports another copy): the active callbacks
# and the class attributes replaced, made by guard.py's audit hook and handed by it to each
# import (never looked up in sys.modules, where a cell could put its own). Whether an exit is
# running in a thread is read from its stack (`stand_in_below`), never from a flag an answer
# could set.
_LOCK, _WATCHERS, _ENTERED, _SAVED = _EXITS.lock, _EXITS.watchers, _EXITS.entered, _EXITS.saved
_HERE = __file__


def _wrap(name, original, reader_only):
    @stand_in(original)
    def method(t, *args, **kwargs):
        if not _WATCHERS and armed():
            refuse(EMPTIED)       # installed while one watches: emptied by the answer
        if _WATCHERS:
            caller = sys._getframe(1)
            if (not reader_only or is_reader_code(caller.f_code.co_filename)) and not \
                    stand_in_below(caller, _HERE):
                read = [t] + ([a for a in args if isinstance(a, torch.Tensor)]
                              if name in CALLBACKS else [])
                for callback in list(_WATCHERS):
                    for x in read:
                        callback(x, _HOW[name])
        return original(t, *args, **kwargs)
    return method


# the C base class's methods, which torch hands to the function modes when one is active (as the
# method torch.Tensor holds: the stand-in while watched, else the base's own)
_BASE = types.MappingProxyType({id(vars(torch._C.TensorBase)[name]): name for name in (
    *EXITS, *_READER_ONLY, *addresses.TENSOR_HOWS) if name in vars(torch._C.TensorBase)})
# the stand-ins whose own test of their caller would see this mode's frame: counted here
_ROUTED = frozenset(name for name in (*_READER_ONLY, *addresses.TENSOR_HOWS)
                    if name in vars(torch._C.TensorBase))
_STAND_INS = frozenset({_HERE, addresses.__file__})
_FUNCTION = types.FunctionType


class BaseExitsCarriedMode(CarriedFunctionMode):
    """The exits of the C base class reached by a name built while the answer runs
    (`getattr(torch._C, "Tensor" + "Base").tolist(t)`, `super(torch.Tensor, t).numpy()`):
    while a function mode is active torch hands each call of a tensor's method to it, so the
    stand-in torch.Tensor holds runs (or, for the reader-only names, the exit is counted here,
    once, as the stand-ins count). Carried into the threads the answer starts (carried.py)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = _BASE.get(id(func))
        if name is None and type(func) is _FUNCTION and func.__name__ in _ROUTED and \
                func.__code__.co_filename in _STAND_INS:
            name = func.__name__
        if name is not None and args and _SAVED:
            _base_exit(name, args, sys._getframe(1))
        return func(*args, **(kwargs or {}))


def _base_exit(name, args, caller):
    """`name` called on `args[0]` by the code of frame `caller`, past the stand-ins."""
    if not _WATCHERS:
        if armed():
            refuse(EMPTIED)       # installed while one watches: emptied by the answer
        return
    if name in addresses.TENSOR_HOWS:
        if is_reader_code(caller.f_code.co_filename):
            addresses.expose(args[0], addresses.TENSOR_HOWS[name])
        return
    if (name in _READER_ONLY and not is_reader_code(caller.f_code.co_filename)) or \
            stand_in_below(caller, _HERE):
        return
    read = [x for x in args if isinstance(x, torch.Tensor)] if name in CALLBACKS else args[:1]
    for callback in list(_WATCHERS):
        for x in read:
            callback(x, _HOW[name])


@contextlib.contextmanager
def watched_here():
    """The C base class's exits watched in this thread too, while exits are watched (a World's
    rank threads; the thread that watches): a function mode, unless one is active here."""
    if not _WATCHERS or carried_function_modes():
        yield
        return
    with BaseExitsCarriedMode():
        yield


def _install():
    for name in EXITS + _READER_ONLY:
        _SAVED[name] = torch.Tensor.__dict__.get(name)
        setattr(torch.Tensor, name, _wrap(name, getattr(torch.Tensor, name),
                                          name in _READER_ONLY))
    for module, name in _FUNCTIONS:
        _SAVED[module, name] = vars(module)[name]
        setattr(module, name, _wrap(name, vars(module)[name], False))
    storage_exits.install(_SAVED)
    addresses.install(_SAVED)


def _restore():
    for name, original in _SAVED.items():
        owner = torch.Tensor
        if isinstance(name, tuple):
            owner, name = name
        if original is None:
            if name in owner.__dict__:      # (an answer may have deleted the stand-in)
                delattr(owner, name)
        else:
            setattr(owner, name, original)
    _SAVED.clear()


def patched(owner, name):
    """Whether `owner.name` (a class or module) is an exit watch_exits replaces while active: a
    lookup of it while the answer runs finds the watched one."""
    if owner is torch.Tensor:
        return name in EXITS or name in _READER_ONLY
    if storage_exits.patched(owner, name) or addresses.patched(owner, name):
        return True
    return any(owner is m and name == n for m, n in _FUNCTIONS)


def unwatched(obj):
    """The name of the exit `obj` is an original of (bound before any watch, or the C base
    class's method, which cannot be replaced), or None."""
    if is_a(obj, _SCRIPT_TYPES) or (is_a(obj, types.ModuleType) and (
            obj.__name__ + ".").startswith("torch.jit.")):
        return SCRIPTED
    try:
        objclass = getattr(obj, "__objclass__", None)
        name = getattr(obj, "__name__", None)
        owner = obj.__name__ if is_a(obj, types.ModuleType) else getattr(
            obj, "__module__", "")
    except Exception:       # an object of the reader's whose attributes compute
        return None
    if type(owner) is str and owner.split(".")[0] == "ctypes":
        return RAW_MEMORY
    if not isinstance(name, str):
        return None
    if type(owner) is str and owner.startswith("torch.jit") and name in _SCRIPTING:
        return SCRIPTED
    stored = storage_exits.unwatched(obj, objclass, name) or addresses.unwatched(
        obj, objclass, name)
    if stored:
        return stored
    if objclass is torch._C.TensorBase and name in EXITS + _READER_ONLY:
        return f"torch._C.TensorBase.{name}"
    if name in EXITS + _READER_ONLY and obj is _SAVED.get(name, torch.Tensor.__dict__.get(name)):
        return f"torch.Tensor.{name} (bound before the check ran)"
    if any(obj is _SAVED.get((torch._C, n), getattr(torch._C, n, None))
           for n in ("_to_dlpack", "_to_dlpack_versioned")):
        return "to_dlpack (bound before the check ran)"
    return None


@contextlib.contextmanager
def watch_exits(callback, entered=None):
    """While active, `callback(t, how)` before every exit of tensor `t`'s values, and
    `entered(t, how)` after every write into a storage from outside torch (see above)."""
    with _LOCK:
        if not _WATCHERS:
            _install()
        _WATCHERS.append(callback)
        if entered is not None:
            _ENTERED.append(entered)
    try:
        with watched_here():
            yield
    finally:
        with _LOCK:
            _WATCHERS.remove(callback)
            if entered is not None:
                _ENTERED.remove(entered)
            if not _WATCHERS:
                _restore()
