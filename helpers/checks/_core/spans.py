"""The bytes of its storage a tensor covers, from metadata alone (storage offset, sizes,
strides), so fake tensors on simulated devices answer too: moved.py follows names per range;
and which storage a tensor is (`storage_key`), through torch.func's wrappers."""
import bisect
import math

from torch._C import _functorch

__all__ = ["span", "layout", "Runs", "WHOLE", "RUNS", "storage_key"]

WHOLE = (0, math.inf)       # every byte of a storage (what an out-of-place result holds)
RUNS = 4096                 # dense runs a view is followed by at most (past: its whole extent)


def storage_key(t):
    """The identity of a tensor's storage (views share it). A functorch wrapper (what
    torch.func.grad and vmap hand the function they transform: it has no storage) is the tensor
    it wraps, which the operations below the transform (a Recorder's) read and write."""
    try:
        return t.untyped_storage()._cdata
    except NotImplementedError:
        while _functorch.is_functorch_wrapped_tensor(t) or _functorch.is_batchedtensor(t):
            t = _functorch.get_unwrapped(t)
        return t.untyped_storage()._cdata


def span(t):
    """(first byte, end byte, dense) of the storage `t` covers: from its first element to its
    last, and whether it covers every byte in between once (so writing it replaces them)."""
    try:
        size, shape, strides = t.element_size(), t.shape, t.stride()
        first = t.storage_offset() * size
        if t.numel() == 0:
            return first, first, True
        extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        step = 1
        for s, n in sorted((s, n) for n, s in zip(shape, strides, strict=True) if n != 1):
            if s != step:
                return first, first + extent * size, False
            step *= n
        return first, first + extent * size, True
    except (RuntimeError, NotImplementedError, TypeError):
        return WHOLE + (False,)


def layout(t):
    """(storage offset, strides) in elements, or None for a tensor that has none."""
    try:
        return t.storage_offset(), tuple(t.stride())
    except (RuntimeError, NotImplementedError, TypeError):
        return None


class Runs:
    """The bytes a view covers, as sorted disjoint dense runs: its innermost dims that lie
    back to back make one run, repeated over the others (a column: one element per row); a view
    of more than RUNS runs, or of no layout, is taken as its whole extent."""

    __slots__ = ("starts", "ends", "before")

    def __init__(self, offset, shape, strides, itemsize, extent):
        found = None if strides is None else _runs(offset, shape, strides, itemsize)
        found = [extent[:2]] if found is None else found
        self.starts, self.ends, self.before = [a for a, _ in found], [b for _, b in found], [0]
        for a, b in found:
            self.before.append(self.before[-1] + (b - a))

    def within(self, lo, hi):
        """The bytes of the runs between byte lo and byte hi."""
        j, m = bisect.bisect_right(self.ends, lo), bisect.bisect_left(self.starts, hi)
        if j >= m:
            return 0
        if math.isinf(self.ends[m - 1]):        # a whole extent, maybe unbounded
            return min(hi, self.ends[m - 1]) - max(lo, self.starts[j])
        return (self.before[m] - self.before[j] - max(0, lo - self.starts[j])
                - max(0, self.ends[m - 1] - hi))


def _runs(offset, shape, strides, itemsize):
    """[(first byte, end)] of a view, merged and sorted, or None past RUNS runs."""
    if any(n == 0 for n in shape):
        return []
    dims = sorted((s, n) for n, s in zip(shape, strides, strict=True) if n != 1 and s != 0)
    block, i = 1, 0
    while i < len(dims) and dims[i][0] == block:
        block, i = block * dims[i][1], i + 1
    if math.prod(n for _, n in dims[i:]) > RUNS:
        return None
    starts = [offset]
    for s, n in dims[i:]:
        starts = [a + j * s for a in starts for j in range(n)]
    out = []
    for a in sorted(starts):
        lo, hi = a * itemsize, (a + block) * itemsize
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out
