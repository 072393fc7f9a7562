"""The simulated GPUs check_time_it (profile.py) times on: they run asynchronously, as CUDA does,
and torch.cuda's synchronize, current device, streams and events stand in for theirs while the
answer runs, so the check sees whether and when the answer waited, and what the calls took;
the answer's reads of CPU-time clocks (a timer on one cannot see the GPUs' work) and of wall
clocks are noted, in order with the calls and synchronizations."""
import contextlib
import math
import os
import sys
import threading
import time

try:
    import resource
except ImportError:          # not on Windows
    resource = None

import torch

from ._core.cuda_calls import installed, patched, stand_ins
from ._core.cuda_streams import Waits, sleep_until

__all__ = ["AsyncGPUs"]


class AsyncGPUs(Waits):
    """Simulated GPUs that run asynchronously, as CUDA does: `queue(work)` returns at once, the
    work queued on each device's current stream, and `synchronize(d)` (torch.cuda.synchronize,
    which helpers.synchronize calls) sleeps until d's queued work is done. Records the calls of
    fn and the synchronizations, in order, and the GPU time of each call (what CUDA events
    recorded around it measure). A wait on one stream, or on an event, is a synchronization of
    its device only when it comes after everything queued there (cuda_streams.py)."""

    def __init__(self, devices):
        super().__init__()
        self.devices = devices
        self.ends = {}                                # when each stream's queue runs dry
        self.aside = set()       # the GPUs waited on through a stream or event that missed work
        self.events = []                              # ("call", i, t) and ("sync", device, t)
        self.starts = []
        self.work = []                                # each call's GPU seconds (longest device)
        # per clock read of the answer's: (a CPU-time clock's name, blind to the waits, or None
        # for a wall clock's, len(self.events) then)
        self.reads = []
        self.marks = 0                                # events recorded (torch.cuda.Event)

    def queue(self, work):
        now = time.perf_counter()
        for d, seconds in work.items():
            s = self.streams.current(d.index)
            self.ends[s] = max(self.ends.get(s, 0.0), now) + seconds
            self.streams.launch(s)

    def call(self, work):
        i = len(self.starts)
        self.starts.append(time.perf_counter())
        self.events.append(("call", i, self.starts[-1]))
        self.work.append(max(work.values()))
        self.queue(work)

    def synchronize(self, i):
        """torch.cuda.synchronize(i): sleeps until every stream of GPU i has run dry."""
        sleep_until(max(self.ends.get(s, 0.0) for s in self.streams.streams_of(i)))
        super().synchronize(i)
        self.events.append(("sync", torch.device("cuda", i), time.perf_counter()))

    def _waited(self, stamp, stream):
        """The host waited for `stamp` (of `stream`): a synchronization of its GPU if nothing
        queued there is left out."""
        self.streams.waited(stamp)
        d = torch.device("cuda", stream[0])
        if self.streams.covers(stamp, stream[0]):
            self.events.append(("sync", d, time.perf_counter()))
        elif stream != (stream[0], 0):          # a stream of the answer's: fn's work not on it
            self.aside.add(d)

    def stream_sync(self, stream):
        """Stream.synchronize: sleeps until that stream has run dry."""
        sleep_until(self.ends.get(stream, 0.0))
        self._waited(self.streams.stamp(stream), stream)

    def stream_done(self, stream):
        """Stream.query: whether it has run dry (then the host knows, as after a wait)."""
        if self.ends.get(stream, 0.0) > time.perf_counter():
            return False
        self._waited(self.streams.stamp(stream), stream)
        return True

    def record(self, stream):
        """An event recorded on `stream` now: stamped when the stream reaches it (its queue's
        end, or now if idle)."""
        self.marks += 1
        return (stream[0], max(self.ends.get(stream, 0.0), time.perf_counter()),
                self.streams.stamp(stream), stream)

    def reached(self, at):
        """Event.synchronize: sleeps until the GPU reaches the event."""
        sleep_until(at[1])
        self._waited(at[2], at[3])

    def done(self, at):
        """Event.query: whether the GPU reached the event (then as its synchronize)."""
        if at[1] > time.perf_counter():
            return False
        self._waited(at[2], at[3])
        return True

    def hold(self, stream, at):
        """A stream's wait for an event: its later work starts after the event's point."""
        self.ends[stream] = max(self.ends.get(stream, 0.0), at[1])
        super().hold(stream, at)

    @contextlib.contextmanager
    def active(self):
        """Stand in for torch.cuda's synchronize, current device, streams and events (and
        torch.accelerator's), the ones FakeGPUs has too (cuda_calls.py): a synchronize waits for
        the device's queue, an event is stamped when its GPU reaches it; and note each read of
        a CPU-time clock (`_cpu_clocks`: a sleep or a wait on a GPU does not advance them) and
        the answer's reads of a wall clock."""
        answer = threading.get_ident()

        def note(read):     # a wall clock read by another thread or by the harness: not noted
            if read is not None or (threading.get_ident() == answer and not sys._getframe(
                    2).f_code.co_filename.startswith(_HARNESS)):
                self.reads.append((read, len(self.events)))
        pairs = installed(stand_ins(self, count=len(self.devices)))
        pairs += [(owner, name, _noted(owner, name, ids, note))
                  for owner, name, ids in _cpu_clocks() + _wall_clocks()]
        with patched(pairs):
            yield self

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
        """The CPU-time clock that stopped each of the last `timed` calls of fn, as the reader
        named it: for each, no wall clock read between the call and the first synchronize after
        it (a wall clock stopped before the wait, a CPU time logged after it), and the last clock
        read after that synchronize, before the next call, a CPU-time clock's; else None."""
        calls = [j for j, e in enumerate(self.events) if e[0] == "call"]
        calls = calls[len(calls) - timed:]
        names = []
        for j, end in zip(calls, calls[1:] + [math.inf], strict=True):
            sync = next((k for k, e in enumerate(self.events) if k > j and e[0] == "sync"), end)
            early = [name for name, at in self.reads if j < at <= sync]
            late = [name for name, at in self.reads if sync < at <= end]
            names.append(late[-1] if late and None not in early else None)
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
_HARNESS = os.path.dirname(os.path.abspath(__file__))    # the checks' code: its reads not noted


def _wall_clocks():
    """(module, name, None) of time's wall clocks (clock_gettime of a wall clock id: with the
    CPU-time clocks)."""
    return [(time, n, None) for n in ("perf_counter", "perf_counter_ns", "monotonic",
                                      "monotonic_ns", "time", "time_ns")]


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
    """`owner.name` (a clock) that notes the read: named as the reader wrote it when it reads
    a CPU-time clock (of `ids`, for clock_gettime), None when a wall clock: a closure."""
    clock, where = getattr(owner, name), f"{owner.__name__}.{name}"
    named = None if (owner, name, ids) in _wall_clocks() else where

    def read(*args, **kwargs):
        clock_id = args[0] if args else None
        if name == "pthread_getcpuclockid":     # an id for clock_gettime, not a read
            found = clock(*args, **kwargs)
            ids[found] = f"{where}(...)"
            return found
        if ids is None:
            note(named)
        elif type(clock_id) is int and clock_id in ids:
            note(f"{where}({ids[clock_id]})")
        else:
            note(None)
        return clock(*args, **kwargs)
    read.__name__ = read.__qualname__ = name
    return read
