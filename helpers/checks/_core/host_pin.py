"""pin_memory on a machine without CUDA, while a Recorder watches: a copy on the host, which
is_pinned() calls pinned, as on a machine with a GPU. Here torch raises "Found no NVIDIA driver",
so a right answer that pins its host batches before copying them to the devices (gpus.ipynb) would
fail the CPU phase of a check that also runs on simulated GPUs on this grader only. The same for a
factory called with `pin_memory=True` (`torch.empty`, `zeros`, `empty_like`)."""
import torch

__all__ = ["HostPins"]

_PIN = torch.ops.aten._pin_memory.default
_IS_PINNED = torch.ops.aten.is_pinned.default
_CLONE = torch.ops.aten.clone.default


class HostPins:
    """The storages pinned by `call` (a Recorder keeps them alive, so no key is reused)."""

    def __init__(self):
        self.keys = set()

    def call(self, func, args, kwargs):
        """func(*args, **kwargs), with _pin_memory a copy and is_pinned of that copy True where
        this machine has no CUDA."""
        if func is _PIN and not torch.cuda.is_available():     # the runtime's (cuda_calls.py)
            out = _CLONE(args[0])
            self.keys.add(out.untyped_storage()._cdata)
            return out
        if kwargs.get("pin_memory") and not torch.cuda.is_available():
            # a factory asked for pinned memory (`torch.empty(n, pin_memory=True)`): made
            # without the keyword, and is_pinned() of it True
            out = func(*args, **{k: v for k, v in kwargs.items() if k != "pin_memory"})
            if isinstance(out, torch.Tensor):
                self.keys.add(out.untyped_storage()._cdata)
            return out
        if func is _IS_PINNED and self.keys and args[0].untyped_storage()._cdata in self.keys:
            return True
        return func(*args, **kwargs)
