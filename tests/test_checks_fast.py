"""The Part IV exercise checks: reference answers pass, stubs are 'not done', wrong answers fail."""
import statistics
import time

import torch

import helpers
from helpers.checks import (check_amdahl_speedup, check_bucket_allreduce, check_crossover_bytes,
                            check_predicted_speedup,
                            check_fit_latency_bandwidth, check_ring_allreduce,
                            check_ring_allreduce_seconds, check_time_it, check_time_shares)


def stub(*args, **kwargs):
    raise NotImplementedError()


def assert_status(result, status, message=None):
    assert result.status == status, result
    if message:
        assert message in result.message, result.message


# --- reference answers (the notebooks' solutions) ---------------------------------------------

def time_it(fn, devices, reps=5):
    times = []
    for _ in range(reps):
        helpers.synchronize(devices)
        t0 = time.perf_counter()
        fn()
        helpers.synchronize(devices)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_shares(seconds):
    total = sum(seconds.values())
    return {k: v / total for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}


def amdahl_speedup(shares, factors):
    return 1 / sum(s / factors.get(n, 1.0) for n, s in shares.items())


def predicted_speedup(compute_s, comm_s, k):
    return 1.0 if k == 1 else compute_s / (compute_s / k + comm_s)


def ring_seconds(n_bytes, k, alpha, beta):
    return helpers.allreduce_time(n_bytes, k, alpha, beta)


# --- tests ------------------------------------------------------------------------------------

def test_time_it():
    assert_status(check_time_it(time_it), "passed")
    assert_status(check_time_it(stub), "not done")

    def total_not_median(fn, devices, reps=5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return time.perf_counter() - t0
    assert_status(check_time_it(total_not_median), "failed", "median")
    assert_status(check_time_it(lambda fn, d, r: time_it(fn, d, r) * 1e3), "failed", "seconds")

    def mean_not_median(fn, devices, reps=5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps
    assert_status(check_time_it(mean_not_median), "failed", "median")


def test_time_it_does_not_depend_on_the_machine_being_idle(monkeypatch):
    """On a loaded grading server sleeps overrun: the check compares the answer with the calls'
    real durations, so a right answer still passes when every sleep takes 3x longer."""
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: real_sleep(3 * s))
    assert_status(check_time_it(time_it), "passed")


def test_time_shares():
    assert_status(check_time_shares(time_shares), "passed")
    assert_status(check_time_shares(stub), "not done")
    assert_status(check_time_shares(lambda s: {k: v / sum(s.values()) for k, v in s.items()}),
                  "failed", "largest share first")
    assert_status(check_time_shares(lambda s: dict(sorted(s.items(), key=lambda kv: -kv[1]))),
                  "failed", "share of")


def test_predicted_speedup():
    assert_status(check_predicted_speedup(predicted_speedup), "passed")
    assert_status(check_predicted_speedup(stub), "not done")
    assert_status(check_predicted_speedup(lambda c, m, k: float(k)), "failed", "ideal k")
    assert_status(check_predicted_speedup(lambda c, m, k: c / (c + m)), "failed",
                  "never splits the compute")
    assert_status(check_predicted_speedup(lambda c, m, k: c / (c / k + k * m)), "failed",
                  "expected")


def test_bucket_allreduce():
    assert_status(check_bucket_allreduce(helpers.bucketed_allreduce), "passed")
    assert_status(check_bucket_allreduce(stub), "not done")

    def rebinding(grads, bucket_bytes):
        for i in range(len(grads[0])):
            s = sum(g[i] for g in grads)
            for g in grads:
                g[i] = s.clone()
    assert_status(check_bucket_allreduce(rebinding), "failed", "INTO the given tensors")

    def first_only(grads, bucket_bytes):
        helpers.flat_allreduce([g[:1] for g in grads])
    assert_status(check_bucket_allreduce(first_only), "failed", "does not hold the sum")


def test_ring_allreduce():
    assert_status(check_ring_allreduce(helpers.ring_allreduce), "passed")
    assert_status(check_ring_allreduce(stub), "not done")

    def naive(data):
        helpers.allreduce(data)
        return [2 * d.numel() for d in data]
    assert_status(check_ring_allreduce(naive), "failed", "2(k-1)n")

    def no_allgather(data):
        k = len(data)
        chunks = [list(t.view(-1).tensor_split(k)) for t in data]
        for s in range(k - 1):
            for i in range(k):
                c, dst = (i - s) % k, (i + 1) % k
                chunks[dst][c].add_(chunks[i][c])
        return [2 * (k - 1) * c[0].numel() for c in chunks]
    assert_status(check_ring_allreduce(no_allgather), "failed", "does not hold the sum")


def test_amdahl_speedup():
    assert_status(check_amdahl_speedup(amdahl_speedup), "passed")
    assert_status(check_amdahl_speedup(stub), "not done")
    assert_status(check_amdahl_speedup(lambda sh, f: sum(f.values()) or 1.0), "failed",
                  "speed-up")
    # the shares-weighted mean of the factors: speeds averaged instead of times
    assert_status(check_amdahl_speedup(lambda sh, f: sum(s * f.get(n, 1.0) for n, s in sh.items())),
                  "failed", "sum of share / factor")


def test_fit_latency_bandwidth():
    assert_status(check_fit_latency_bandwidth(helpers.fit_alpha_beta), "passed")
    assert_status(check_fit_latency_bandwidth(stub), "not done")

    def slope_not_bandwidth(n, t):
        a, b = helpers.fit_alpha_beta(n, t)
        return a, 1 / b
    assert_status(check_fit_latency_bandwidth(slope_not_bandwidth), "failed", "beta")

    def no_latency(n, t):   # bandwidth only: total bytes over total time, no intercept
        return 0.0, sum(n) / sum(t)
    assert_status(check_fit_latency_bandwidth(no_latency), "failed", "alpha")


def test_ring_allreduce_seconds():
    assert_status(check_ring_allreduce_seconds(ring_seconds), "passed")
    assert_status(check_ring_allreduce_seconds(stub), "not done")
    assert_status(check_ring_allreduce_seconds(
        lambda n, k, a, b: helpers.allreduce_time(n, k, a, b, "naive")), "failed", "expected")
    assert_status(check_ring_allreduce_seconds(
        lambda n, k, a, b: 2 * (k - 1) * a + n / b), "failed", "expected")


def test_crossover_bytes():
    assert_status(check_crossover_bytes(lambda a, b: a * b), "passed")
    assert_status(check_crossover_bytes(stub), "not done")
    assert_status(check_crossover_bytes(lambda a, b: a / b), "failed", "bytes")
    assert_status(check_crossover_bytes(lambda a, b: b / a), "failed", "bytes")


def test_checks_are_exported():
    for name in helpers.checks.fast.__all__:
        assert getattr(helpers.checks, name) is getattr(helpers.checks.fast, name)
    assert torch.__version__
