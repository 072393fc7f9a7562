"""Natural mistakes that give the right answer on most inputs, told apart by a case every call
holds: 1F1B with fewer micro-batches than p - 1, a net whose best cut no other objective finds,
a batch smaller than the device count (empty shards), a bubble target met exactly in floats,
tensors that share a storage (tests/check_cases.py). Each fails on every replayed draw."""
import copy
import math

import pytest
import torch
from check_cases import cases_of, shortcut

from helpers import get_params, split_batch
from helpers.checks._core.inputs import replay_seeds

SEEDS = range(5)


# ---- order_1f1b: m < p - 1 ---------------------------------------------------------------------
@shortcut("check_order_1f1b", "a warm-up of p - 1 - s forwards, not capped at m", "cannot run")
def order_1f1b_uncapped(p, m):
    out = []
    for s in range(p):
        warm = p - 1 - s
        ops = [("F", j) for j in range(warm)]
        for j in range(m - warm):
            ops += [("F", warm + j), ("B", j)]
        out.append(ops + [("B", j) for j in range(m - warm, m)])
    return out


# ---- split_by_params: another objective than the largest stage ---------------------------------
def _cut_by(objective, count=lambda layer: sum(p.numel() for p in layer.parameters())):
    """An answer that tries every cut and keeps the one `objective(stage sizes)` ranks first."""
    def split(net, devices):
        sizes, k = [count(layer) for layer in net], len(devices)

        def cuts(start, parts):
            if parts == 1:
                yield []
                return
            for c in range(start + 1, len(net) - parts + 2):
                for rest in cuts(c, parts - 1):
                    yield [c, *rest]

        def stages(c):
            b = [0, *c, len(net)]
            return [sum(sizes[a:e]) for a, e in zip(b, b[1:])]
        b = [0, *min(cuts(0, k), key=lambda c: objective(stages(c))), len(net)]
        return [copy.deepcopy(net[a:e]).to(d) for a, e, d in zip(b, b[1:], devices)]
    return split


split_least_spread = shortcut("check_split_by_params", "the least spread (max - min)",
                              "a better cut")(_cut_by(lambda s: max(s) - min(s)))
split_least_squares = shortcut("check_split_by_params", "the least sum of squares",
                               "a better cut")(_cut_by(lambda s: sum(x * x for x in s)))
split_weights_only = shortcut("check_split_by_params", "weights counted, biases forgotten",
                              "a better cut")(_cut_by(max, lambda layer: sum(
                                  p.numel() for p in layer.parameters() if p.dim() > 1)))


# ---- evaluate_accuracy_multi: empty shards -----------------------------------------------------
@shortcut("check_evaluate_accuracy_multi", "per-shard mean times the shard's size", "empty shard")
def evaluate_accuracy_mean_times_len(net, params, data_iter, devices):
    replicas = [get_params(params, d) for d in devices]
    correct, total = 0.0, 0
    with torch.no_grad():
        for X, y in data_iter:
            for W, X_s, y_s in zip(replicas, *split_batch(X, y, devices)):
                correct += ((net(X_s, W).argmax(1) == y_s).float().mean() * len(y_s)).item()
            total += len(y)
    return correct / total


# ---- tensor_bytes: tensors sharing a storage ---------------------------------------------------
SHARED = "counting the tensors that share memory once"


@shortcut("check_tensor_bytes", "each storage once, keyed by its address (a tied weight's "
          "transpose left out)", SHARED)
def tensor_bytes_per_storage(tensors):
    seen = {}
    for t in tensors:
        seen[t.untyped_storage().data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


@shortcut("check_tensor_bytes", "the same tensor twice counted once (keyed by the object)",
          SHARED)
def tensor_bytes_distinct_objects(tensors):
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())


# ---- microbatches_for_bubble: a target met exactly ---------------------------------------------
@shortcut("check_microbatches_for_bubble", "bubble below the target (>= for >)", "already bring")
def microbatches_strict(p, target):
    m = 1
    while (p - 1) / (m + p - 1) >= target:
        m += 1
    return m


@shortcut("check_microbatches_for_bubble", "int(x) + 1 for a ceiling", "already bring")
def microbatches_floor_plus_one(p, target):
    return max(1, int((p - 1) * (1 - target) / target) + 1)


@pytest.mark.parametrize("case", cases_of(__name__), ids=repr)
def test_every_shortcut_fails_on_every_draw(case, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)
    for seed in SEEDS:
        replay_seeds(seed)
        case.judge()


def test_the_dyadic_target_is_exact_in_floats():
    """For t = 2**-j the closed form and the loop agree: the check accepts one count there."""
    for p in range(2, 9):
        for j in range(1, 6):
            t = 2.0 ** -j
            m = 1
            while (p - 1) / (m + p - 1) > t:
                m += 1
            assert m == math.ceil((p - 1) * (1 - t) / t) == (p - 1) * (2 ** j - 1)
