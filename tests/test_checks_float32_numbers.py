"""Checks that compare a returned number take a float32 computation of the right formula (to
float32's rounding, helpers/checks/_core/inputs.py's `near`), still fail the mistakes they name
when computed in float32, and never show one number twice in a rejection."""
import itertools
import re

import pytest
import torch
from check_cases import other, parametrize_cases, shortcut

import helpers.checks
from helpers import get_params, partition_by_size, split_batch
from helpers.checks._core import rounding_note, shown


def T(x):
    """x as a float32 tensor: torch.tensor of a Python float is float32 by default."""
    return torch.tensor(float(x))


# ---- right answers with one factor in float32 -------------------------------------------------
@other("check_idle_share", "boxes vectorised with torch.tensor (float32 by default)")
def idle_share_f32(timelines):
    t = [torch.tensor([[e["start"], e["end"]] for e in tl]) for tl in timelines]
    lo = min(x[:, 0].min() for x in t)
    hi = max(x[:, 1].max() for x in t)
    busy = sum((x[:, 1] - x[:, 0]).sum() for x in t)
    return 1 - busy / (len(t) * (hi - lo))


@other("check_tp_bytes_per_step", "a float32 factor")
def tp_bytes_f32(blocks, m, tokens, width, tp, b):
    return 4 * blocks * m * 2 * (T(tp) - 1) / tp * tokens * width * b


@other("check_accumulation_bytes", "a float32 factor")
def accumulation_bytes_f32(n, k, m, acc, b):
    once = (T(k) - 1) / k * n * b
    return (m + 1) * once if acc == "every" else 2 * once


@other("check_mixed_zero_bytes", "a float32 world size")
def mixed_zero_bytes_f32(stage, k):
    level = ["dp", "zero1", "zero2", "zero3"].index(stage)
    k = T(k)
    return (2 / (k if level >= 3 else 1) + 2 / (k if level >= 2 else 1)
            + 12 / (k if level >= 1 else 1))


@other("check_lr_at", "a float32 base rate")
def lr_at_f32(step, base_lr, base_batch, batch, warmup):
    peak = T(base_lr) * batch / base_batch
    return peak * min(1.0, (step + 1) / warmup) if warmup else peak


@other("check_zero1_optimizer", "a float32 tensor learning rate (torch.compile's form)")
def zero1_tensor_lr(params, rank, world, lr):
    owners = partition_by_size([p.numel() for p in params], world)
    mine = [p for p, r in zip(params, owners, strict=True) if r == rank]
    return torch.optim.AdamW(mine, lr=torch.tensor(lr))


@other("check_bytes_sent_naive_vs_ring", "float32 tensors")
def bytes_sent_f32(nbytes, k):
    return T(k - 1) * nbytes, 2 * (T(k) - 1) / k * nbytes


@other("check_interleaved_costs", "a float32 bubble")
def interleaved_costs_f32(p, m, v):
    return (T(p) - 1) / (v * m + p - 1), 2 * (v * p - 1)


@other("check_tp_ring_bytes", "a float32 factor")
def tp_ring_bytes_f32(batch, seq, width, k):
    return 2 * 2 * 2 * (T(k) - 1) / k * batch * seq * width * 4


@other("check_evaluate_accuracy_multi", "the accuracy as a float32 tensor")
def evaluate_accuracy_multi_f32(net, params, data_iter, devices):
    replicas = [get_params(params, d) for d in devices]
    correct, total = torch.zeros(()), 0
    with torch.no_grad():
        for X, y in data_iter:
            for W, X_s, y_s in zip(replicas, *split_batch(X, y, devices), strict=True):
                correct += (net(X_s, W).argmax(dim=1) == y_s).sum().cpu()
            total += y.numel()
    return correct / total


@shortcut("check_evaluate_accuracy_multi", "an accuracy off by 1 %, with empty shards drawn",
          "single-device accuracy")
def evaluate_accuracy_multi_off(net, params, data_iter, devices):
    return float(evaluate_accuracy_multi_f32(net, params, data_iter, devices)) * 1.01


# ---- the mistakes the checks name, computed in float32, still fail by name -----------------------
@shortcut("check_idle_share", "GPipe's formula in float32", "assumes equal stages")
def idle_share_formula_f32(timelines):
    p, m = len(timelines), sum(e["phase"] == "F" for e in timelines[0])
    return (T(p) - 1) / (m + p - 1)


@shortcut("check_lr_at", "no warm-up ramp, float32", "ramp up")
def lr_at_no_ramp_f32(step, base_lr, base_batch, batch, warmup):
    return T(base_lr) * batch / base_batch


@shortcut("check_lr_at", "off by one in the ramp, float32", "off by one")
def lr_at_off_by_one_f32(step, base_lr, base_batch, batch, warmup):
    peak = T(base_lr) * batch / base_batch
    return peak * min(1.0, step / warmup) if warmup else peak


@shortcut("check_mixed_zero_bytes", "float32 training's bytes", "float32 training")
def mixed_zero_bytes_fp32_training(stage, k):
    k = T(k)
    return {"dp": 16, "zero1": 8 + 8 / k, "zero2": 4 + 12 / k, "zero3": 16 / k}[stage]


@shortcut("check_mixed_zero_bytes", "fp32 master weights kept whole under ZeRO",
          "master weights kept whole")
def mixed_zero_bytes_master_whole(stage, k):
    return {"dp": 16, "zero1": 8 + 8 / k, "zero2": 6 + 10 / k, "zero3": 4 + 12 / k}[stage]


@shortcut("check_accumulation_bytes", "m all-reduces, float32", "m all-reduces")
def accumulation_bytes_allreduce_f32(n, k, m, acc, b):
    return 2 * m * (T(k) - 1) / k * n * b


@shortcut("check_bytes_sent_naive_vs_ring", "the reduce-scatter alone, float32",
          "reduce-scatter alone")
def bytes_sent_half_ring_f32(nbytes, k):
    return (k - 1) * nbytes, (T(k) - 1) / k * nbytes


test_case = parametrize_cases(__name__)


# ---- a float32 result handed back as a Python float: rejected, saying why ----------------------
def _shown(message):
    """The returned and the expected number as the message writes them."""
    found = re.search(r"returned ([-\d.e+]+)\D.*?expected ([-\d.e+]+)", message)
    assert found, message
    return found.groups()


@pytest.mark.parametrize("check, answer", [
    ("check_lr_at", lambda *a: float(lr_at_f32(*a)) * (1 + 2e-7)),
    ("check_tp_bytes_per_step", lambda *a: float(tp_bytes_f32(*a)) * (1 + 2e-7)),
    ("check_idle_share", lambda tls: float(idle_share_f32(tls)) + 1e-7),
])
def test_float32_rounding_as_python_float_is_named(check, answer):
    """A float32 result off by float32 rounding, returned as a Python float, is judged as a
    float64 number: rejected, the message naming float32 and never one number twice."""
    result = getattr(helpers.checks, check)(answer)
    assert result.status == "failed", result
    assert "float32 rounding" in result.message, result.message
    got, want = _shown(result.message)
    assert got != want, result.message


def test_shown_tells_numbers_apart():
    """shown() adds digits until the two numbers differ; rounding_note names float32."""
    for got, want in itertools.product([0.4035000001, 39146800.3], [0.4035, 39146800.0]):
        if got != want:
            a, b = shown(got, want)
            assert a != b
    assert "float32" in rounding_note(0.40350001, 0.4035, torch.float64)
    assert rounding_note(0.41, 0.4035, torch.float64) == ""
