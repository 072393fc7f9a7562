"""runtime/emulate.py: an emulated box lasts its modelled time and costs no CPU while it waits;
the real math still runs; overruns are reported; rates say where they come from; the idle time
before a box splits into waiting for its input and the delay after it was sent."""
import threading
import time

import pytest

from helpers import Clock, Rates, clock_scale
from helpers.runtime.emulate import ASSUMED_RATES, waits


def test_an_emulated_box_lasts_its_modelled_time_without_using_the_cpu():
    clock = Clock(emulate=True, scale=2.0)
    cpu0 = time.thread_time()
    with clock.box("F", 0.05, micro=3) as rec:
        x = sum(range(1000))                    # the real math: short
    cpu = time.thread_time() - cpu0
    b = clock.boxes[0]
    assert rec is b and b["micro"] == 3 and b["name"] == "F" and x == 499500
    assert b["end"] - b["start"] >= 0.1        # 0.05 modelled seconds, scale 2
    assert b["end"] - b["start"] < 0.1 + 0.05
    assert b["compute"] < 0.05 and b["overrun"] == 0.0
    assert cpu < 0.02, f"the wait used {cpu:.3f} s of CPU: it must sleep, not spin"


def test_the_real_run_records_the_same_boxes_and_does_not_wait():
    clock = Clock()
    with clock.box("B", 10.0):
        pass
    b = clock.boxes[0]
    assert b["end"] - b["start"] < 0.05 and b["modelled"] == 10.0 and "overrun" not in b


def test_an_overrun_is_reported():
    clock = Clock(emulate=True, scale=1.0)
    with clock.box("F", 0.001):
        time.sleep(0.02)
    assert clock.overruns() and clock.boxes[0]["overrun"] > 0.01


def test_bad_input_is_refused_before_any_work():
    with pytest.raises(ValueError, match="scale must be a positive"):
        Clock(emulate=True, scale=0)
    ran = []
    clock = Clock(emulate=True)
    with pytest.raises(ValueError, match="needs its modelled seconds"):
        with clock.box("F"):
            ran.append(1)
    assert not ran
    with pytest.raises(ValueError, match="must be positive"):
        clock_scale([0.0, 1.0])


def test_clock_scale_keeps_boxes_above_the_floor_and_the_math():
    assert clock_scale([1e-6, 4e-6], floor=0.01) == pytest.approx(1e4)
    # real math 1 ms for a 1 us box: factor 5 -> 5 ms per modelled us
    assert clock_scale([1e-6], [1e-3], factor=5, floor=0.001) == pytest.approx(5e3)


def test_rates_come_from_the_reference_run_when_it_has_them():
    assert Rates.load({"exists": False}) is ASSUMED_RATES
    assert "assumed" in ASSUMED_RATES.source
    ref = {"exists": True, "gpu": "NVIDIA X", "date": "2026-12-01", "torch": "2.11",
           "rates": {"flops_per_s": 1e14, "alpha": 1e-5, "beta": 1e11}}
    r = Rates.load(ref)
    assert r.compute(2e14) == 2.0 and r.message(1e11) == pytest.approx(1 + 1e-5)
    assert "NVIDIA X" in r.source and "reference" in r.source
    assert Rates.load({"exists": True, "gpu": "g", "date": "d", "torch": "t"}) is ASSUMED_RATES
    assert Rates.load().source                       # the committed file: it says which


def test_waits_split_the_idle_time():
    boxes = [dict(start=0.0, end=1.0),
             dict(start=3.0, end=4.0, ready=2.5),      # 2 idle: 1.5 input, 0.5 delay
             dict(start=4.5, end=5.0, ready=3.0)]      # 0.5 idle: input was there, delay
    got = waits(boxes)
    assert got == pytest.approx(dict(idle=2.5, input=1.5, delay=1.0))


def test_eight_emulated_ranks_keep_a_chain_shape_on_few_cores():
    """8 thread-ranks in a chain (rank r starts when r-1 is done): the chain takes 8 boxes of
    time, as on 8 devices, though the ranks share this machine's cores."""
    n, box = 8, 0.03
    done = [threading.Event() for _ in range(n)]
    clocks = [Clock(emulate=True) for _ in range(n)]

    def rank(r):
        if r:
            done[r - 1].wait(5)
        with clocks[r].box("F", box):
            sum(range(2000))
        done[r].set()
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    span = clocks[-1].boxes[0]["end"] - clocks[0].boxes[0]["start"]
    assert n * box <= span < n * box * 1.3


def test_the_clock_reads_the_rank_clock_of_its_device(monkeypatch):
    """One clock: Clock reads helpers.devices' rank clock for its device (current stream only),
    and emulate.py keeps no time source of its own."""
    import inspect

    from helpers.runtime import emulate
    seen = []
    monkeypatch.setattr(emulate, "rank_clock",
                        lambda d=(), stream_only=False: seen.append((d, stream_only)) or
                        (lambda: 1.0))
    clock = Clock(device="cuda:3")
    assert clock.mark("m") == 1.0 and seen == [("cuda:3", True)]
    src = inspect.getsource(emulate)
    assert "perf_counter" not in src and "time.sleep" not in src
