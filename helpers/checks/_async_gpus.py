"""The simulated GPUs check_time_it (profile.py) times on: they run asynchronously, as CUDA does,
and torch.cuda's synchronize, current device, streams and events stand in for theirs while the
answer runs, so the check sees whether and when the answer waited, and what the calls took;
reads of CPU-time clocks are noted (a timer on one cannot see the GPUs' work)."""
import contextlib
import math
import os
import time
import types

try:
    import resource
except ImportError:          # not on Windows
    resource = None

import torch

__all__ = ["AsyncGPUs"]


class AsyncGPUs:
    """Simulated GPUs that run asynchronously, as CUDA does: `queue(work)` returns at once,
    and `synchronize(d)` (torch.cuda.synchronize, which helpers.synchronize calls) sleeps until
    d's queued work is done. Records the calls of fn and the synchronizations, in order, and the
    GPU time of each call (what CUDA events recorded around it measure)."""

    def __init__(self, devices):
        self.devices = devices
        self.busy = {d: 0.0 for d in devices}        # when each device's queue runs dry
        self.queued = {d: 0 for d in devices}        # how many items each device was given
        self.events = []                              # ("call", i, t) and ("sync", device, t)
        self.starts = []
        self.work = []                                # each call's GPU seconds (longest device)
        # per read of a CPU-time clock (blind to the waits): (its name, the calls started then)
        self.cpu_clock = []

    def queue(self, work):
        now = time.perf_counter()
        for d, seconds in work.items():
            self.busy[d] = max(self.busy[d], now) + seconds
            self.queued[d] += 1

    def call(self, work):
        i = len(self.starts)
        self.starts.append(time.perf_counter())
        self.events.append(("call", i, self.starts[-1]))
        self.work.append(max(work.values()))
        self.queue(work)

    def synchronize(self, device=None):
        d = torch.device("cuda", device) if isinstance(device, int) else torch.device(
            device if device is not None else "cuda")
        d = torch.device("cuda", d.index or 0) if d.type == "cuda" else d
        wait = self.busy.get(d, 0.0) - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        self.events.append(("sync", d, time.perf_counter()))

    def mark(self, i):
        """An event recorded on GPU i now: when the GPU reaches it (its queue's end, or now if
        idle) and how many items it had been given then."""
        d = torch.device("cuda", i)
        return max(self.busy.get(d, 0.0), time.perf_counter()), self.queued.get(d, 0)

    def reached(self, i, point, count):
        """An event's synchronize: sleeps until GPU i reaches the event; a synchronization of
        the GPU if nothing was queued on it after the event was recorded."""
        wait = point - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        d = torch.device("cuda", i)
        if self.queued.get(d, 0) == count:
            self.events.append(("sync", d, time.perf_counter()))

    def hold(self, i, point):
        """A stream's wait for an event: GPU i's later work starts after the event's point."""
        d = torch.device("cuda", i)
        if d in self.busy:
            self.busy[d] = max(self.busy[d], point)

    @contextlib.contextmanager
    def active(self):
        """Stand in for torch's synchronize (torch.cuda, torch.accelerator), the current device
        it uses without an argument (torch.cuda.device, set_device, current_device), the
        streams of a device (current_stream, default_stream: .synchronize() waits for it) and
        torch.cuda.Event (recorded on the current device's stream or a given one); and note each
        read of a CPU-time clock (`_cpu_clocks`: a sleep or a wait on a GPU does not advance
        them)."""
        cuda = torch.cuda
        names = ["synchronize", "device", "set_device", "current_device", "current_stream",
                 "default_stream", "Event"]
        saved = [(cuda, name, getattr(cuda, name)) for name in names]
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None and hasattr(accelerator, "synchronize"):
            saved.append((accelerator, "synchronize", accelerator.synchronize))
        stand_ins = _stand_ins(self.synchronize, self.mark, self.reached, self.hold)
        for owner, name, ids in _cpu_clocks():
            saved.append((owner, name, getattr(owner, name)))
            stand_ins[name] = _noted(owner, name, ids,
                                     lambda read: self.cpu_clock.append((read, len(self.starts))))
        for owner, name, _ in saved:
            setattr(owner, name, stand_ins[name])
        try:
            yield self
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)

    def unsynced(self, gpus, earlier, timed):
        """Where the timed calls (the last `timed` calls of fn) were not waited for: the GPUs
        still running what was queued before the first of them (earlier work, or every GPU after
        untimed calls, which may be queued back to back) and not synchronized since, then, for
        each timed call, the GPUs not synchronized between it and the next call (or the end):
        [(call index, [devices], True if before it)]."""
        first = len(self.starts) - timed
        pending = gpus if first > 0 else earlier
        out, since, call = [], set(), -1
        for kind, what, _ in self.events + [("call", None, None)]:
            if kind == "sync":
                since.add(what)
                continue
            if call >= first:
                out.append((call, [d for d in gpus if d not in since], False))
            elif what == first:
                out.append((first, [d for d in pending if d not in since], True))
            since, call = set(), what
        return [item for item in sorted(out, key=lambda item: not item[2]) if item[1]]

    def cpu_timer(self, timed):
        """The CPU-time clock read after each of the last `timed` calls of fn started and before
        the next one (what a timer on it stops on), as the reader named it; None when no such
        read follows every one of them (a CPU time logged aside, around the whole loop)."""
        n, after = len(self.starts), {calls: name for name, calls in self.cpu_clock}
        names = [after.get(i + 1) for i in range(n - timed, n)]
        return names[-1] if names and all(names) else None

    def durations(self, gpus):
        """What each call really took: from its start to the return of the synchronize that
        found the last of its work done, on every GPU."""
        out = []
        for i, start in enumerate(self.starts):
            at = next(j for j, e in enumerate(self.events) if e[:2] == ("call", i))
            ends = []
            for d in gpus:
                ends.append(next((e[2] for e in self.events[at:] if e[:2] == ("sync", d)),
                                 math.inf))
            out.append(max(ends) - start)
        return out


_CPU_IDS = ("CLOCK_PROCESS_CPUTIME_ID", "CLOCK_THREAD_CPUTIME_ID")


def _cpu_clocks():
    """(module, name, clock ids) of what reads a CPU-time clock: time's own, clock_gettime of a
    CPU-time clock id (ids: {id: its name}; None: every read; a thread's, that
    pthread_getcpuclockid returns, added as it is asked), os.times and getrusage (their user and
    system times). A name bound before the check ran is not seen."""
    ids = {getattr(time, n): n for n in _CPU_IDS if hasattr(time, n)}
    found = [(time, n, None) for n in ("process_time", "process_time_ns", "thread_time",
                                       "thread_time_ns")]
    found += [(time, n, ids) for n in ("clock_gettime", "clock_gettime_ns",
                                       "pthread_getcpuclockid") if hasattr(time, n)]
    found += [(os, "times", None)] if hasattr(os, "times") else []
    return found + ([(resource, "getrusage", None)] if resource is not None else [])


def _noted(owner, name, ids, note):
    """`owner.name` (a clock) that notes the read, named as the reader wrote it, when it reads
    a CPU-time clock (of `ids`, for clock_gettime): a closure."""
    clock, where = getattr(owner, name), f"{owner.__name__}.{name}"

    def read(*args, **kwargs):
        clock_id = args[0] if args else None
        if name == "pthread_getcpuclockid":     # an id for clock_gettime, not a read
            found = clock(*args, **kwargs)
            ids[found] = f"{where}(...)"
            return found
        if ids is None:
            note(where)
        elif type(clock_id) is int and clock_id in ids:
            note(f"{where}({ids[clock_id]})")
        return clock(*args, **kwargs)
    read.__name__ = read.__qualname__ = name
    return read


def _stand_ins(sync, mark, reached, hold):
    """torch.cuda's synchronize, device, set_device, current_device, current_stream,
    default_stream and Event on the simulation: plain functions, closures and a class (no bound
    method, no attribute leads to the records); the current device is what synchronize() waits
    for and what an event is recorded on."""
    current = [0]

    def index(device):
        if device is None:
            return current[0]
        if isinstance(device, int):
            return device
        d = torch.device(device)
        if d.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {d}")
        return current[0] if d.index is None else d.index

    def synchronize(device=None):
        sync(index(device))

    def set_device(device):
        current[0] = index(device)

    def current_device():
        return current[0]

    @contextlib.contextmanager
    def device(device):
        before = current[0]
        if device is not None and not (isinstance(device, int) and device < 0):
            current[0] = index(device)
        try:
            yield
        finally:
            current[0] = before

    def stream(device=None):
        i = index(device)

        def wait():
            synchronize(i)

        def record_event(event=None):
            event = Event() if event is None else event
            event.record(here)
            return event

        here = types.SimpleNamespace(synchronize=wait, device=torch.device("cuda", i),
                                     record_event=record_event,
                                     wait_event=lambda event: event.wait(here),
                                     query=lambda: mark(i)[0] <= time.perf_counter())
        return here

    def on(stream):
        if stream is None:
            return current[0]
        d = getattr(stream, "device", None)
        if not isinstance(d, torch.device) or d.type != "cuda":
            raise TypeError("expected stream to be a torch.Stream or torch.cuda.Stream object")
        return index(d)

    class Event:
        """torch.cuda.Event on the simulated GPUs: stamped when its GPU reaches it."""
        __slots__ = ("_timing", "_at")

        def __init__(self, enable_timing=False, blocking=False, interprocess=False,
                     external=False):
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

    return {"synchronize": synchronize, "device": device, "set_device": set_device,
            "current_device": current_device, "current_stream": stream,
            "default_stream": stream, "Event": Event}
