"""Which devices to use, and timing that is honest about asynchronous GPUs."""
import statistics
import time

import torch

from .whole_numbers import validate_positive_int
from .words import plural

__all__ = ["DeviceClock", "Timer", "exact_float32", "get_devices", "num_gpus", "validate_gpus",
           "rank_clock", "sleep_until", "synced_now", "synchronize", "try_all_gpus", "try_gpu",
           "gpu_copy_gbs", "copy_while_computing", "gpu_chapter_figures", "GPU_TIMER_WORK",
           "time_matmul", "unsynced_timings"]


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
    validate_positive_int(k, "k", fix="how many devices, e.g. get_devices(2)")
    n = num_gpus()
    if n >= k:
        return [torch.device(f"cuda:{i}") for i in range(k)]
    if not simulate:
        fewer = f"use k <= {n}, or " if n else "run on a machine with GPUs, or use "
        raise RuntimeError(
            f"asked for {plural(k, 'GPU')} but found {n}: {fewer}get_devices({k}, simulate=True) "
            "to simulate the missing ones (correct results, no speed-up)")
    base = try_all_gpus()
    if n == 0 and k == 1:
        print("No GPU found: running on the CPU.")
        return base
    devices = [base[i % len(base)] for i in range(k)]
    where = "the CPU" if n == 0 else plural(n, "GPU")
    print(f"Simulating {k} devices on {where} ({plural(k - n, 'missing GPU')}): "
          "results as on one device up to float32 rounding, no speed-up.")
    return devices


def validate_gpus(k):
    """Raise a clear error unless at least k real GPUs are present."""
    validate_positive_int(k, "k", fix="how many GPUs this needs, e.g. validate_gpus(2)")
    n = num_gpus()
    if n < k:
        raise RuntimeError(f"this needs {plural(k, 'GPU')}, found {n}; run it on a GPU machine, "
                           "or use "
                           "get_devices(k) to simulate them")
    return [torch.device(f"cuda:{i}") for i in range(k)]


def _cuda_devices(devices):
    """The distinct CUDA devices among `devices` (one device, a name, or several)."""
    if devices is None:
        return []
    if isinstance(devices, (torch.device, str)):
        devices = [devices]
    return [d for d in dict.fromkeys(torch.device(d) for d in devices) if d.type == "cuda"]


def synchronize(devices):
    """Wait for queued work on the CUDA devices in `devices`; no CUDA call for CPU devices."""
    for d in _cuda_devices(devices):
        torch.cuda.synchronize(d)


def rank_clock(devices=(), stream_only=False, clock=None):
    """The rank clock for `devices` as a function of no arguments, resolved once (`clock`
    itself where no CUDA device is to be waited for): what synced_now, Timer and
    timing.measure read. stream_only: wait for each device's current stream only, not for its
    communication streams (an emulated box ends when its math has run, while a send may still
    be in flight). clock: the host clock read after the wait (None: time.perf_counter)."""
    clock = clock or time.perf_counter
    cuda = _cuda_devices(devices)
    if not cuda:
        return clock

    def now():
        for d in cuda:
            if stream_only:
                torch.cuda.current_stream(d).synchronize()
            else:
                torch.cuda.synchronize(d)
        return clock()
    return now


def synced_now(devices=(), stream_only=False):
    """The host clock, read after the queued work of `devices` has finished: the one clock for
    timing rank code. Without the wait, a timer around GPU work (a kernel, an NCCL collective,
    a `work.wait()`) measures only how long it took to queue it. No wait on a CPU."""
    return rank_clock(devices, stream_only)()


def sleep_until(deadline, now=synced_now):
    """Sleep (no CPU) until now() >= deadline (on the rank clock unless `now` says otherwise);
    time.sleep may wake early: sleep again."""
    while True:
        left = deadline - now()
        if left <= 0:
            return
        time.sleep(left)


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
    """Wall-clock timer on the rank clock of the given devices (rank_clock: it waits for their
    queued work before each reading).

    GPUs run asynchronously: without the synchronise, a timer measures only how long it took to
    queue the work.
    """

    def __init__(self, devices=()):
        self.devices = list(devices) if not isinstance(devices, torch.device) else [devices]
        self.times = []
        self._now = rank_clock(self.devices)

    def start(self):
        self._t0 = self._now()

    def stop(self):
        self.times.append(self._now() - self._t0)
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
        return statistics.median(self.times[skip:] if len(self.times) > skip else self.times)


def exact_float32():
    """Turn TF32 off on NVIDIA GPUs (Ampere and newer use it for convolutions by default), so
    results compared across devices, splits and code paths agree to float32 precision.
    Nothing changes on a CPU."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


# ---- the GPU chapter's measurements (book/gpus.ipynb builds the first two) ----------------------
def gpu_copy_gbs(X, device, reps=5):
    """GB/s of copying X to the GPU `device`, timed with CUDA events: the
    median of `reps` copies after a warm-up."""
    on = X.device if X.device.type == "cuda" else torch.device(device)
    X.to(device, non_blocking=True)                 # warm-up
    times = []
    with torch.cuda.device(on):                     # events on its stream
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            X.to(device, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)   # ms -> s
    return X.numel() * X.element_size() / statistics.median(times) / 1e9


def copy_while_computing(X_host, A, reps=5):
    """Seconds (CUDA events, median of `reps`) of a copy of pinned X_host to
    A's GPU plus a product A @ A: on one stream, and with the copy on a
    second stream."""
    side = torch.cuda.Stream(A.device)
    main = torch.cuda.current_stream(A.device)
    result = {}
    for name, copier in (("one stream", main), ("two streams", side)):
        times = []
        for _ in range(reps + 1):                     # the first warms up
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(main)
            copier.wait_stream(main)                  # starts after `start`
            with torch.cuda.stream(copier):
                X_host.to(A.device, non_blocking=True)
            A @ A                                     # on the main stream
            main.wait_stream(copier)                  # the copy is done too
            end.record(main)
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        result[name] = statistics.median(times[1:])
    return result


# the GPU chapter's product for its timer lesson (its `gpu_work`, tests/test_notebook_sync.py):
# several ms on a current GPU, so that queueing it is a small part of running it
GPU_TIMER_WORK = dict(n=4096, reps=10, rounds=5)


def time_matmul(A, B, reps, sync):
    """Seconds per product, with or without waiting for the device."""
    A @ B                         # warm-up: the first call pays for set-up
    synchronize([A.device])
    t0 = time.perf_counter()
    for _ in range(reps):
        A @ B                     # queued; the result is not needed
    if sync:
        synchronize([A.device])
    return (time.perf_counter() - t0) / reps


def unsynced_timings(device, work=None):
    """The GPU chapter's timer lesson as its cell runs it: seconds per n x n product on `device`
    read without and with synchronising (time_matmul), one of each per round, in turns."""
    work = dict(work or GPU_TIMER_WORK)
    A = torch.randn(work["n"], work["n"], device=device)
    B = torch.randn(work["n"], work["n"], device=device)
    wrong_s, right_s = [], []
    for _ in range(work["rounds"]):
        wrong_s.append(time_matmul(A, B, work["reps"], sync=False))
        right_s.append(time_matmul(A, B, work["reps"], sync=True))
    return dict(timer=work, wrong_s=wrong_s, right_s=right_s)


def gpu_chapter_figures(mib=256):
    """What the GPU chapter's GPU-only sections measure, for the GPU reference run
    (scripts/gpu_runner.sh): host-to-GPU GB/s from pageable and pinned memory, GB/s of a copy
    inside the GPU, GPU-to-GPU GB/s (2 GPUs), LeNet's step memory at batch 256, a copy plus a
    product on one stream against two, and the products timed without and with synchronising
    (unsynced_timings). Needs a GPU."""
    from .models import lenet_module
    validate_gpus(1)
    d = torch.device("cuda", 0)
    X = torch.randn(mib * 2**18)
    out = dict(mib=mib, pageable_gbs=gpu_copy_gbs(X, d),
               pinned_gbs=gpu_copy_gbs(X.pin_memory(), d))
    on = X.to(d)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    on.clone()
    start.record()
    for _ in range(5):
        on.clone()                                  # read and write GPU memory
    end.record()
    end.synchronize()
    # bytes copied, each counted once (as over the link), not bytes read plus written
    out["inside_gbs"] = on.nbytes * 5 / (start.elapsed_time(end) / 1e3) / 1e9
    if num_gpus() >= 2:
        out["p2p"] = torch.cuda.can_device_access_peer(0, 1)
        out["gpu_to_gpu_gbs"] = gpu_copy_gbs(on, torch.device("cuda", 1))
    net = lenet_module().to(d)
    X_gpu = torch.randn(256, 1, 28, 28, device=d)
    net(X_gpu).sum().backward()                     # warm-up: libraries set up
    net.zero_grad(set_to_none=True)
    torch.cuda.synchronize(d)
    torch.cuda.reset_peak_memory_stats(d)
    before = torch.cuda.memory_allocated(d)
    net(X_gpu).sum().backward()
    out["step_peak_mib"] = (torch.cuda.max_memory_allocated(d) - before) / 2**20
    out["before_mib"] = before / 2**20
    with torch.cuda.device(0):
        both = copy_while_computing(X.pin_memory(), torch.randn(4096, 4096, device=d))
    out["one_stream_ms"], out["two_streams_ms"] = (1e3 * both["one stream"],
                                                   1e3 * both["two streams"])
    out.update(unsynced_timings(d))
    return out
