"""A sum started from a tensor of zeros the answer made (`total = torch.zeros_like(chunk);
total += g`, `sum(gs, torch.zeros_like(chunk))`) adds nothing with its first addition: the
Recorder counts an addition of such zeros, unwritten since, as a copy, as it counts Python's
`0 + t` (observe.py, values.adds_zero), in every check that counts additions; what is added
after that still counts (tests/check_cases.py's form)."""
import torch
from check_cases import other, parametrize_cases, shortcut

from helpers.checks._core.observe import Recorder


def _serve(params, grads, devices, lr, total_of):
    """Device j sums chunk j of every gradient with `total_of(chunks, like)`, steps its chunk,
    and every replica pulls it."""
    k = len(devices)
    p_chunks = [p.tensor_split(k) for p in params]
    g_chunks = [g.tensor_split(k) for g in grads]
    for j in range(k):
        pushed = [g_chunks[i][j].to(devices[j]) for i in range(k)]
        p_chunks[j][j].sub_(lr * total_of(pushed, p_chunks[j][j]))
    for i in range(k):
        for j in range(k):
            if i != j:
                p_chunks[i][j].copy_(p_chunks[j][j])


def _accumulated(pushed, like):
    total = torch.zeros_like(like)
    for g in pushed:
        total += g
    return total


@other("check_sharded_server_step", "each server accumulates into torch.zeros_like")
def sharded_server_step_zeros_accumulated(params, grads, devices, lr):
    _serve(params, grads, devices, lr, _accumulated)


@other("check_sharded_server_step", "sum() started from torch.zeros_like")
def sharded_server_step_sum_from_zeros(params, grads, devices, lr):
    _serve(params, grads, devices, lr, lambda pushed, like: sum(pushed, torch.zeros_like(like)))


@shortcut("check_sharded_server_step", "device 0 sums every chunk, each from a tensor of zeros",
          "more than serving its chunk needs")
def sharded_server_step_all_on_zero(params, grads, devices, lr):
    k = len(devices)
    p_chunks = [p.tensor_split(k) for p in params]
    for j in range(k):
        total = sum((g.tensor_split(k)[j].to(devices[0]) for g in grads),
                    torch.zeros_like(p_chunks[0][j]))
        p_chunks[j][j].sub_((lr * total).to(devices[j]))
    for i in range(k):
        for j in range(k):
            if i != j:
                p_chunks[i][j].copy_(p_chunks[j][j])


@shortcut("check_allreduce_spread", "spread, but each chunk added in two halves",
          "already spread")
def allreduce_spread_in_halves(data):
    k = len(data)
    chunks = [t.view(-1).tensor_split(k) for t in data]
    for i in range(k):
        for j in range(k):
            if j != i:
                half = chunks[j][i].to(data[i].device) * 0.5
                chunks[i][i].add_(half)
                chunks[i][i].add_(half)
    for i in range(k):
        for j in range(k):
            if j != i:
                chunks[j][i].copy_(chunks[i][i])


def test_an_addition_of_known_zeros_is_a_copy():
    """Zeros made by zeros, zeros_like, new_zeros, a full of 0, zeroed in place (`zero_`,
    `fill_(0)`, `mul_(0)`), a product by 0 or a copy of those add nothing;
    once written, or subtracted from, or scaled by alpha, they count."""
    n, g = 6, torch.randn(6)
    with Recorder() as rec:
        total = torch.zeros_like(g)
        total += g                                   # a copy
        total += g                                   # n
        _ = torch.zeros(n).clone() + g               # a copy
        _ = g.new_zeros(n) + g + torch.full((n,), 0.0)   # two copies
        _ = torch.zeros(n) - g                       # n: a negation
        _ = torch.zeros(n).add(g, alpha=2)           # n: a product
        _ = torch.ones(n) + g                        # n
        _ = torch.empty(n).zero_() + g               # a copy: zeroed in place
        _ = torch.empty(n).fill_(0) + g              # a copy
        _ = g * 0 + g                                # a copy: a product by a Python 0
        _ = g.clone().mul_(0) + g                    # a copy
        _ = torch.empty(n).fill_(1) + g              # n
    assert rec.adds_by_device() == {torch.device("cpu"): 5 * n}


test_case = parametrize_cases(__name__)
