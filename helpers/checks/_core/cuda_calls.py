"""torch.cuda's device, stream and event calls on simulated GPUs (time_it's AsyncGPUs and the
placement checks' FakeGPUs): each stands in while the answer runs (`simulated_cuda`), and never
reaches this machine's real CUDA runtime, which may lack the devices simulated (or any GPU). One
list, `NAMES`, for both simulations. They change no value, but they order the work: each thread
has its current device and a current stream per device, a new Stream is a queue of its own, and
what a wait waits for is what the streams' clocks say (cuda_streams.py)."""
import contextlib
import sys
import time
import types

import torch

__all__ = ["NAMES", "ACCELERATOR", "stand_ins", "simulated_cuda", "not_stood_in"]

NAMES = ("synchronize", "device", "set_device", "current_device", "current_stream",
         "default_stream", "Event", "Stream", "stream", "set_stream", "device_count",
         "is_available", "get_device_name", "get_device_properties")
ACCELERATOR = {"synchronize": "synchronize", "device_index": "device", "device_count":
               "device_count", "set_device_index": "set_device", "current_device_index":
               "current_device", "current_stream": "current_stream", "set_stream": "set_stream",
               "is_available": "is_available"}
_OWN = ("torch", "helpers.checks")      # code asking is_available of the real runtime


def stand_ins(gpus, count=None):
    """NAMES on the simulation `gpus` (a cuda_streams.Waits: its waits, and its `streams`, which
    hold each thread's current device and streams): plain functions, closures and classes (no
    bound method, no attribute leads to the records). A new Stream is a stream of its own (fn's
    work is never on it); an event is recorded on a stream (the current one unless named);
    `count` GPUs (None: any)."""
    streams = gpus.streams
    cur = streams.device
    real_available = torch.cuda.is_available
    stamps = []             # what each recorded event stamped (an Event holds its index)

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

    def key(s):
        """The stream (device index, id) a Stream object names (None: the current one)."""
        if s is None:
            return streams.current(cur())
        d = getattr(s, "device", None)
        if not isinstance(d, torch.device) or d.type != "cuda":
            raise TypeError("expected stream to be a torch.Stream or torch.cuda.Stream object")
        return index(d), getattr(s, "stream_id", 0)

    def synchronize(device=None):
        gpus.synchronize(index(device))

    def set_device(device):
        streams.set_device(index(device))

    def current_device():
        return cur()

    class device:       # torch.cuda.device's name; a class, as torch tests isinstance with it
        """torch.cuda.device: the current device while the block runs."""

        def __init__(self, device):
            self.idx = -1 if device is None else index(device)

        def __enter__(self):
            self.prev = cur()
            if self.idx >= 0:
                streams.set_device(self.idx)

        def __exit__(self, *exc):
            streams.set_device(self.prev)
            return False

    class Stream:
        """torch.cuda.Stream on a simulated GPU: a new stream of the device, independent of the
        others until told to wait (current_stream and default_stream hand out the device's)."""

        def __init__(self, device=None, priority=0, **kwargs):
            i = kwargs.get("device_index", None) if device is None else None
            i = index(device) if i is None else i
            self.device, self.priority = torch.device("cuda", i), priority
            sid = kwargs.get("stream_id")
            self.stream_id = streams.new(i)[1] if sid is None else sid

        def __eq__(self, other):
            return isinstance(other, Stream) and key(self) == key(other)

        def __hash__(self):
            return hash(key(self))

        def synchronize(self):
            gpus.stream_sync(key(self))

        def record_event(self, event=None):
            event = Event() if event is None else event
            event.record(self)
            return event

        def wait_event(self, event):
            event.wait(self)

        def wait_stream(self, other):
            self.wait_event(other.record_event())

        def query(self):
            return gpus.stream_done(key(self))

        def __enter__(self):
            self._ctx = stream(self)
            return self._ctx.__enter__()

        def __exit__(self, *exc):
            return self._ctx.__exit__(*exc)

    def of(k):
        return Stream(k[0], stream_id=k[1])

    def current_stream(device=None):
        return of(streams.current(index(device)))

    def default_stream(device=None):
        return of((index(device), 0))

    def set_stream(s):
        if s is not None:
            k = key(s)
            streams.set_current(k)
            streams.set_device(k[0])

    @contextlib.contextmanager
    def stream(s):
        """torch.cuda.stream(s): s current on its device, and its device current, while the
        block runs (None: no change)."""
        prev, k = cur(), None if s is None else key(s)
        before = None if k is None else streams.current(k[0])
        if k is not None:
            set_stream(s)
        try:
            yield s
        finally:
            if k is not None:
                streams.set_current(before)
                streams.set_device(prev)

    class Event:
        """torch.cuda.Event (and torch.Event) on the simulated GPUs: stamped with what its
        stream runs after, and when its GPU reaches it."""
        __slots__ = ("_timing", "_at")

        def __init__(self, enable_timing=False, blocking=False, interprocess=False,
                     external=False, device=None):
            self._timing, self._at = bool(enable_timing), None

        def record(self, stream=None):
            k = key(stream)
            if self._at is not None and stamps[self._at][0] != k[0]:
                raise RuntimeError(f"Event device {stamps[self._at][0]} does not match "
                                   f"recording stream's device {k[0]}.")
            stamps.append(gpus.record(k))
            self._at = len(stamps) - 1

        def wait(self, stream=None):
            if self._at is not None:
                gpus.hold(key(stream), stamps[self._at])

        def query(self):
            return self._at is None or gpus.done(stamps[self._at])

        def synchronize(self):
            if self._at is not None:
                gpus.reached(stamps[self._at])

        def elapsed_time(self, end_event):
            if self._at is None or end_event._at is None:
                raise RuntimeError("Both events must be recorded before calculating elapsed "
                                   "time.")
            if not (self._timing and end_event._timing):
                raise RuntimeError("Both events must be created with argument "
                                   "'enable_timing=True'.")
            start, end = stamps[self._at], stamps[end_event._at]
            if start[0] != end[0]:
                raise RuntimeError("Both events must be recorded on the same device.")
            if max(start[1], end[1]) > time.perf_counter():
                raise RuntimeError("CUDA error: device not ready (an event not reached yet: "
                                   "wait with end.synchronize() before elapsed_time)")
            return (end[1] - start[1]) * 1e3

    def device_count():
        return count if count is not None else max(cur() + 1, 1)

    def is_available():
        """True, as on a GPU grader; torch's own code and the harness's ask the real runtime
        (torch would reach it for the devices it found)."""
        caller = sys._getframe(1).f_globals.get("__name__", "")
        own = any(caller == m or caller.startswith(m + ".") for m in _OWN)
        return real_available() if own else True

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
            "default_stream": default_stream, "Event": Event, "Stream": Stream,
            "stream": stream, "set_stream": set_stream, "device_count": device_count,
            "is_available": is_available, "get_device_name": get_device_name,
            "get_device_properties": get_device_properties}


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
def simulated_cuda(gpus, k, *, _REAL_COUNT=_REAL_COUNT):
    """The stand-ins for FakeGPUs(k), on `gpus` (a cuda_streams.Waits: no waits, the
    simulation runs nothing; its streams still order the work, stream_races.py)."""
    _REAL_COUNT.append(torch.cuda.device_count)
    try:
        with patched(installed(stand_ins(gpus, count=k))):
            yield
    finally:
        _REAL_COUNT.pop()


def not_stood_in(k, e, *, _REAL_COUNT=_REAL_COUNT):
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


del _REAL_COUNT
