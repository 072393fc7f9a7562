"""A byte or time formula computed with `//` (or int()) fails every run, not only when a drawn
power of two leaves a fraction to drop, and its rejection says to divide with `/` (not only
"compute in float64": the answer already used Python numbers)."""
import pytest
import torch
from check_cases import CASES, parametrize_cases, shortcut

from helpers.checks._core import rounding_note
from helpers.checks._core.inputs import replay_seeds

FLOORED = "// or int()"


@shortcut("check_activation_bytes", "// everywhere: Korthikanti's 5 a s / h floored", "expected")
def activation_floored(width, heads, seq, tp, sp, recompute):
    h, a, s, t = width, heads, seq, tp
    if recompute == "full":
        return 2 * h // (t if sp else 1)
    attn = 0 if recompute == "selective" else 5 * a * s // h
    return h * (34 + attn) // t if sp else h * 10 + h * (24 + attn) // t


@shortcut("check_activation_bytes", "int() of the attention term", "expected")
def activation_int(width, heads, seq, tp, sp, recompute):
    h, a, s, t = width, heads, seq, tp
    if recompute == "full":
        return 2 * h / (t if sp else 1)
    attn = 0 if recompute == "selective" else int(5 * a * s / h)
    return h * (34 + attn) / t if sp else h * 10 + h * (24 + attn) / t


@shortcut("check_tp_bytes_per_step", "(tp - 1) / tp floored", "expected")
def tp_bytes_floored(blocks, m, tokens, width, tp, dtype_bytes):
    return 4 * blocks * m * (2 * (tp - 1) * tokens * width * dtype_bytes // tp)


@shortcut("check_accumulation_bytes", "one reduce-scatter's bytes floored", FLOORED)
def accumulation_floored(n_params, k, m, acc, dtype_bytes):
    once = (k - 1) * n_params * dtype_bytes // k
    return (m + 1) * once if acc == "every" else 2 * once


@shortcut("check_ring_allreduce_seconds", "the bytes per device floored", FLOORED)
def ring_seconds_floored(n_bytes, k, alpha, beta):
    return 0.0 if k <= 1 else 2 * (k - 1) * alpha + 2 * (k - 1) * n_bytes // k / beta


def test_a_whole_number_near_a_fraction_is_told_to_divide_with_slash():
    """A whole number a floor away from a fractional expected value names `/`, not float32."""
    note = rounding_note(19070340, 19070340.5, torch.float64)
    assert "divide with /" in note and "float32" not in note
    assert "divide with /" in rounding_note(19070340, 19070341, torch.float64)
    assert rounding_note(19070340, 29070340.5, torch.float64) == ""    # far: another slip
    assert "float32" in rounding_note(0.40350001, 0.4035, torch.float64)


test_case = parametrize_cases(__name__)


@pytest.mark.parametrize("case", [c for cases in CASES.values() for c in cases["shortcuts"]
                                  if c.module == __name__], ids=repr)
def test_floor_fails_on_every_draw(case):
    """Each floor above, on 40 replayed draws: the case with a fraction to drop is forced into
    every call (draws of powers of two alone left one in 16 or more to pass)."""
    for seed in range(40):
        replay_seeds(seed)
        case.judge()
    replay_seeds(None)
