"""check_time_it with streams, and the torch.cuda calls a timer asks first: fn queues its work on
each GPU's current stream, so a new torch.cuda.Stream (its synchronize, an event recorded on it,
or one recorded while it is current) holds none of it and waits for nothing, as on CUDA; waiting
on every GPU the process sees (device_count), behind is_available, or by polling query() until it
says the work is done waits as a synchronize does (the simulated GPUs answer as a GPU grader's).
The checks time simulated GPUs that sleep, so these tests mostly wait."""
import statistics
import time

import torch
from check_cases import other, parametrize_cases, shortcut

import helpers


def _cuda(devices):
    return [torch.device(d) for d in devices if torch.device(d).type == "cuda"]


def _timed(fn, reps, sync):
    """The median of `reps` calls, each between two calls of sync()."""
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


SIDE = ["never waited for", "torch.cuda.Stream"]


@shortcut("check_time_it", "synchronizes a new stream of each GPU (fn's work is not on it)", SIDE)
def time_it_new_stream_sync(fn, devices, reps=5):
    streams = [torch.cuda.Stream(d) for d in _cuda(devices)]

    def sync():
        for s in streams:
            s.synchronize()
    return _timed(fn, reps, sync)


@shortcut("check_time_it", "CUDA events recorded on a side stream of each GPU", SIDE)
def time_it_side_stream_events(fn, devices, reps=5):
    gpus = _cuda(devices)
    side = {d: torch.cuda.Stream(device=d) for d in gpus}
    times = []
    for _ in range(reps):
        helpers.synchronize(devices)
        start = {d: side[d].record_event(torch.cuda.Event(enable_timing=True)) for d in gpus}
        fn()
        end = {d: side[d].record_event(torch.cuda.Event(enable_timing=True)) for d in gpus}
        for e in end.values():
            e.synchronize()
        times.append(max(start[d].elapsed_time(end[d]) for d in gpus) / 1e3)
    return statistics.median(times)


@shortcut("check_time_it", "an event recorded while a side stream is current, synchronized",
          SIDE)
def time_it_event_under_side_stream(fn, devices, reps=5):
    side = {d: torch.cuda.Stream(d) for d in _cuda(devices)}

    def sync():
        events = []
        for s in side.values():
            with torch.cuda.stream(s):
                e = torch.cuda.Event()
                e.record()
                events.append(e)
        for e in events:
            e.synchronize()
    return _timed(fn, reps, sync)


@other("check_time_it", "a side stream made to wait for the current one, then synchronized")
def time_it_side_waits_for_current(fn, devices, reps=5):
    side = {d: torch.cuda.Stream(d) for d in _cuda(devices)}

    def sync():
        for d, s in side.items():
            s.wait_stream(torch.cuda.current_stream(d))
            s.synchronize()
    return _timed(fn, reps, sync)


@other("check_time_it", "every GPU the process sees synchronized (torch.cuda.device_count)")
def time_it_every_gpu(fn, devices, reps=5):
    def sync():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)
    return _timed(fn, reps, sync)


@other("check_time_it", "helpers.synchronize behind torch.cuda.is_available()")
def time_it_guarded(fn, devices, reps=5):
    def sync():
        if torch.cuda.is_available():
            helpers.synchronize(devices)
    return _timed(fn, reps, sync)


@other("check_time_it", "an event per GPU, polled with query() until reached")
def time_it_event_query(fn, devices, reps=5):
    def sync():
        events = []
        for d in _cuda(devices):
            e = torch.cuda.Event()
            e.record(torch.cuda.current_stream(d))
            events.append(e)
        for e in events:
            while not e.query():
                time.sleep(0)
    return _timed(fn, reps, sync)


@other("check_time_it", "each GPU's current stream polled with query() until idle")
def time_it_stream_query(fn, devices, reps=5):
    def sync():
        for d in _cuda(devices):
            s = torch.cuda.current_stream(d)
            while not s.query():
                time.sleep(0)
    return _timed(fn, reps, sync)


test_case = parametrize_cases(__name__)
