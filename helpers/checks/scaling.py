"""Checks for the exercises of Part IV's scaling chapter (the alpha-beta model).

A fit is judged by the residuals its line leaves on fresh noisy measurements (an outlier among
them), against the least-squares line of all the points; formulas on fresh inputs, numbers of
any real type, tolerances from float rounding. The course's own fit and cost model are
unavailable while the answer runs.
"""
import math

import torch

from ._core import (
    as_number,
    as_pair,
    check,
    expect,
    fresh_generator,
    number_words,
    randint,
    same_number,
    uniform,
)

__all__ = ["check_fit_latency_bandwidth", "check_ring_allreduce_seconds",
           "check_crossover_bytes"]


def _line(n, t, weights):
    """The weighted least-squares line t = a + s n (float64, centred, so no rounding worth the
    name): (a, s)."""
    w = torch.tensor(weights, dtype=torch.float64) ** 2
    x, y = torch.tensor(n, dtype=torch.float64), torch.tensor(t, dtype=torch.float64)
    xm, ym = (w * x).sum() / w.sum(), (w * y).sum() / w.sum()
    s = (w * (x - xm) * (y - ym)).sum() / (w * (x - xm) ** 2).sum()
    return float(ym - s * xm), float(s)


def _squares(n, t, weights, a, s):
    return math.fsum(((a + s * x - y) * w) ** 2 for x, y, w in zip(n, t, weights, strict=True))


@check("fit_latency_bandwidth", references=["fit_alpha_beta"], observes=[
    "the (alpha, beta) returned for fresh noisy measurements over message sizes of 256 B to "
    "16 MiB (the smallest an outlier): the squared residuals its line t = alpha + n/beta leaves "
    "over all the points, against those of the least-squares line (plain, or relative to t)"])
def check_fit_latency_bandwidth(fit):
    """fit(n_bytes, seconds) -> (alpha, beta) of the least-squares line t = alpha + n / beta."""
    g = fresh_generator()
    for _ in range(3):
        alpha, beta = uniform(g, 1e-6, 1e-4), uniform(g, 1e8, 1e11)
        step = randint(g, 1, 2)
        n = [2 ** e for e in range(8, 25, step)]
        noise = torch.randn(len(n), generator=g, dtype=torch.float64).tolist()
        t = [(alpha + x / beta) * (1 + 0.05 * z) for x, z in zip(n, noise, strict=True)]
        t[0] *= 1.5 + uniform(g, 0, 0.5)          # the first, cold measurement: an outlier
        call = f"fit_latency_bandwidth(n_bytes, seconds) ({len(n)} sizes)"
        a, b = as_pair(fit(list(n), list(t)), call, "alpha, beta")
        expect(b > 0, f"{call} returned beta = {b:g}: a bandwidth is positive (bytes per "
                      "second, the inverse of the slope)")
        ok = []
        for weights in ([1.0] * len(n), [1 / y for y in t]):     # plain, relative
            best = _squares(n, t, weights, *_line(n, t, weights))
            mine = _squares(n, t, weights, a, 1 / b)
            ok.append(mine <= best * (1 + 1e-6))
        if any(ok):
            continue
        ones = [1.0] * len(n)
        best_a, best_s = _line(n, t, ones)
        ratio = _squares(n, t, ones, a, 1 / b) / _squares(n, t, ones, best_a, best_s)
        hint = ""
        two_s = (t[-1] - t[0]) / (n[-1] - n[0])
        if math.isclose(1 / b, two_s, rel_tol=1e-6) or math.isclose(b, two_s, rel_tol=1e-6):
            hint = (": that is the line through the first and last point; the least-squares "
                    "line weighs every point")
        elif math.isclose(b, best_s, rel_tol=1e-3) or math.isclose(b, _line(
                n, t, [1 / y for y in t])[1], rel_tol=1e-3):
            hint = ": beta is a bandwidth, bytes per second: the inverse of the slope"
        elif a == 0:
            hint = ": the line has an intercept, alpha (the latency of a message)"
        elif abs(a) < 1e-3 * abs(best_a):
            hint = (": alpha came out about 0, as it does in float32, where the latency is "
                    "lost against sizes up to 16 MiB; compute in float64")
        expect(False, f"{call} returned alpha = {a:.4g} s, beta = {b:.4g} B/s: that line leaves "
                      f"{ratio:.3g} times the squared residuals of the least-squares line "
                      f"(alpha = {best_a:.4g} s, beta = {1 / best_s:.4g} B/s) over the "
                      f"{len(n)} points{hint}; fit all the points (torch.linalg.lstsq, "
                      "numpy.polyfit)")


@check("ring_allreduce_seconds", references=["allreduce_time", "ring_bytes_per_device"],
       observes=["the seconds returned for fresh (n bytes, k, alpha, beta) and for one device, "
                 "against 2(k-1) alpha + 2(k-1)/k n / beta, to float rounding"])
def check_ring_allreduce_seconds(seconds):
    """seconds(n_bytes, k, alpha, beta) of a ring allreduce (0 for one device)."""
    g = fresh_generator()
    cases = [(randint(g, 1, 10**9), randint(g, 2, 64), uniform(g, 1e-6, 1e-4),
              uniform(g, 1e9, 1e11)) for _ in range(5)]
    cases.append((randint(g, 1, 10**9), 1, uniform(g, 1e-6, 1e-4), uniform(g, 1e9, 1e11)))
    for n, k, alpha, beta in cases:
        call = f"ring_allreduce_time({n}, {k}, {alpha:.3g}, {beta:.3g})"
        got, dtype = as_number(seconds(n, k, alpha, beta), call, with_dtype=True)
        want = 0.0 if k == 1 else 2 * (k - 1) * alpha + 2 * (k - 1) / k * n / beta
        steps = 2 * (k - 1) + 4     # the ring's 2(k-1) steps summed one by one, or the formula
        if same_number(got, want, dtype, steps):
            continue
        hint = ""
        if k == 1:
            hint = ": one device has nothing to reduce"
        elif same_number(got, 2 * (k - 1) * (alpha + n / beta), dtype, steps):
            hint = (": that is the naive allreduce, whole copies through one device; a ring's "
                    "2(k-1) steps move n/k bytes each")
        elif same_number(got, 2 * (k - 1) * alpha + n / beta, dtype, steps):
            hint = ": each device sends 2(k-1)/k of the n bytes, not n"
        elif same_number(got, (k - 1) * alpha + (k - 1) / k * n / beta, dtype, steps):
            hint = ": count both phases, the reduce-scatter and the all-gather"
        got_s, want_s = number_words(got, want, dtype)
        expect(False, f"{call} returned {got_s} s, expected {want_s}{hint}")


@check("crossover_bytes", observes=[
    "the size returned for fresh (alpha, beta), against the n where n / beta = alpha, to "
    "float rounding"])
def check_crossover_bytes(crossover):
    """crossover(alpha, beta) -> the message size where latency and transfer time are equal."""
    g = fresh_generator()
    for _ in range(4):
        alpha, beta = uniform(g, 1e-6, 1e-4), uniform(g, 1e8, 1e11)
        call = f"crossover_bytes({alpha:.4g}, {beta:.4g})"
        got, dtype = as_number(crossover(alpha, beta), call, with_dtype=True)
        hint = ""
        if same_number(got, alpha / beta, dtype, 4) or same_number(got, beta / alpha, dtype, 4):
            hint = ": the transfer time of n bytes is n / beta; set it equal to alpha"
        got_s, want_s = number_words(got, alpha * beta, dtype, unit=" bytes")
        expect(same_number(got, alpha * beta, dtype, 4),
               f"{call} returned {got_s}, expected {want_s} (the size n where "
               f"n / beta = alpha){hint}")
