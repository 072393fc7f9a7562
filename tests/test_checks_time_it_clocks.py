"""check_time_it with a CPU-time clock read other than as `time.process_time`: a timer that
synchronises after every call but reads a clock blind to the wait is named as such
(`time.clock_gettime` of a CPU-time clock, a thread's from `time.pthread_getcpuclockid` included,
`os.times`, `resource.getrusage`), and one bound before the check (`from time import
process_time`), which the check cannot see, is told both causes; a wall-clock timer stopped before
the synchronise that reads a CPU-time clock only to log the loop's CPU time is told to
synchronise before stopping the clock, not blamed on the CPU clock, and so is one logging each
call's CPU time after the synchronise; os.times' elapsed time is named a coarse wall clock."""
import os
import resource
import statistics
import threading
import time
from time import process_time as bound_early

from check_cases import other, parametrize_cases, shortcut

from helpers import synchronize
from helpers.checks import check_time_it


def _timed(clock, fn, devices, reps):
    """The median of per-call times read on `clock`, the devices synchronised around each."""
    times = []
    for _ in range(reps):
        synchronize(devices)
        t0 = clock()
        fn()
        synchronize(devices)
        times.append(clock() - t0)
    return statistics.median(times)


@shortcut("check_time_it", "the process's CPU-time clock through clock_gettime",
          ["you synchronised after every call",
           "time.clock_gettime(CLOCK_PROCESS_CPUTIME_ID) counts the CPU time"])
def time_it_clock_gettime_cpu(fn, devices, reps=5):
    return _timed(lambda: time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID), fn, devices, reps)


@shortcut("check_time_it", "the thread's CPU-time clock through clock_gettime_ns",
          "time.clock_gettime_ns(CLOCK_THREAD_CPUTIME_ID) counts the CPU time")
def time_it_clock_gettime_thread(fn, devices, reps=5):
    return _timed(lambda: time.clock_gettime_ns(time.CLOCK_THREAD_CPUTIME_ID) / 1e9, fn,
                  devices, reps)


@shortcut("check_time_it", "the thread's CPU-time clock from pthread_getcpuclockid",
          "time.clock_gettime(time.pthread_getcpuclockid(...)) counts the CPU time")
def time_it_pthread_cpu_clock(fn, devices, reps=5):
    clock_id = time.pthread_getcpuclockid(threading.get_ident())
    return _timed(lambda: time.clock_gettime(clock_id), fn, devices, reps)


@shortcut("check_time_it", "clock stopped before the synchronise, the CPU time logged aside",
          "the clock stopped before the devices finished; synchronise before stopping")
def time_it_stopped_early_cpu_logged(fn, devices, reps=5):
    cpu, times = time.process_time(), []
    for _ in range(reps):
        synchronize(devices)
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        synchronize(devices)
        times.append(t1 - t0)
    time_it_stopped_early_cpu_logged.cpu = time.process_time() - cpu
    return statistics.median(times)


def _cpu_logged(fn, devices, reps, stop_early):
    """perf_counter's median, stopped before or after the synchronise, each call's CPU time
    logged after it (read last)."""
    times, cpu = [], []
    for _ in range(reps):
        synchronize(devices)
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        t1 = time.perf_counter()
        synchronize(devices)
        times.append((t1 if stop_early else time.perf_counter()) - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(times)


@shortcut("check_time_it", "clock stopped before the synchronise, each call's CPU time logged "
          "after it", "the clock stopped before the devices finished; synchronise before stopping")
def time_it_stopped_early_cpu_per_call(fn, devices, reps=5):
    return _cpu_logged(fn, devices, reps, stop_early=True)


@other("check_time_it", "perf_counter stopped after the synchronise, each call's CPU time logged")
def time_it_cpu_per_call_logged(fn, devices, reps=5):
    return _cpu_logged(fn, devices, reps, stop_early=False)


@shortcut("check_time_it", "os.times' user and system times",
          "os.times: its user and system times count the CPU time")
def time_it_os_times(fn, devices, reps=5):
    return _timed(lambda: sum(os.times()[:2]), fn, devices, reps)




@shortcut("check_time_it", "resource.getrusage's user and system times",
          "resource.getrusage counts the CPU time")
def time_it_rusage(fn, devices, reps=5):
    def clock():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    return _timed(clock, fn, devices, reps)


@shortcut("check_time_it", "time.process_time bound before the check (unseen)",
          ["use a wall clock (time.perf_counter)", "a CPU-time clock does not count the wait"])
def time_it_process_time_bound_early(fn, devices, reps=5):
    return _timed(bound_early, fn, devices, reps)


def test_time_it_puts_the_clocks_back():
    saved = (time.clock_gettime, time.clock_gettime_ns, time.pthread_getcpuclockid, os.times,
             resource.getrusage)
    check_time_it(time_it_os_times)
    assert (time.clock_gettime, time.clock_gettime_ns, time.pthread_getcpuclockid, os.times,
            resource.getrusage) == saved


def test_os_times_elapsed_is_named_a_coarse_wall_clock_not_cpu_time():
    result = check_time_it(lambda fn, devices, reps=5: _timed(lambda: os.times().elapsed, fn,
                                                               devices, reps))
    # 10 ms ticks: 0 or a tick per call, so near the calls' median only by chance
    assert result.status == "passed" or "ticks every" in result.message, result.message
    assert "os.times counts the CPU time" not in result.message, result.message


test_case = parametrize_cases(__name__)
