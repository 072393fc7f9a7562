"""torch.cuda's device, stream and event calls on simulated GPUs (time_it's AsyncGPUs and the
placement checks' FakeGPUs): they change no value, so each stands in while the answer runs
(`simulated_cuda`), and never reaches this machine's real CUDA runtime, which may lack the
devices simulated (or any GPU). One list, `NAMES`, for both simulations."""
import contextlib
import threading
import time
import types

import torch

__all__ = ["NAMES", "ACCELERATOR", "stand_ins", "simulated_cuda", "not_stood_in"]

NAMES = ("synchronize", "device", "set_device", "current_device", "current_stream",
         "default_stream", "Event", "Stream", "stream", "device_count", "get_device_name",
         "get_device_properties")
ACCELERATOR = {"synchronize": "synchronize", "device_index": "device", "device_count":
               "device_count", "set_device_index": "set_device", "current_device_index":
               "current_device", "current_stream": "current_stream"}


def stand_ins(sync, mark, reached, hold, count=None):
    """NAMES on the simulation: plain functions, closures and classes (no bound method, no
    attribute leads to the records); the current device (a thread's own, as CUDA's) is what
    synchronize() waits for and what an event is recorded on; `count` GPUs (None: any)."""
    local = threading.local()

    def cur():
        return getattr(local, "i", 0)

    def index(device):
        if device is None:
            return cur()
        if isinstance(device, int):
            return device
        d = getattr(device, "device", device) if not isinstance(device, str) else device
        d = torch.device(d)
        if d.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {d}")
        return cur() if d.index is None else d.index

    def synchronize(device=None):
        sync(index(device))

    def set_device(device):
        local.i = index(device)

    def current_device():
        return cur()

    class device:       # torch.cuda.device's name; a class, as torch tests isinstance with it
        """torch.cuda.device: the current device while the block runs."""

        def __init__(self, device):
            self.idx = -1 if device is None else index(device)

        def __enter__(self):
            self.prev = cur()
            if self.idx >= 0:
                local.i = self.idx

        def __exit__(self, *exc):
            local.i = self.prev
            return False

    class Stream:
        """A stream of a simulated GPU: its waits are its device's."""

        def __init__(self, device=None, priority=0, **kwargs):
            self.device, self.priority = torch.device("cuda", index(device)), priority

        def synchronize(self):
            synchronize(self.device.index)

        def record_event(self, event=None):
            event = Event() if event is None else event
            event.record(self)
            return event

        def wait_event(self, event):
            event.wait(self)

        def wait_stream(self, other):
            self.wait_event(other.record_event())

        def query(self):
            return mark(self.device.index)[0] <= time.perf_counter()

        def __enter__(self):
            self._ctx = stream(self)
            return self._ctx.__enter__()

        def __exit__(self, *exc):
            return self._ctx.__exit__(*exc)

    def current_stream(device=None):
        return Stream(device)

    @contextlib.contextmanager
    def stream(s):
        with device(None if s is None else s.device):
            yield s

    def on(stream):
        if stream is None:
            return cur()
        d = getattr(stream, "device", None)
        if not isinstance(d, torch.device) or d.type != "cuda":
            raise TypeError("expected stream to be a torch.Stream or torch.cuda.Stream object")
        return index(d)

    class Event:
        """torch.cuda.Event (and torch.Event) on the simulated GPUs: stamped when its GPU
        reaches it."""
        __slots__ = ("_timing", "_at")

        def __init__(self, enable_timing=False, blocking=False, interprocess=False,
                     external=False, device=None):
            self._timing, self._at = bool(enable_timing), None

        def record(self, stream=None):
            i = on(stream)
            if self._at is not None and self._at[0] != i:
                raise RuntimeError(f"Event device {self._at[0]} does not match recording "
                                   f"stream's device {i}.")
            self._at = (i, *mark(i))

        def wait(self, stream=None):
            if self._at is not None:
                hold(on(stream), self._at[1])

        def query(self):
            return self._at is None or self._at[1] <= time.perf_counter()

        def synchronize(self):
            if self._at is not None:
                reached(*self._at)

        def elapsed_time(self, end_event):
            if self._at is None or end_event._at is None:
                raise RuntimeError("Both events must be recorded before calculating elapsed "
                                   "time.")
            if not (self._timing and end_event._timing):
                raise RuntimeError("Both events must be created with argument "
                                   "'enable_timing=True'.")
            if self._at[0] != end_event._at[0]:
                raise RuntimeError("Both events must be recorded on the same device.")
            if not (self.query() and end_event.query()):
                raise RuntimeError("CUDA error: device not ready (an event not reached yet: "
                                   "wait with end.synchronize() before elapsed_time)")
            return (end_event._at[1] - self._at[1]) * 1e3

    def device_count():
        return count if count is not None else max(cur() + 1, 1)

    def get_device_properties(device=None):
        i = index(device)
        if count is not None and not 0 <= i < count:
            raise AssertionError("Invalid device id")
        return types.SimpleNamespace(name=f"simulated GPU {i}", total_memory=80 * 2 ** 30,
                                     major=9, minor=0, multi_processor_count=132)

    def get_device_name(device=None):
        return get_device_properties(device).name

    return {"synchronize": synchronize, "device": device, "set_device": set_device,
            "current_device": current_device, "current_stream": current_stream,
            "default_stream": current_stream, "Event": Event, "Stream": Stream,
            "stream": stream, "device_count": device_count,
            "get_device_name": get_device_name, "get_device_properties": get_device_properties}


def _record_stream(self, stream):
    """Tensor.record_stream on a simulated GPU: its memory is never reused, nothing to note."""
    return None


def installed(found):
    """(owner, name, stand-in) for torch.cuda's NAMES, torch.accelerator's equivalents,
    torch.Event and Tensor.record_stream, from `found` (stand_ins' dict)."""
    out = [(torch.cuda, name, found[name]) for name in NAMES]
    accelerator = getattr(torch, "accelerator", None)
    out += [(accelerator, name, found[ours]) for name, ours in ACCELERATOR.items()
            if accelerator is not None and hasattr(accelerator, name)]
    out += [(torch, "Event", found["Event"])] if hasattr(torch, "Event") else []
    return out + [(torch.Tensor, "record_stream", _record_stream)]


@contextlib.contextmanager
def patched(pairs):
    """Set each (owner, name, value) while the block runs; put the originals back after."""
    saved = [(owner, name, owner.__dict__.get(name, _ABSENT)) for owner, name, _ in pairs]
    for owner, name, value in pairs:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            if value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


_ABSENT = object()


_REAL_COUNT = []        # torch.cuda.device_count as it was before the stand-ins (innermost last)


@contextlib.contextmanager
def simulated_cuda(k):
    """The stand-ins for FakeGPUs(k): no waits (the simulation runs nothing), k devices."""
    found = stand_ins(lambda i: None, lambda i: (time.perf_counter(), 0),
                      lambda i, point, count: None, lambda i, point: None, count=k)
    _REAL_COUNT.append(torch.cuda.device_count)
    try:
        with patched(installed(found)):
            yield
    finally:
        _REAL_COUNT.pop()


def not_stood_in(k, e):
    """The words for an error of the real CUDA runtime reached from the simulation: the call
    that reached it (the innermost torch.cuda frame of the traceback), else autograd's."""
    tb, name = e.__traceback__, None
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.startswith(("torch.cuda", "torch.accelerator")):
            name = name or f"{module}.{tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    played = ", ".join(f"torch.cuda.{n}" for n in NAMES)
    if name is not None:
        return (f"your code called {name}, which the {k} simulated GPUs do not stand in for, "
                f"and it reached this machine's real CUDA runtime ({first}). Not a verdict on "
                f"your answer: the simulation stands in for {played}, Tensor.record_stream and "
                "pin_memory; leave the other calls out of the function the check calls")
    try:
        count = _REAL_COUNT[-1] if _REAL_COUNT else torch.cuda.device_count
        real = count() if torch.cuda.is_available() else 0
    except RuntimeError:
        real = 0
    if real == 0:       # no GPU here: autograd never asks the runtime; a call of torch.cuda did
        return (f"the {k} simulated GPUs reached torch's CUDA runtime on this machine, which "
                f"has no GPU: {first}. Not a verdict on your answer: the grader's limit (the "
                f"simulation stands in for {played}, Tensor.record_stream and pin_memory)")
    return (f"the {k} simulated GPUs reached this machine's real CUDA runtime ({real} GPU(s)): "
            f"{first}. Where CUDA is available, torch's autograd asks the real runtime about "
            "every device a tensor that needs gradients is on, and this machine lacks "
            f"cuda:{real}..{k - 1}. Not a problem with your answer: run this check on a "
            f"machine with no GPU, or with {k} GPUs")
