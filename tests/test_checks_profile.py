"""The checks of Part IV's profiling chapter (helpers/checks/profile.py; check_time_it in
tests/test_checks_time_it.py): the notebook's worked answers pass, shortcuts of different kinds
fail naming what they skipped, other right answers pass (tests/check_cases.py); and Part IV's
check modules (profile.py, fixes.py, scaling.py) are the façade's."""
import numpy as np
from check_cases import other, parametrize_cases, shortcut, worked

import helpers.checks


# ---- profile: time_shares --------------------------------------------------------------------
@worked("check_time_shares")
def time_shares(seconds):
    total = sum(seconds.values())
    order = sorted(seconds.items(), key=lambda kv: -kv[1])
    return {k: v / total for k, v in order}


@other("check_time_shares", "numpy shares, keys sorted by value")
def time_shares_numpy(seconds):
    names = sorted(seconds, key=seconds.get, reverse=True)
    values = np.array([seconds[n] for n in names])
    return dict(zip(names, values / values.sum()))


@shortcut("check_time_shares", "not sorted", "largest share first")
def time_shares_unsorted(seconds):
    return {k: v / sum(seconds.values()) for k, v in seconds.items()}


@shortcut("check_time_shares", "seconds, not shares", "divide by the total")
def time_shares_seconds(seconds):
    return dict(sorted(seconds.items(), key=lambda kv: -kv[1]))


@shortcut("check_time_shares", "percentages", "percentage")
def time_shares_percent(seconds):
    return {k: 100 * v for k, v in time_shares(seconds).items()}


# ---- profile: predicted_speedup --------------------------------------------------------------
@worked("check_predicted_speedup")
def predicted_speedup(compute_s, comm_s, k):
    if k == 1:
        return 1.0
    return compute_s / (compute_s / k + comm_s)


@other("check_predicted_speedup", "k times the compute share, numpy")
def predicted_speedup_share(compute_s, comm_s, k):
    comm = 0.0 if k == 1 else comm_s
    return np.float64(k) * compute_s / (compute_s + k * comm)


@shortcut("check_predicted_speedup", "the ideal k", "ideal k")
def predicted_speedup_ideal(compute_s, comm_s, k):
    return float(k)


@shortcut("check_predicted_speedup", "compute not split", "never splits the compute")
def predicted_speedup_unsplit(compute_s, comm_s, k):
    return 1.0 if k == 1 else compute_s / (compute_s + comm_s)


@shortcut("check_predicted_speedup", "one worker communicates too", "over itself is 1")
def predicted_speedup_k1(compute_s, comm_s, k):
    return compute_s / (compute_s / k + comm_s)


test_case = parametrize_cases(__name__)


def test_checks_are_exported():
    for module in (helpers.checks.profile, helpers.checks.fixes, helpers.checks.scaling):
        for name in module.__all__:
            assert getattr(helpers.checks, name) is getattr(module, name)
