"""helpers.saved_tensor_bytes, the course's one measure of what autograd saves for backward:
each storage once, at its first save, parameters left out; saved_per_layer and the checks read
it."""
import torch
from torch import nn

from helpers import saved_per_layer, saved_tensor_bytes


def test_a_storage_counts_once_however_often_it_is_saved():
    x = torch.randn(5, 3, requires_grad=True)

    def twice(x):
        a = torch.tanh(x)                    # tanh saves its output a
        return (a * a).sum() + (a.t() @ a).sum()   # a saved again, and a view of it

    got, out = saved_tensor_bytes(twice, x)
    assert got == 5 * 3 * 4                  # a's storage, once (tanh does not keep x)
    assert torch.equal(out, twice(x))


def test_parameters_are_left_out():
    torch.manual_seed(0)
    lin = nn.Linear(3, 4)
    x = torch.randn(2, 3, requires_grad=True)
    got, out = saved_tensor_bytes(lin, x)                   # a module: its own parameters left out
    assert got == 2 * 3 * 4                          # only x (the weight's view is the weight)
    assert saved_tensor_bytes(lambda x: lin(x), x)[0] > got  # a function: the weight counts
    assert saved_tensor_bytes(lambda x: lin(x), x, params=lin.parameters())[0] == got
    assert torch.equal(out, lin(x))


def test_each_storage_is_counted_even_when_freed_before_fn_returns():
    """The counted tensors are held while fn runs, so a freed storage's address, taken again by
    the next one, is not mistaken for it (a count keyed by address alone would see one)."""
    x = torch.randn(64, 64, requires_grad=True)

    def ten_temporaries(x):
        for _ in range(10):
            (x * (x + 1)).sum()   # mul saves x and x + 1, freed when the graph is dropped
        return x

    assert saved_tensor_bytes(ten_temporaries, x)[0] == 11 * 64 * 64 * 4


def test_a_shared_seen_counts_a_storage_in_the_first_call_only():
    x = torch.randn(4, 6, requires_grad=True)
    seen = {}
    first, a = saved_tensor_bytes(torch.tanh, x, seen=seen)   # saves its output a
    second, _ = saved_tensor_bytes(torch.sin, a, seen=seen)   # saves its input: a again
    assert (first, second) == (4 * 6 * 4, 0)
    assert saved_tensor_bytes(torch.sin, a)[0] == 4 * 6 * 4    # alone, it counts a


def test_saved_per_layer_splits_the_same_count_by_layer():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2), nn.Flatten())
    X = torch.randn(3, 5)
    per_layer = saved_per_layer(net, X)
    # Linear saves X; Tanh its output; the second Linear that output again (counted at Tanh)
    assert per_layer == [3 * 5 * 4, 3 * 7 * 4, 0, 0]
    assert sum(per_layer) == saved_tensor_bytes(net, X)[0]


def test_the_meta_device_is_counted_by_tensor():
    net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).to("meta")
    per_layer = saved_per_layer(net, torch.zeros(3, 5, device="meta"))
    assert per_layer == [3 * 5 * 4, 3 * 7 * 4, 0]
