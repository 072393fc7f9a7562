"""Numpy views of tensors taken before the ranks started are read-only while they run. A rank's
own `.numpy()` is read-only (rank_arrays.read_only), but a view the answer's module made at import
(`ROWS = T.numpy()`) would let one rank write a tensor's memory with no torch operation, and
another read it through torch: data between ranks that provenance cannot see. So while an answer
runs in a World rank, such views the answer's module or closure hold (its globals, its closure
cells, and what those hold one level down: attributes, dict and list entries) are swapped for
read-only views of the same memory; the originals come back when the last rank's call ends.
A view reached otherwise (another module, an object deeper down) is not swapped."""
import contextlib
import threading
import types

import numpy as np
import torch

from .keys import plain_keys
from .parts import function_closure, function_globals, module_name
from .rank_arrays import RankArray
from .run import CheckFailed

__all__ = ["early_views_read_only"]

_LOCK = threading.Lock()
_ODD = object()  # a dict whose keys the harness does not look up (keys.plain_keys)
_HELD = {}      # (id(space), key) -> [calls inside, space, key, the original array]
_BASE = np.ndarray.base.__get__
_INTERFACE = np.ndarray.__array_interface__.__get__   # past a RankArray's watched property


def _torch_backed(v):
    """A numpy array whose memory a tensor owns (its base chain reaches a tensor), other than a
    rank's own RankArray: rank_arrays guards those (another rank's reads refused, the memory
    read-only), and one may already sit in a global when a slower rank's answer starts."""
    if issubclass(type(v), RankArray):     # (by its class: no `__class__` of the reader's read)
        return False
    base = v
    for _ in range(32):            # read by ndarray's own descriptor: no subclass's code runs
        if not issubclass(type(base), np.ndarray):   # (another rank's RankArray refuses .base)
            return issubclass(type(base), torch.Tensor) and base is not v
        base = _BASE(base)
    return False


def _tensor_of(v):
    base = v
    while isinstance(base, np.ndarray):
        base = _BASE(base)
    return base


def _read_only(v):
    """v's memory as an array no write reaches without torch: its base is a read-only array of
    the tensor's own (a view of v itself would keep v, writeable, as its `.base`, and numpy
    lets a view's WRITEABLE flag be set again while its base is writeable)."""
    whole = _tensor_of(v).detach().numpy()
    whole.flags.writeable = False
    start = _INTERFACE(v)["data"][0] - _INTERFACE(whole)["data"][0]
    try:
        return np.ndarray(v.shape, v.dtype, buffer=whole, offset=start, strides=v.strides)
    except (TypeError, ValueError):  # a tensor whose memory is not one block: a read-only copy
        copy = np.ndarray.view(v, np.ndarray).copy()
        copy.flags.writeable = False
        return copy


# How deep in dicts, lists and namespaces an early view is looked for (a view of a view is one
# array: _read_only walks its bases to the tensor whatever the depth).
_DEPTH = 4


def _spaces(fn):
    """(mapping, key, array) for the tensor-backed arrays fn's module and closure hold."""
    found, seen = [], set()

    def scan(space, items, depth):
        for k, v in list(items):
            if _torch_backed(v):
                found.append((space, k, v))
            elif depth >= _DEPTH or id(v) in seen:
                continue
            elif type(v) is dict:       # by exact types, their own methods: no `items` or
                seen.add(id(v))         # key `__eq__` of the reader's runs (nor is one looked
                scan(v if plain_keys(v) else _ODD, dict.items(v), depth + 1)   # up: _ODD)
            elif type(v) is list:
                seen.add(id(v))
                scan(v, enumerate(v), depth + 1)
            elif type(v) is types.SimpleNamespace:
                seen.add(id(v))
                scan(vars(v), dict.items(vars(v)), depth + 1)

    g = function_globals(fn)
    if g is not None and not module_name(g).startswith(("helpers", "numpy")):
        # a copy (one C call: a rank's answer may set a global while another rank scans)
        scan(g, [(k, v) for k, v in dict.items(dict.copy(g)) if not k.startswith("__")], 0)
    for cell in function_closure(fn):
        try:
            v = cell.cell_contents
        except ValueError:           # a cell not filled yet
            continue
        scan(_Cell(cell), [("cell_contents", v)], 0)
    return found


class _Cell:
    def __init__(self, cell):
        self.cell = cell

    def __setitem__(self, key, v):
        self.cell.cell_contents = v


def _key(space, k):
    return (id(space.cell) if isinstance(space, _Cell) else id(space), k)


@contextlib.contextmanager
def early_views_read_only(fn, in_world, *, _HELD=_HELD):
    """While fn runs in a World rank (`in_world`), the views of tensors it can reach are
    read-only substitutes; the last call to end puts the originals back."""
    if not in_world:
        yield
        return
    keys, spaces = [], _spaces(fn)
    if any(space is _ODD for space, _, _ in spaces):
        raise CheckFailed(
            "your module holds a numpy view of a tensor's memory in a dict keyed by objects "
            "that are not names or numbers: the check makes such views read-only while the "
            "ranks run, and cannot reach that one. Key the dict by strs or ints, or hold no view")
    with _LOCK:
        for space, k, v in spaces:
            key = _key(space, k)
            if key not in _HELD:
                sub = _read_only(v)
                _HELD[key] = [0, space, k, v]
                space[k] = sub
            _HELD[key][0] += 1
            keys.append(key)
    try:
        yield
    finally:
        with _LOCK:
            for key in keys:
                entry = _HELD[key]
                entry[0] -= 1
                if entry[0] == 0:
                    if type(entry[1]) is not dict or plain_keys(entry[1]):
                        entry[1][entry[2]] = entry[3]   # (a key added: the answer fails)
                    del _HELD[key]


del _HELD
