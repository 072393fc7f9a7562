"""The cost model of the splits counts LeNet by hand (parameters, multiply-adds, saved
activations, optimizer state, latency) and measures ResNet; sharding's costs by hand."""
import pytest
import torch

import helpers
from helpers import (
    layer_sizes,
    lenet_module,
    multiply_adds,
    saved_per_layer,
    sharding_costs,
    split_costs,
)

torch.backends.cudnn.allow_tf32 = False   # exact float32 convolutions on GPUs too


def test_lenet_costs_by_hand():
    sizes = layer_sizes(lenet_module(), (1, 28, 28))
    # 20*1*3*3+20 + 50*20*5*5+50 + 800*128+128 + 128*10+10
    assert sum(r["params"] for r in sizes) == 200 + 25050 + 102528 + 1290 == 129068
    # activations measured by the hooks: conv1 out 20x26x26, conv2 out 50x9x9, ...
    assert [r["out"] for r in sizes] == [13520, 13520, 3380, 4050, 4050, 800, 800, 128, 128, 10]
    c1 = split_costs(sizes, 1, 256, 16.0)
    c2 = split_costs(sizes, 2, 256, 16.0)
    assert c1["data"]["grads"] == 516272 and c1["data"]["sent"] == 0
    assert c2["data"]["sent"] == pytest.approx(516272)          # ring: 2 (k-1)/k = 1 for k=2
    assert c2["data"]["seconds"] == pytest.approx(516272 / 16e9)
    c4 = split_costs(sizes, 4, 256, 16.0)
    assert c4["data"]["sent"] == pytest.approx(1.5 * 516272)
    assert c4["data"]["acts"] == 64 * sum(r["acts"] for r in sizes) * 4
    # within a layer: weights split 4 ways, 4 all-gathers (outputs, before the ReLU and pooling)
    # and 3 reduce-scatters (the input gradients of layers 2-4), (k-1)/k of each per device
    assert c4["within layer"]["params"] == 129068 // 4 * 4
    assert c4["within layer"]["collectives"] == 7
    assert c4["within layer"]["messages"] == 3 * 7
    outs, ins = 13520 + 4050 + 128 + 10, 3380 + 800 + 128
    assert c4["within layer"]["sent"] == pytest.approx(0.75 * 256 * 4 * (outs + ins))
    # network split at 2 devices: one cut, its activation forward and gradient back
    cut = c2["network"]["cuts"][0]
    assert c2["network"]["sent"] == 256 * sizes[cut - 1]["out"] * 4
    assert c2["network"]["handoffs"] == 2 and c2["network"]["collectives"] == 0


def test_resnet_costs_measured():
    sizes = layer_sizes(helpers.resnet18(), (1, 28, 28))
    assert sum(r["params"] for r in sizes) == helpers.num_params(helpers.resnet18())
    assert sum(len(r["weighted"]) for r in sizes) == 21   # 17 convs + 3 shortcuts + 1 dense
    c = split_costs(sizes, 4, 128, 16.0)
    assert c["within layer"]["sent"] > c["data"]["sent"]   # activations outweigh gradients
    assert c["network"]["memory"] < c["data"]["memory"] * 4



def test_multiply_adds_of_lenet_by_hand():
    macs = multiply_adds(lenet_module(), (1, 28, 28))
    assert macs[0] == 20 * 26 * 26 * 9 and macs[3] == 50 * 9 * 9 * 20 * 25
    assert (macs[7] == 800 * 128 and macs[9] == 128 * 10
            and sum(macs) == sum(macs[i] for i in (0, 3, 7, 9)))


def test_saved_activations_of_lenet_by_hand():
    """What autograd keeps for LeNet's backward, per example: the input, the ReLUs' outputs and
    the poolings' outputs (taken by the next layer; Flatten's view adds nothing)."""
    sizes = layer_sizes(lenet_module(), (1, 28, 28))
    assert sum(r["acts"] for r in sizes) == 784 + 13520 + 3380 + 4050 + 800 + 128 == 22662
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    X = torch.randn(4, 5)
    # Linear saves X; ReLU its output, which the second Linear saves again (counted once)
    assert saved_per_layer(net, X) == [4 * 5 * 4, 4 * 7 * 4, 0]


def test_saved_activations_on_meta():
    net = torch.nn.Sequential(torch.nn.Linear(64, 64, device="meta"), torch.nn.ReLU(),
                              torch.nn.Linear(64, 64, device="meta"))
    sizes = layer_sizes(net, (64,))
    assert [r["acts"] for r in sizes] == [64, 64, 0]


def test_costs_optimizer_state_and_latency():
    sizes = layer_sizes(lenet_module(), (1, 28, 28))
    P = 129068
    for opt, per in (("sgd", 0), ("momentum", 4), ("adam", 8)):
        c = split_costs(sizes, 4, 256, 16.0, optimizer=opt, latency_us=5.0, zero=True)
        assert c["data"]["optim"] == per * P                       # replicated on every device
        assert c["within layer"]["optim"] == per * (-(-P // 4))    # divided by k
        assert c["ZeRO-1"]["optim"] == pytest.approx(per * P / 4)
        assert c["ZeRO-1"]["sent"] == pytest.approx(c["data"]["sent"])
        assert c["ZeRO-3"]["sent"] == pytest.approx(1.5 * c["data"]["sent"])
        for row in c.values():
            assert row["seconds"] == pytest.approx(row["messages"] * 5e-6 + row["sent"] / 16e9)
    c = split_costs(sizes, 4, 256, 16.0, num_microbatches=3)
    # a ring all-reduce: 2(k-1) messages per device; the middle stages send 2 per micro-batch
    assert c["data"]["messages"] == 6 and c["data"]["collectives"] == 1
    assert c["network"]["messages"] == 6 and c["network"]["handoffs"] == 2 * 3 * 3
    assert split_costs(sizes, 1, 256, 16.0, zero=True)["ZeRO-3"]["messages"] == 0
    with pytest.raises(ValueError, match="optimizer must be"):
        split_costs(sizes, 2, 256, 16.0, optimizer="lion")


@pytest.mark.parametrize("k", [1, 2, 8])
def test_sharding_costs(k):
    n = 1000
    mixed = {st: sharding_costs(n, k, st, "mixed_adam", 2)
             for st in ("dp", "zero1", "zero2", "zero3")}
    assert mixed["dp"]["total_bytes"] == 16 * n                      # 2 + 2 + 12 per parameter
    assert mixed["zero1"]["total_bytes"] == pytest.approx((2 + 2 + 12 / k) * n)
    assert mixed["zero2"]["total_bytes"] == pytest.approx((2 + (2 + 12) / k) * n)
    assert mixed["zero3"]["total_bytes"] == pytest.approx(16 * n / k)
    ring = 2 * (k - 1) / k * 2 * n
    assert mixed["dp"]["sent_bytes"] == mixed["zero1"]["sent_bytes"] == pytest.approx(ring)
    assert mixed["zero2"]["sent_bytes"] == pytest.approx(ring)
    assert mixed["zero3"]["sent_bytes"] == pytest.approx(1.5 * ring)
    for opt, per in (("sgd", 0), ("momentum", 4), ("adam", 8)):
        assert sharding_costs(n, k, "dp", opt)["optim_bytes"] == per * n
    with pytest.raises(ValueError, match="stage must be"):
        sharding_costs(n, k, "zero4")
    with pytest.raises(ValueError, match="optimizer must be"):
        sharding_costs(n, k, "dp", "adagrad")
    with pytest.raises(ValueError, match="world"):
        sharding_costs(n, 0, "dp")
