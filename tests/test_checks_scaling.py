"""The checks of Part IV's scaling chapter (helpers/checks/scaling.py): the notebook's worked
answers pass, shortcuts of different kinds fail naming what they skipped, other right answers
pass (tests/check_cases.py)."""
import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut, worked

import helpers


# ---- scaling: fit_latency_bandwidth ----------------------------------------------------------
@worked("check_fit_latency_bandwidth")
def fit_latency_bandwidth(n_bytes, seconds):
    A = torch.tensor([[1.0, float(n)] for n in n_bytes], dtype=torch.float64)
    t = torch.tensor(seconds, dtype=torch.float64).unsqueeze(1)
    alpha, slope = torch.linalg.lstsq(A, t).solution.squeeze(1).tolist()
    return alpha, 1 / slope


@other("check_fit_latency_bandwidth", "numpy.polyfit, numpy numbers")
def fit_polyfit(n_bytes, seconds):
    slope, alpha = np.polyfit(np.asarray(n_bytes, dtype=float), seconds, 1)
    return alpha, 1 / slope


@other("check_fit_latency_bandwidth", "relative residuals, as the course's fit")
def fit_relative(n_bytes, seconds):
    t = torch.tensor(seconds, dtype=torch.float64)
    A = torch.stack([torch.ones_like(t), torch.tensor(n_bytes, dtype=torch.float64)], 1)
    sol = torch.linalg.lstsq(A / t[:, None], torch.ones_like(t)[:, None]).solution
    alpha, slope = sol.squeeze(1).tolist()
    return alpha, 1 / slope


@shortcut("check_fit_latency_bandwidth", "a line through the first and last point",
          "through the first and last point")
def fit_two_points(n_bytes, seconds):
    slope = (seconds[-1] - seconds[0]) / (n_bytes[-1] - n_bytes[0])
    return seconds[0] - slope * n_bytes[0], 1 / slope


@shortcut("check_fit_latency_bandwidth", "the slope, not the bandwidth", "inverse of the slope")
def fit_slope(n_bytes, seconds):
    alpha, beta = fit_latency_bandwidth(n_bytes, seconds)
    return alpha, 1 / beta


@shortcut("check_fit_latency_bandwidth", "no latency", "intercept")
def fit_no_latency(n_bytes, seconds):
    return 0.0, sum(n_bytes) / sum(seconds)


@shortcut("check_fit_latency_bandwidth", "the reference", "course's own answer")
def fit_reference(n_bytes, seconds):
    return helpers.fit_alpha_beta(n_bytes, seconds)


# ---- scaling: ring_allreduce_seconds ---------------------------------------------------------
@worked("check_ring_allreduce_seconds")
def ring_allreduce_time(n_bytes, k, alpha, beta):
    if k <= 1:
        return 0.0
    return 2 * (k - 1) * alpha + 2 * (k - 1) / k * n_bytes / beta


@other("check_ring_allreduce_seconds", "per step, numpy")
def ring_allreduce_time_steps(n_bytes, k, alpha, beta):
    steps = np.float64(2 * (k - 1))
    return steps * (alpha + n_bytes / k / beta)


@shortcut("check_ring_allreduce_seconds", "the naive allreduce", "naive allreduce")
def ring_allreduce_time_naive(n_bytes, k, alpha, beta):
    return 2 * (k - 1) * (alpha + n_bytes / beta)


@shortcut("check_ring_allreduce_seconds", "the whole tensor per device", "2(k-1)/k of the n")
def ring_allreduce_time_whole(n_bytes, k, alpha, beta):
    return 2 * (k - 1) * alpha + (n_bytes / beta if k > 1 else 0.0)


@shortcut("check_ring_allreduce_seconds", "one phase only", "both phases")
def ring_allreduce_time_half(n_bytes, k, alpha, beta):
    return (k - 1) * alpha + (k - 1) / k * n_bytes / beta


@shortcut("check_ring_allreduce_seconds", "the reference", "course's own answer")
def ring_allreduce_time_reference(n_bytes, k, alpha, beta):
    return helpers.allreduce_time(n_bytes, k, alpha, beta)


@shortcut("check_ring_allreduce_seconds", "the course's byte count", "course's own answer")
def ring_allreduce_time_bytes(n_bytes, k, alpha, beta):
    return 2 * (k - 1) * alpha + helpers.ring_bytes_per_device(n_bytes, k) / beta


# ---- scaling: crossover_bytes ----------------------------------------------------------------
@worked("check_crossover_bytes")
def crossover_bytes(alpha, beta):
    return alpha * beta


@other("check_crossover_bytes", "alpha over the time of a byte, a 0-d tensor")
def crossover_bytes_tensor(alpha, beta):
    return torch.tensor(alpha, dtype=torch.float64) / (1 / torch.tensor(beta,
                                                                        dtype=torch.float64))


@shortcut("check_crossover_bytes", "alpha / beta", "set it equal to alpha")
def crossover_bytes_ratio(alpha, beta):
    return alpha / beta


@shortcut("check_crossover_bytes", "beta / alpha", "n / beta")
def crossover_bytes_inverse(alpha, beta):
    return beta / alpha


test_case = parametrize_cases(__name__)
