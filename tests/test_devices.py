"""Device helpers: [cpu] never [], simulation says so, strict mode errors, no CUDA call on a CPU."""
import time

import pytest
import torch

import helpers
from helpers import devices
from helpers.devices import DeviceClock, validate_gpus


def test_try_all_gpus_is_never_empty():
    ds = helpers.try_all_gpus()
    assert ds, "try_all_gpus must return [cpu] without GPUs, never []"
    if not torch.cuda.is_available():
        assert ds == [torch.device("cpu")]
        assert helpers.try_gpu() == torch.device("cpu")
        assert helpers.try_gpu(3) == torch.device("cpu")


def test_get_devices_simulates_missing_gpus_and_says_so(capsys, monkeypatch):
    monkeypatch.setattr(devices, "num_gpus", lambda: 0)
    ds = helpers.get_devices(3)
    assert ds == [torch.device("cpu")] * 3
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "Simulating 3 devices on the CPU" in out


def test_get_devices_round_robins_over_real_gpus(monkeypatch, capsys):
    monkeypatch.setattr(devices, "num_gpus", lambda: 2)
    monkeypatch.setattr(devices, "try_all_gpus",
                        lambda: [torch.device("cuda:0"), torch.device("cuda:1")])
    assert [str(d) for d in helpers.get_devices(4)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert "Simulating 4 devices on 2 GPUs" in capsys.readouterr().out
    assert [str(d) for d in helpers.get_devices(2)] == ["cuda:0", "cuda:1"]
    assert capsys.readouterr().out == ""   # enough GPUs: nothing simulated, nothing said


def test_too_few_gpus_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(devices, "num_gpus", lambda: 1)
    with pytest.raises(RuntimeError, match="asked for 4 GPUs but found 1"):
        helpers.get_devices(4, simulate=False)
    with pytest.raises(RuntimeError, match="needs 2 GPU"):
        validate_gpus(2)
    with pytest.raises(ValueError):
        helpers.get_devices(0)


def test_synchronize_makes_no_cuda_call_for_cpu_devices(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("torch.cuda.synchronize called for CPU devices")
    monkeypatch.setattr(torch.cuda, "synchronize", boom)
    helpers.synchronize([torch.device("cpu"), torch.device("cpu")])
    with helpers.Timer([torch.device("cpu")]) as t:
        pass
    assert len(t.times) == 1 and t.times[0] >= 0


def test_synchronize_calls_cuda_for_each_cuda_device_once(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: seen.append(str(d)))
    helpers.synchronize([torch.device("cuda:0"), torch.device("cuda:0"), torch.device("cuda:1"),
                         torch.device("cpu")])
    assert sorted(seen) == ["cuda:0", "cuda:1"]


def test_timer_reads_the_rank_clock(monkeypatch):
    """Timer's start and stop each wait for the CUDA devices before reading the host clock."""
    seen = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: seen.append(str(d)))
    monkeypatch.setattr(time, "perf_counter", lambda: seen.append("clock") or len(seen))
    t = helpers.Timer([torch.device("cuda:1")])
    t.start()
    t.stop()
    assert seen == ["cuda:1", "clock"] * 2 and t.times == [2]


def test_timer_median_skips_warmup():
    t = helpers.Timer()
    t.times = [10.0, 1.0, 3.0, 2.0]
    assert t.median(skip=1) == 2.0 and t.median() == 2.5


def test_exact_float32_turns_tf32_off():
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        helpers.exact_float32()
        assert torch.backends.cudnn.allow_tf32 is False
        assert torch.backends.cuda.matmul.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def test_synced_now_waits_for_cuda_devices_only(monkeypatch):
    """The rank clock synchronises each CUDA device it is given (else a GPU timer measures the
    queueing) and makes no CUDA call for the CPU."""
    import torch
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: waited.append(str(d)))
    helpers.synced_now(torch.device("cpu"))
    helpers.synced_now()
    assert waited == []
    helpers.synced_now("cuda:1")
    helpers.synced_now([torch.device("cuda:0"), torch.device("cpu"), torch.device("cuda:0")])
    assert waited == ["cuda:1", "cuda:0"]


def test_stream_only_waits_for_the_current_stream_not_the_device(monkeypatch):
    """The emulated Clock's reading (stream_only): a box waits for its math, not for a send in
    flight on a communication stream, so torch.cuda.synchronize is never called."""
    waited = []

    class Stream:
        def __init__(self, d):
            self.d = d

        def synchronize(self):
            waited.append(str(self.d))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: pytest.fail("whole device"))
    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    helpers.synced_now(["cuda:0", "cpu", "cuda:0"], stream_only=True)
    helpers.synced_now(None, stream_only=True)
    assert waited == ["cuda:0"]


def test_sleep_until_sleeps_on_the_clock_it_is_given(monkeypatch):
    """sleep_until reads `now` (the rank clock by default) until the deadline has passed, even
    when a sleep wakes early."""
    from helpers.devices import sleep_until, synced_now
    t = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        t[0] += s / 2                                # wakes early: half the time passed
    monkeypatch.setattr(time, "sleep", sleep)
    sleep_until(1.0, lambda: t[0])
    assert t[0] >= 1.0 - 1e-9 and slept[:2] == [1.0, 0.5]
    assert sleep_until.__defaults__ == (synced_now,)


def test_device_clock_is_the_host_clock_on_a_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: pytest.fail("a CUDA call"))
    clock = DeviceClock("cpu")
    a, b = clock.stamp(), clock.stamp()
    assert isinstance(a, float) and a <= b and clock.seconds([a, b]) == [a, b]


def test_device_clock_on_a_gpu_stamps_events_and_maps_them_to_the_host_clock(monkeypatch):
    """On a GPU a stamp is an event (when the GPU gets there), the host clock is never read
    while stamping, and seconds() places each event on the host clock from one event recorded
    after the device caught up: here the GPU runs 40 s behind the host's reading."""
    gpu_now = [100.0]

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing, "an event without timing has no elapsed_time"
            self.t = None

        def record(self, stream=None):
            self.t = gpu_now[0]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3

    synced = []
    host = [None]
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    monkeypatch.setattr(devices.time, "perf_counter", lambda: host[0] if host[0] is not None
                        else pytest.fail("the host clock read around queued GPU work"))
    clock = DeviceClock("cuda:1")
    a = clock.stamp()
    gpu_now[0] = 100.5
    b = clock.stamp()
    assert isinstance(a, Event) and isinstance(b, Event)
    gpu_now[0], host[0] = 101.0, 61.0       # the last event fires at 101.0; the host reads 61.0
    assert clock.seconds([a, b, 7.0]) == [60.0, 60.5, 7.0]
    assert synced == [torch.device("cuda:1")], "it waits for the device before reading"


def test_unsynced_timings_reads_each_round_both_ways_and_waits_only_when_asked(monkeypatch):
    """The GPU reference run's timer readings (gpu_chapter_figures): one reading without and one
    with synchronising per round, through time_matmul, the code the GPU chapter runs."""
    waits = []
    monkeypatch.setattr(devices, "synchronize", lambda ds: waits.append(list(ds)))
    work = dict(n=8, reps=2, rounds=3)
    got = devices.unsynced_timings(torch.device("cpu"), work)
    assert got["timer"] == work and got["timer"] is not work
    assert len(got["wrong_s"]) == len(got["right_s"]) == 3
    assert all(t > 0 for t in got["wrong_s"] + got["right_s"])
    # each call waits after its warm-up; only the synchronised one waits after its products
    assert len(waits) == 3 * (1 + 2) and all(w == [torch.device("cpu")] for w in waits)
