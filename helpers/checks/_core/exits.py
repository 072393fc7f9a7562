"""Where tensor values leave torch without an aten operation: into Python lists, numpy arrays,
bytes or text.

`.item()`, `float(t)`, `int(t)`, `bool(t)` and iterating to 0-d tensors run aten operations
(`_local_scalar_dense`, `unbind`), which a dispatch mode (the Recorder, provenance) sees. These do
not, so they are watched here, as one family:

- `Tensor.tolist`, `Tensor.numpy`, `Tensor.__array__` (`np.asarray(t)`, `np.array(t)`),
  `Tensor.__dlpack__` (`np.from_dlpack`), `Tensor.__reduce_ex__` (pickle, `torch.save`), and
  `Tensor.__repr__` (print, str, f-strings: the printed digits are values too);
- `Tensor.untyped_storage`, `storage` and `_typed_storage` when the reader's code calls them (the
  storage object reads its bytes or values without a tensor operation; torch itself calls these
  all the time, which is not an exit).

`watch_exits(callback)`: while active, every such call, in any thread, calls `callback(t, how)`
first (once per outermost call: a repr that calls tolist inside is one exit). What it does not
see: `data_ptr()` read with ctypes, C extensions (book/teachers.md).
"""
import contextlib
import functools
import sys
import threading
import types

import torch

from .run import is_reader_code

__all__ = ["watch_exits", "EXITS"]

EXITS = ("tolist", "numpy", "__array__", "__dlpack__", "__reduce_ex__", "__repr__")
_READER_ONLY = ("untyped_storage", "storage", "_typed_storage")
_HOW = {"tolist": ".tolist()", "numpy": ".numpy()", "__array__": "np.asarray()",
        "__dlpack__": "dlpack", "__reduce_ex__": "pickling", "__repr__": "printing (repr)",
        "untyped_storage": ".untyped_storage()", "storage": ".storage()",
        "_typed_storage": "._typed_storage()"}



def _shared():
    """One state for every import of the course (fresh.py imports another copy): the active
    callbacks, the class attributes replaced, and per thread whether an exit is running."""
    state = sys.modules.get("_course_exit_watch")
    if not isinstance(state, types.ModuleType) or not hasattr(state, "watchers"):
        state = types.ModuleType("_course_exit_watch")
        state.lock, state.watchers, state.saved = threading.RLock(), [], {}
        state.local = threading.local()
        sys.modules["_course_exit_watch"] = state
    return state


_STATE = _shared()
_LOCK, _WATCHERS, _SAVED, _LOCAL = _STATE.lock, _STATE.watchers, _STATE.saved, _STATE.local


def _wrap(name, original, reader_only):
    @functools.wraps(original)
    def method(t, *args, **kwargs):
        if _WATCHERS and not getattr(_LOCAL, "inside", False) and (
                not reader_only or is_reader_code(sys._getframe(1).f_code.co_filename)):
            _LOCAL.inside = True
            try:
                for callback in list(_WATCHERS):
                    callback(t, _HOW[name])
                return original(t, *args, **kwargs)
            finally:
                _LOCAL.inside = False
        return original(t, *args, **kwargs)
    return method


def _install():
    for name in EXITS + _READER_ONLY:
        _SAVED[name] = torch.Tensor.__dict__.get(name)
        setattr(torch.Tensor, name, _wrap(name, getattr(torch.Tensor, name),
                                          name in _READER_ONLY))


def _restore():
    for name, original in _SAVED.items():
        if original is None:
            delattr(torch.Tensor, name)
        else:
            setattr(torch.Tensor, name, original)
    _SAVED.clear()


@contextlib.contextmanager
def watch_exits(callback):
    """While active, `callback(t, how)` before every exit of tensor `t`'s values (see above)."""
    with _LOCK:
        if not _WATCHERS:
            _install()
        _WATCHERS.append(callback)
    try:
        yield
    finally:
        with _LOCK:
            _WATCHERS.remove(callback)
            if not _WATCHERS:
                _restore()
