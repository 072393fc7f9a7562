"""Part III: DDPFromScratch on 2 gloo processes equals one process on the combined batch and
torch's DDP (several bucket sizes, tied weights, frozen parameters), and its all-reduces start
while backward still runs."""
import pytest
import torch
from torch import nn

import helpers
from helpers import make_buckets

CASES = [("mlp", None), ("mlp", 0.004), ("mlp", 25), ("tied", None), ("tied", 0.01),
         ("frozen", 0.004)]


@pytest.fixture(scope="module")
def runs():
    return helpers.run_ranks(2, [
        ("ddp", helpers.ddp_vs_one_process, dict(cases=CASES)),
        ("timeline", helpers.gradient_timeline, {}),
        ("timeline:buckets", helpers.gradient_timeline, dict(bucket_mb=0.01))], backend="gloo")


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{k}-{b}" for k, b in CASES])
def test_equals_one_process_and_torch_ddp(runs, i):
    for rank in runs:
        case = rank["ddp"][i]
        # float32 rounding: the mean of two half-batch means is not bit-identical to one mean
        assert case["scratch"] <= 1e-6, case
        assert case["torch"] <= 1e-6, case
        assert abs(case["scratch"] - case["torch"]) <= 1e-6, case


def test_one_allreduce_per_bucket_tied_once_frozen_skipped(runs):
    for case in runs[0]["ddp"]:
        assert case["calls"] == case["num_buckets"], case   # one all-reduce per bucket, no more
        assert sum(case["sizes"]) == case["num_trainable"], case   # each trainable param once
    by = {(c["kind"], c["bucket_mb"]): c for c in runs[0]["ddp"]}
    assert by[("mlp", None)]["num_buckets"] == by[("mlp", None)]["num_trainable"]
    assert by[("mlp", 25)]["num_buckets"] == 1
    assert 1 < by[("mlp", 0.004)]["num_buckets"] < by[("mlp", None)]["num_buckets"]
    tied = helpers.TinyLM(tied=True)
    assert by[("tied", None)]["num_buckets"] == len(list(tied.parameters()))
    assert by[("tied", None)]["num_buckets"] == len(list(tied.named_parameters(
        remove_duplicate=False))) - 1   # head.weight is tok.weight: reduced once


@pytest.mark.parametrize("name", ["timeline", "timeline:buckets"])
def test_allreduces_start_before_backward_ends(runs, name):
    for rank in runs:
        t = rank[name]
        launches = [s for s, what, _ in t["events"] if what == "launch"]
        grads = [s for s, what, _ in t["events"] if what == "grad"]
        assert len(launches) == t["num_buckets"] > 1
        # the first all-reduce is in flight before autograd has produced the last gradient
        assert launches[0] < grads[-1] < t["backward_s"], t
        # buckets go in reverse parameter order: the output layer's first
        assert ([i for _, what, i in t["events"] if what == "launch"]
                == list(range(t["num_buckets"])))


def test_make_buckets_reverse_order_and_size():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 10), nn.Linear(10, 10))
    net[1].requires_grad_(False)
    params = list(net.parameters())
    assert make_buckets(params, None) == [[p] for p in reversed(params) if p.requires_grad]
    buckets = make_buckets(params, 0.0004)   # 419 bytes: last bias + weight (440 B) fill one
    assert [p for b in buckets for p in b] == [params[5], params[4], params[1], params[0]]
    assert [len(b) for b in buckets] == [2, 2]
    assert [len(b) for b in make_buckets(params + [params[0]], 100)] == [4]   # shared: once


def test_needs_a_process_group():
    with pytest.raises(RuntimeError, match="process group"):
        helpers.DDPFromScratch(nn.Linear(2, 2))
