"""Checks for the exercises of Part IV (profile, fixes, scaling)."""
import math
import statistics
import time

import torch

from ._core import expect, fresh_generator, run_check

__all__ = ["check_time_it", "check_time_shares", "check_predicted_speedup",
           "check_bucket_allreduce", "check_ring_allreduce", "check_amdahl_speedup",
           "check_fit_latency_bandwidth",
           "check_ring_allreduce_seconds", "check_crossover_bytes"]


def _close(a, b, rel=1e-6, abs_=1e-12):
    return a is not None and math.isclose(float(a), float(b), rel_tol=rel, abs_tol=abs_)


# --- profile.ipynb ----------------------------------------------------------------------------

def check_time_it(time_it):
    """time_it(fn, devices, reps) -> median seconds of one call of fn (synchronised).

    Robust on a loaded machine: the check times every call of fn itself and compares the answer
    with the median of the durations that really happened, not with the sleep it asked for. One
    call is much longer than the others, so the median, the mean and the total are far apart."""
    def body():
        g = fresh_generator()
        reps = int(torch.randint(3, 6, (1,), generator=g))
        slow = int(torch.randint(0, reps, (1,), generator=g))   # which call is the slow one
        durations = []

        def fn():
            i = len(durations)
            t0 = time.perf_counter()
            time.sleep(0.06 if i == slow else 0.005)
            durations.append(time.perf_counter() - t0)
        t = time_it(fn, [torch.device("cpu")], reps)
        expect(isinstance(t, float), f"return a float (seconds), got {type(t).__name__}")
        expect(len(durations) >= reps,
               f"fn ran {len(durations)} times, expected at least reps={reps}")
        med, mean = statistics.median(durations), statistics.fmean(durations)
        total = sum(durations)
        expect(not _close(t, 1e3 * med, 0.5),
               f"time_it says {t:g}: that looks like milliseconds; return seconds")
        expect(not _close(t, total, 0.2) or _close(total, med, 0.2),
               f"time_it says {t * 1e3:.1f} ms, the total of all {len(durations)} calls "
               f"({total * 1e3:.1f} ms); return the median of per-call times")
        expect(abs(t - med) < abs(t - mean) and t >= 0.9 * min(durations),
               f"time_it says {t * 1e3:.1f} ms, but the calls took {med * 1e3:.1f} ms (median) "
               f"and {mean * 1e3:.1f} ms (mean; one call is slow): return the median of "
               "per-call times, in seconds")
    return run_check("time_it", body)


def check_time_shares(time_shares):
    """time_shares(seconds: dict) -> dict name -> fraction of the total, largest first."""
    def body():
        g = fresh_generator()
        names = ["data", "copy", "forward", "backward", "allreduce", "sgd"]
        vals = (torch.rand(len(names), generator=g) + 0.01).tolist()
        secs = dict(zip(names, vals))
        out = time_shares(secs)
        expect(isinstance(out, dict), f"return a dict, got {type(out).__name__}")
        expect(set(out) == set(names), f"keys {sorted(out)} differ from {sorted(names)}")
        total = sum(vals)
        for k, v in secs.items():
            expect(_close(out[k], v / total, 1e-6), f"share of {k!r} is {out[k]}, expected "
                   f"{v / total:.4f}")
        expect(list(out) == sorted(secs, key=secs.get, reverse=True),
               "order the keys largest share first")
    return run_check("time_shares", body)


def check_predicted_speedup(predicted_speedup):
    """predicted_speedup(compute_s, comm_s, k) -> speed-up of k workers over one, when one
    worker's step is compute_s of compute, k workers split it evenly, and each of their steps
    adds comm_s of all-reduce (one worker has nothing to reduce)."""
    def body():
        g = fresh_generator()
        for _ in range(6):
            compute = float(torch.rand(1, generator=g)) * 0.1 + 1e-3
            comm = float(torch.rand(1, generator=g)) * 0.05 + 1e-4
            k = int(torch.randint(2, 9, (1,), generator=g))
            want = compute / (compute / k + comm)
            got = predicted_speedup(compute, comm, k)
            expect(got is not None and not isinstance(got, bool),
                   f"return a number, got {got!r}")
            expect(not _close(got, k, 1e-3),
                   f"k={k}: {got:.3g} is the ideal k: every worker also pays the all-reduce "
                   f"({comm * 1e3:.2f} ms a step)")
            expect(not _close(got, compute / (compute + comm), 1e-3),
                   f"k={k}: {got:.3g} charges the all-reduce but never splits the compute: "
                   "each worker computes 1/k of the batch")
            expect(_close(got, want, 1e-6),
                   f"compute {compute * 1e3:.2f} ms, all-reduce {comm * 1e3:.2f} ms, k={k}: "
                   f"speed-up {got:.4g}, expected {want:.4g} (one worker's step over a "
                   "k-worker step)")
        expect(_close(predicted_speedup(0.05, 0.01, 1), 1.0),
               "one worker does not communicate: its speed-up over itself is 1")
        slow = predicted_speedup(0.002, 0.01, 2)
        expect(slow < 1, f"an all-reduce longer than the step: {slow:.3g} should be below 1 "
               "(two workers lose)")
    return run_check("predicted_speedup", body)


# --- fixes.ipynb ------------------------------------------------------------------------------

def _naive_sum(data):
    return sum(d.detach().clone() for d in data)


def check_bucket_allreduce(bucket_allreduce):
    """bucket_allreduce(grads, bucket_bytes): grads[c] = list of tensors of replica c, in place."""
    def body():
        g = fresh_generator()
        for k in (1, 2, 3):
            shapes = [tuple(int(s) for s in torch.randint(1, 30, (int(torch.randint(1, 3, (1,),
                      generator=g)),), generator=g)) for _ in range(int(torch.randint(3, 7, (1,),
                                                                                 generator=g)))]
            grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(k)]
            objs = [list(x) for x in grads]
            sums = [_naive_sum([grads[c][i] for c in range(k)]) for i in range(len(shapes))]
            bucket_allreduce(grads, int(torch.randint(40, 400, (1,), generator=g)))
            for c in range(k):
                for i in range(len(shapes)):
                    expect(grads[c][i] is objs[c][i],
                           "replace no list item: write the sums INTO the given tensors")
                    expect(grads[c][i].shape == sums[i].shape,
                           f"replica {c}, tensor {i} has shape {tuple(grads[c][i].shape)}, "
                           f"expected {tuple(sums[i].shape)}")
                    expect(torch.allclose(grads[c][i], sums[i], atol=1e-5),
                           f"replica {c}, tensor {i} (k={k}) does not hold the sum over replicas")
    return run_check("bucket_allreduce", body)


def check_ring_allreduce(ring_allreduce):
    """ring_allreduce(data) in place; returns the elements each device sent."""
    def body():
        g = fresh_generator()
        for k in (1, 2, 3, 4, 5):
            n = int(torch.randint(k, 60, (1,), generator=g)) * 7 + 1
            data = [torch.randint(-9, 9, (n,), generator=g).float() for _ in range(k)]
            total, ptrs = _naive_sum(data), [d.data_ptr() for d in data]
            sent = ring_allreduce(data)
            expect([d.data_ptr() for d in data] == ptrs, "work in place on the given tensors")
            for i, d in enumerate(data):
                expect(torch.equal(d, total), f"k={k}, n={n}: device {i} does not hold the sum")
            expect(sent is not None and len(sent) == k,
                   f"return one count per device ({k}), got {sent!r}")
            expect(sum(sent) == 2 * (k - 1) * n,
                   f"k={k}, n={n}: the devices sent {sum(sent)} elements in all, a ring sends "
                   f"2(k-1)n = {2 * (k - 1) * n}")
            expect(max(sent) <= 2 * (k - 1) * math.ceil(n / k),
                   f"k={k}: device {sent.index(max(sent))} sent {max(sent)} elements: each "
                   "step must pass one chunk of about n/k, not the whole tensor")
    return run_check("ring_allreduce", body)


def check_amdahl_speedup(amdahl_speedup):
    """amdahl_speedup(shares, factors) -> overall speed-up when phase i (share of the time
    shares[i]) becomes factors[i] times faster (phases not in factors unchanged)."""
    def body():
        g = fresh_generator()
        names = ["data", "copy", "compute", "allreduce"]
        w = torch.rand(4, generator=g) + 0.05
        shares = dict(zip(names, (w / w.sum()).tolist()))
        picked = names[:int(torch.randint(1, 4, (1,), generator=g))]
        factors = {n: float(torch.randint(2, 20, (1,), generator=g)) for n in picked}
        expected = 1 / sum(s / factors.get(n, 1.0) for n, s in shares.items())
        got = amdahl_speedup(shares, factors)
        expect(_close(got, expected, 1e-6), f"speed-up {got}, expected {expected:.4f} "
               "(the time left is the sum of share / factor)")
        expect(_close(amdahl_speedup(shares, {}), 1.0), "no fix, no speed-up: expected 1")
    return run_check("amdahl_speedup", body)


# --- scaling.ipynb ----------------------------------------------------------------------------

def check_fit_latency_bandwidth(fit):
    """fit(n_bytes, seconds) -> (alpha, beta) of t = alpha + n / beta."""
    def body():
        g = fresh_generator()
        alpha = float(torch.rand(1, generator=g)) * 1e-4 + 1e-6
        beta = float(torch.rand(1, generator=g)) * 1e10 + 1e8
        n = (2.0 ** torch.arange(8, 24, 2)).tolist()
        t = [alpha + x / beta for x in n]
        a, b = fit(n, t)
        expect(_close(a, alpha, 1e-3, 1e-9), f"alpha {a}, expected {alpha:.3g} s")
        expect(_close(b, beta, 1e-3), f"beta {b}, expected {beta:.3g} bytes/s (beta is a "
               "bandwidth: bytes per second, the inverse of the slope)")
    return run_check("fit_latency_bandwidth", body)


def check_ring_allreduce_seconds(seconds):
    """seconds(n_bytes, k, alpha, beta) of a ring allreduce."""
    def body():
        g = fresh_generator()
        for _ in range(5):
            k = int(torch.randint(2, 65, (1,), generator=g))
            n = float(torch.randint(1, 10**9, (1,), generator=g))
            alpha, beta = float(torch.rand(1, generator=g)) * 1e-4, 1e9 * (1 + float(
                torch.rand(1, generator=g)) * 100)
            want = 2 * (k - 1) * alpha + 2 * (k - 1) / k * n / beta
            got = seconds(n, k, alpha, beta)
            expect(_close(got, want, 1e-6), f"k={k}, n={n:.0f} bytes: {got}, expected {want:.4g}")
        expect(_close(seconds(1e6, 1, 1e-5, 1e9), 0.0), "one device has nothing to reduce: 0 s")
    return run_check("ring_allreduce_seconds", body)


def check_crossover_bytes(crossover):
    """crossover(alpha, beta) -> the message size where latency and transfer time are equal."""
    def body():
        g = fresh_generator()
        alpha = float(torch.rand(1, generator=g)) * 1e-4 + 1e-6
        beta = float(torch.rand(1, generator=g)) * 1e11 + 1e8
        got = crossover(alpha, beta)
        expect(_close(got, alpha * beta, 1e-6), f"{got}, expected {alpha * beta:.4g} bytes "
               "(the size n where n / beta = alpha)")
    return run_check("crossover_bytes", body)
