"""The bytes of its storage a tensor covers, from metadata alone (storage offset, sizes,
strides), so fake tensors on simulated devices answer too: moved.py follows names per range."""
import math

__all__ = ["span", "WHOLE"]

WHOLE = (0, math.inf)       # every byte of a storage (what an out-of-place result holds)


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
