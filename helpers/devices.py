"""Which devices to use, and timing that is honest about asynchronous GPUs."""
import time

import torch

__all__ = ["DeviceClock", "Timer", "exact_float32", "get_devices", "num_gpus", "require_gpus",
           "synced_now", "synchronize", "try_all_gpus", "try_gpu"]


def num_gpus():
    """The number of CUDA GPUs (0 on a CPU-only machine; makes no CUDA call there)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def try_gpu(i=0):
    """GPU i if it exists, else the CPU."""
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
        raise ValueError(f"GPU index must be an int >= 0, got {i!r}: try_gpu(0) is the first GPU")
    return torch.device(f"cuda:{i}") if num_gpus() > i else torch.device("cpu")


def try_all_gpus():
    """All GPUs, or [cpu] when there are none (never an empty list)."""
    return [torch.device(f"cuda:{i}") for i in range(num_gpus())] or [torch.device("cpu")]


def get_devices(k, simulate=True):
    """k devices for data-parallel code: real GPUs where there are enough.

    Otherwise, with `simulate=True`, the missing ones are simulated on the devices there are (the
    GPUs round-robin, or the CPU), and one line says so. The code path stays the same; the speed
    does not. With `simulate=False`, too few GPUs is an error.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int (how many devices), got {k!r}: e.g. "
                         "get_devices(2)")
    n = num_gpus()
    if n >= k:
        return [torch.device(f"cuda:{i}") for i in range(k)]
    if not simulate:
        fewer = f"use k <= {n}, or " if n else "run on a machine with GPUs, or use "
        raise RuntimeError(
            f"asked for {k} GPUs but found {n}: {fewer}get_devices({k}, simulate=True) "
            "to simulate the missing ones (correct results, no speed-up)")
    base = try_all_gpus()
    if n == 0 and k == 1:
        print("No GPU found: running on the CPU.")
        return base
    devices = [base[i % len(base)] for i in range(k)]
    where = "the CPU" if n == 0 else f"{n} GPU{'s' if n > 1 else ''}"
    print(f"Simulating {k} devices on {where} ({k - n} missing GPU{'s' if k - n > 1 else ''}): "
          "results as on one device up to float32 rounding, no speed-up.")
    return devices


def require_gpus(k):
    """Raise a clear error unless at least k real GPUs are present."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int (how many GPUs this needs), got {k!r}")
    n = num_gpus()
    if n < k:
        raise RuntimeError(f"this needs {k} GPU(s), found {n}; run it on a GPU machine, or use "
                           "get_devices(k) to simulate them")
    return [torch.device(f"cuda:{i}") for i in range(k)]


def synchronize(devices):
    """Wait for queued work on the CUDA devices in `devices`; no CUDA call for CPU devices."""
    if isinstance(devices, (torch.device, str)):
        devices = [devices]
    for d in {torch.device(d) for d in devices}:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def synced_now(devices=()):
    """The host clock, read after the queued work of `devices` has finished: the one clock for
    timing rank code. Without the wait, a timer around GPU work (a kernel, an NCCL collective,
    a `work.wait()`) measures only how long it took to queue it. No wait on a CPU."""
    synchronize(devices)
    return time.perf_counter()


class DeviceClock:
    """Time stamps on one device's timeline, for a timeline of asynchronous work (gradient hooks,
    all-reduce launches and completions): on a GPU `stamp()` records a CUDA event in a stream
    (it fires when the GPU has run the work queued there before it, not when the host queued
    it); on a CPU it reads the host clock. `seconds(stamps)` turns them into host-clock seconds
    (waiting for the GPU first), so stamps compare with each other and with synced_now(device).
    Nothing waits while stamping: the timeline does not change what it measures."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.on_gpu = self.device.type == "cuda"

    def stamp(self, stream=None):
        """Now on the device's timeline: a CUDA event recorded in `stream` (None: the current
        stream) on a GPU, the host clock on a CPU."""
        if not self.on_gpu:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def host(self):
        """The host clock now: for what happens on the host (a gloo all-reduce's completion)."""
        return time.perf_counter()

    def seconds(self, stamps):
        """Host-clock seconds of `stamps` (floats pass through). On a GPU it waits for the
        device, records one more event and reads the host clock once it has fired: each
        event's time is that reading minus the GPU time from the event to it."""
        stamps = list(stamps)
        if all(isinstance(s, (int, float)) for s in stamps):
            return [float(s) for s in stamps]
        synchronize(self.device)
        last = torch.cuda.Event(enable_timing=True)
        last.record()
        last.synchronize()
        now = time.perf_counter()
        return [float(s) if isinstance(s, (int, float)) else now - s.elapsed_time(last) / 1e3
                for s in stamps]


class Timer:
    """Wall-clock timer that synchronises the given devices before reading the clock.

    GPUs run asynchronously: without the synchronise, a timer measures only how long it took to
    queue the work.
    """

    def __init__(self, devices=()):
        self.devices = list(devices) if not isinstance(devices, torch.device) else [devices]
        self.times = []

    def start(self):
        synchronize(self.devices)
        self._t0 = time.perf_counter()

    def stop(self):
        synchronize(self.devices)
        self.times.append(time.perf_counter() - self._t0)
        return self.times[-1]

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def sum(self):
        return sum(self.times)

    def avg(self):
        return self.sum() / len(self.times)

    def median(self, skip=0):
        """Median of the recorded times, leaving out the first `skip` (warm-up) if more remain."""
        if not self.times:
            raise ValueError("no times recorded yet: time at least one run (start/stop)")
        s = sorted(self.times[skip:] if len(self.times) > skip else self.times)
        m = len(s) // 2
        return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def exact_float32():
    """Turn TF32 off on NVIDIA GPUs (Ampere and newer use it for convolutions by default), so
    results compared across devices, splits and code paths agree to float32 precision.
    Nothing changes on a CPU."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
