"""check_time_it with CUDA events (torch.cuda.Event pairs, as book/gpus.ipynb recommends and
book/part4/scaling.ipynb times): the simulated GPUs stamp an event when they reach it, so a
right event answer passes and a wrong one fails, as a host-timed one does."""
import statistics

import torch
from check_cases import other, parametrize_cases, shortcut

from helpers.checks import check_time_it


def _cuda(devices):
    return [torch.device(d) for d in devices if torch.device(d).type == "cuda"]


@other("check_time_it", "a pair of CUDA events on each GPU, the longest span, median")
def time_it_events(fn, devices, reps=5):
    gpus = _cuda(devices)
    for d in gpus:
        torch.cuda.synchronize(d)
    times = []
    for _ in range(reps):
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in gpus]
        for d, (start, _) in zip(gpus, pairs, strict=True):
            with torch.cuda.device(d):
                start.record()
        fn()
        for d, (_, end) in zip(gpus, pairs, strict=True):
            end.record(torch.cuda.current_stream(d))
        for _, end in pairs:
            end.synchronize()
        times.append(max(s.elapsed_time(e) for s, e in pairs) / 1e3)
    return statistics.median(times)


@other("check_time_it", "CUDA events on each GPU's stream (record_event), devices synchronised")
def time_it_stream_events(fn, devices, reps=5):
    gpus = _cuda(devices)
    times = []
    for _ in range(reps):
        for d in gpus:
            torch.cuda.synchronize(d)
        starts = [torch.cuda.current_stream(d).record_event(torch.cuda.Event(enable_timing=True))
                  for d in gpus]
        fn()
        ends = [torch.cuda.current_stream(d).record_event(torch.cuda.Event(enable_timing=True))
                for d in gpus]
        for d in gpus:
            torch.cuda.synchronize(d)
        times.append(max(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) / 1e3)
    return statistics.median(times)


@shortcut("check_time_it", "events read before they are reached (no synchronize)",
          ["device not ready", "end.synchronize()"])
def time_it_events_unsynced(fn, devices, reps=5):
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


@shortcut("check_time_it", "events recorded every call, one synchronize at the end",
          "with CUDA events too, the exercise asks for that synchronize after every call")
def time_it_events_synced_once(fn, devices, reps=5):
    gpus = _cuda(devices)
    for d in gpus:
        torch.cuda.synchronize(d)
    spans = []
    for _ in range(reps):
        starts = [torch.cuda.current_stream(d).record_event(torch.cuda.Event(enable_timing=True))
                  for d in gpus]
        fn()
        ends = [torch.cuda.current_stream(d).record_event(torch.cuda.Event(enable_timing=True))
                for d in gpus]
        spans.append(list(zip(starts, ends, strict=True)))
    for d in gpus:
        torch.cuda.synchronize(d)
    return statistics.median(max(s.elapsed_time(e) for s, e in pairs) / 1e3 for pairs in spans)


@shortcut("check_time_it", "events on the current GPU only (the others never waited for)",
          ["cuda:", "synchronise"])
def time_it_events_one_gpu(fn, devices, reps=5):
    times = []
    torch.cuda.synchronize()
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


@shortcut("check_time_it", "events on the current GPU only, every device synchronised",
          "median of per-call times")
def time_it_events_one_gpu_synced(fn, devices, reps=5):
    gpus = _cuda(devices)
    times = []
    for _ in range(reps):
        for d in gpus:
            torch.cuda.synchronize(d)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        for d in gpus:
            torch.cuda.synchronize(d)
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


test_case = parametrize_cases(__name__)


def test_event_answers_are_judged_alike_on_every_draw():
    """The right event answers pass and the wrong ones fail on several draws."""
    from helpers.checks._core.inputs import replay_seeds
    for seed in range(4000, 4004):     # conftest replays its own seeds again after the test
        for answer in (time_it_events, time_it_stream_events):
            replay_seeds(seed)
            assert check_time_it(answer).status == "passed", (seed, answer.__name__)
        for answer in (time_it_events_unsynced, time_it_events_one_gpu,
                       time_it_events_one_gpu_synced):
            replay_seeds(seed)
            assert check_time_it(answer).status == "failed", (seed, answer.__name__)


def test_the_events_are_put_back():
    saved = torch.cuda.Event, torch.cuda.current_stream
    check_time_it(time_it_events)
    check_time_it(time_it_events_unsynced)
    assert (torch.cuda.Event, torch.cuda.current_stream) == saved


def test_event_answers_pass_on_a_loaded_machine(monkeypatch):
    """Events time the GPUs, not the host: when every sleep overruns 3x, the calls' host times
    grow and their GPU times do not, and the check takes either median."""
    import time
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: real_sleep(3 * s))
    assert check_time_it(time_it_events).status == "passed"


def test_a_progress_watcher_left_running_does_not_run_a_patched_sleep(monkeypatch):
    """helpers.runtime.progress's watcher thread (started by an earlier launch in the process)
    slept through `time.sleep`, so a test that slowed time.sleep made that old thread run the
    test's lambda, and the check refused it as the reader's code on an unseen thread."""
    import threading
    import time

    from helpers.runtime import progress
    ran = threading.Event()
    real_sleep = time.sleep
    monkeypatch.setattr(progress, "_NOTE_AFTER", 0.04)
    watcher = threading.Thread(target=progress._watch, daemon=True)
    monkeypatch.setattr(progress, "_waits", threading.Lock())
    monkeypatch.setattr(time, "sleep", lambda s: (ran.set(), real_sleep(s)))
    watcher.start()
    real_sleep(0.1)
    assert not ran.is_set(), "the watcher ran the replaced time.sleep"
