"""The answer does not choose its own tolerance: a check compares a number within the rounding of
the computation it expects (inputs.py), and a number returned in half precision (a bfloat16 or
float16 tensor, numpy's float16), whose rounding would widen that to percents and pass a wrong
formula, is refused naming the fix; a float32 result, right, still passes (tests/check_cases.py's
form). Each wrong answer below is off by a percent or so, the right formula times (1 + ERR)."""
import re

import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut

import helpers.checks
from helpers.checks._core import as_number
from helpers.checks._core.inputs import replay_seeds

HALF = ["significant bits", "Return a Python float"]


def _bf16(x, err):
    return torch.tensor(x * (1 + err), dtype=torch.bfloat16)


@shortcut("check_dp_step_seconds", "the backward as 70 % of the compute, in bfloat16", HALF)
def dp_step_seconds_bf16(compute_s, k, comm_s):
    back = 0.7 * compute_s / k                     # the backward is 2/3 of the compute
    return torch.tensor(compute_s / k + max(0.0, comm_s - back), dtype=torch.bfloat16)


@other("check_dp_step_seconds", "a float32 tensor")
def dp_step_seconds_float32(compute_s, k, comm_s):
    back = 2 / 3 * compute_s / k
    return torch.tensor(compute_s / k + max(0.0, comm_s - back), dtype=torch.float32)


@shortcut("check_gpipe_time", "1.5 % off, in bfloat16", HALF)
def gpipe_time_bf16(t, p, m):
    return _bf16((m + p - 1) * t / m, 0.015)


@other("check_gpipe_time", "a float32 tensor")
def gpipe_time_float32(t, p, m):
    return torch.tensor(t, dtype=torch.float32) * (m + p - 1) / m


@shortcut("check_ring_allreduce_seconds", "3 % off, in bfloat16", HALF)
def ring_allreduce_seconds_bf16(n, k, alpha, beta):
    return _bf16(2 * (k - 1) * alpha + 2 * (k - 1) / k * n / beta, 0.03)


@shortcut("check_predicted_speedup", "2 % off, in bfloat16", HALF)
def predicted_speedup_bf16(compute, comm, k):
    return _bf16(1.0 if k == 1 else compute / (compute / k + comm), 0.02)


@shortcut("check_copy_time", "2 % off, in bfloat16", HALF)
def copy_time_bf16(num_bytes, bandwidth_gbs, latency_s):
    return _bf16(latency_s + num_bytes / (bandwidth_gbs * 1e9), 0.02)


@shortcut("check_dp_step_seconds", "0.5 % off, in numpy's float16", HALF)
def dp_step_seconds_float16(compute_s, k, comm_s):
    return np.float16((compute_s / k + max(0.0, comm_s - 2 / 3 * compute_s / k)) * 1.005)


@shortcut("check_crossover_bytes", "1 % off, in bfloat16", HALF)
def crossover_bytes_bf16(alpha, beta):
    return _bf16(alpha * beta, 0.01)


@other("check_ring_allreduce_seconds", "the ring's 2(k-1) steps added one by one")
def ring_allreduce_seconds_by_steps(n, k, alpha, beta):
    return sum(alpha + (n / k) / beta for _ in range(2 * (k - 1)))


@other("check_gpipe_time", "the m + p - 1 ticks added one by one")
def gpipe_time_by_ticks(t, p, m):
    return sum(t / m for _ in range(m + p - 1))


def test_sums_step_by_step_pass_on_every_draw():
    """A sum of one term per step rounds once per term: its tolerance grows with the steps
    (a ring of 64 devices sums 126), on every replayed draw."""
    for seed in range(8):
        replay_seeds(seed)
        for fn, check in ((ring_allreduce_seconds_by_steps, "check_ring_allreduce_seconds"),
                          (gpipe_time_by_ticks, "check_gpipe_time")):
            result = getattr(helpers.checks, check)(fn)
            assert result.status == "passed", (seed, result)


def test_a_number_just_outside_the_rounding_is_shown_with_digits_that_differ():
    def off(n, k, alpha, beta):
        return (2 * (k - 1) * alpha + 2 * (k - 1) / k * n / beta) * (1 + 1e-12 * k)
    result = helpers.checks.check_ring_allreduce_seconds(off)
    assert result.status == "failed", result
    got, want = re.search(r"returned (\S+) s, expected (\S+)", result.message).groups()
    assert got != want, result.message


def test_a_float_named_float32_keeps_float64s_tolerance():
    """Only numpy's and torch's own float32 widen the tolerance: a class of the reader's that
    calls itself float32 is a Python float."""
    class float32(float):                   # the name is the point
        pass
    assert as_number(float32(0.5), "f", with_dtype=True) == (0.5, torch.float64)
    assert as_number(np.float32(0.5), "f", with_dtype=True) == (0.5, torch.float32)


test_case = parametrize_cases(__name__)
