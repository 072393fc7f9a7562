"""Checks for the exercises of Part I's network-split chapter: micro-batches for a bubble, cuts
that balance the parameters (placed on simulated GPUs), the 1F1B order (run, not read)."""
import copy
import fractions
import math
from itertools import pairwise

import torch
from torch import nn

from .. import (
    all_close,
    balanced_cuts,
    clock_ticks,
    interleaved_order,
    interleaved_ticks,
    peak_live,
    run_schedule,
    validate_orders,
)
from ._core import (
    CheckFailed,
    FakeGPUs,
    as_int,
    as_pair,
    check,
    describe_device,
    expect,
    fresh_generator,
    gamma,
    number_words,
    randint,
    same_number,
)

__all__ = ["check_microbatches_for_bubble", "check_split_by_params", "check_order_1f1b",
           "check_interleaved_costs"]

CPU = torch.device("cpu")


# ---- micro-batches for a bubble --------------------------------------------------------------
def _fewest(p, target):
    """The right answers for `target` (a float): the exact count for the float's value and for
    the decimal it was written as, and, where (p-1)(1-t)/t lands within rounding of a whole
    number, both neighbours (float arithmetic may fall either side of that boundary)."""
    answers = set()
    for t in (fractions.Fraction(target), fractions.Fraction(str(target))):
        answers.add(max(1, math.ceil((p - 1) * (1 - t) / t)))
    x = (p - 1) * (1 - target) / target
    near = round(x)
    if abs(x - near) <= gamma(8) * max(1.0, abs(x)):
        answers |= {max(1, near), max(1, near + 1)}
    return answers


@check("microbatches_for_bubble", references=["bubble_fraction", "unequal_bubble",
                                              "interleaved_bubble"], observes=[
    "the count returned for fresh (p, target), targets met exactly by some count included, "
    "against the exact count; at an exact boundary both neighbours are accepted (rounding), "
    "except for a target of 2**-j, exact in floats, where only the exact count is"])
def check_microbatches_for_bubble(fn):
    """fn(p, target): the fewest micro-batches m with bubble (p-1)/(m+p-1) <= target."""
    g = fresh_generator()
    cases = [(randint(g, 2, 8), randint(g, 2, 45) / 100) for _ in range(5)] + [(1, 0.1), (4, 0.2)]
    p, m0 = randint(g, 2, 8), randint(g, 2, 30)
    cases.append((p, (p - 1) / (m0 + p - 1)))            # a target some count meets exactly
    # a target of 2**-j: (p-1)(1-t)/t is exact in floats, so the count that meets it exactly is
    # the only answer (a loop on `>=` or floor + 1 for ceil returns the next one)
    dyadic = (randint(g, 2, 8), 2.0 ** -randint(g, 1, 5))
    for p, target in [*cases, dyadic]:
        call = f"microbatches_for_bubble({p}, {target:g})"
        got = as_int(fn(p, target), call)
        right = _fewest(p, target) if (p, target) != dyadic else {
            (p - 1) * (round(1 / target) - 1)}
        if got in right:
            continue
        want = min(right)
        bubble = lambda m, p=p: (p - 1) / (m + p - 1)
        hint, ratio = "", next(m for m in range(1, 10**6) if (p - 1) / m <= target)
        megatron = ("the m for a bubble of (p-1)/m (idle time over compute time, as in "
                    "Megatron-LM); here the bubble is the idle share of the step, (p-1)/(m+p-1)")
        if got == want + p - 1:
            hint = (f": {got} is the number of clock ticks, m + p - 1, or {megatron}; the "
                    "question is m")
        elif got == ratio:
            hint = f": {got} is {megatron}"
        elif got < want:
            hint = f": with {got} micro-batches the bubble is still {bubble(got):.3f} > {target:g}"
        elif got > want:
            hint = f": {want} already bring the bubble down to {bubble(want):.3f}; the fewest"
            hint += " (the bubble may equal the target: <=)" if bubble(want) == target else ""
        expect(False, f"{call} returned {got}, expected {want}{hint}")


# ---- cuts that balance parameters ------------------------------------------------------------
# widths [3, 7, 3, 6, 5]: layers of 28, 24, 24, 35 parameters (below); [2, 4, 8, 3, 6]: layers of
# 12, 40, 27, 24, where on 3 devices the best largest stage is 51 and the cuts with the least
# spread (max - min), the least sum of squares, or counting weights without biases give 52
_FIXED = ([3, 7, 3, 6, 5], [2, 4, 8, 3, 6])


def _random_net(g, widths=None):
    """An MLP of random widths, or of `widths`: [3, 7, 3, 6, 5] has layers of 28, 24, 24 and 35
    parameters, which a greedy cut at a third of the total splits wrongly (52, not 48)."""
    widths = widths or [randint(g, 2, 40) for _ in range(randint(g, 4, 7))]
    layers = []
    for a, b in pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1]), widths


def _empty(stage):
    """True when a stage holds no layer: only containers (nn.Sequential(), nested ones) or
    nn.Identity. A layer returned as itself (`net[a]`, an nn.Linear) is a stage of one layer."""
    bare = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.Identity)
    return all(isinstance(m, bare) for m in stage.modules())


@check("split_by_params", simulated=True, references=["balanced_cuts", "split_sequential"],
       observes=[
    "on CPU: k independent stages that together compute net, none empty, the largest holding "
    "as few parameters as the best cut (computed by the check); two nets fixed, where a greedy "
    "cut at total / k is not the best, and where the cuts with the least spread, the least sum "
    "of squares or the fewest weights (biases left out) are not the best",
    "on k simulated GPUs: every parameter of stage i is on devices[i]"])
def check_split_by_params(fn):
    """fn(net, devices): len(devices) stages of the nn.Sequential `net`, copies, in order, the
    largest stage holding as few parameters as possible; together they compute net."""
    g = fresh_generator()
    for case in range(4):
        net, widths = _random_net(g, _FIXED[case] if case < len(_FIXED) else None)
        k = 3 if case < len(_FIXED) else randint(g, 2, 4)
        call = f"split_by_params on {len(net)} layers and {k} devices"
        stages = fn(net, [CPU] * k)
        expect(isinstance(stages, (list, tuple)) and len(stages) == k,
               f"{call}: expected a list of {k} stages, got {type(stages).__name__}"
               + (f" of length {len(stages)}" if hasattr(stages, "__len__") else ""))
        for i, s in enumerate(stages):
            expect(isinstance(s, nn.Module) and not _empty(s),
                   f"{call}: stage {i} is empty: every device gets at least one layer")
        own = {p.data_ptr() for p in net.parameters()}
        expect(not any(p.data_ptr() in own for s in stages for p in s.parameters()),
               f"{call}: a stage shares its parameters with net: copy the layers "
               "(copy.deepcopy)")
        X = torch.randn(5, widths[0], generator=g)
        h = X
        for s in stages:
            h = s(h)
        expect(all_close(h, net(X)), f"{call}: the stages, run in order, do not compute what "
                                     "net computes")
        sizes = [sum(p.numel() for p in s.parameters()) for s in stages]
        per_layer = [sum(p.numel() for p in m.parameters()) for m in net]
        bounds = [0, *balanced_cuts(per_layer, k), len(per_layer)]
        best = max(sum(per_layer[a:b]) for a, b in pairwise(bounds))
        expect(max(sizes) == best, f"{call}: your largest stage holds {max(sizes)} parameters "
                                   f"(stages: {sizes}); a better cut gets it down to {best}")
        gpus = FakeGPUs(k)
        placed, _ = gpus.run(fn, net, gpus.devices, what=call)
        for i, s in enumerate(placed):
            where = sorted({describe_device(p.device) for p in s.parameters()})
            expect(where in ([], [describe_device(gpus.devices[i])]),
                   f"{call}: stage {i}'s parameters are on {', '.join(where)}, expected "
                   f"{describe_device(gpus.devices[i])}: move each stage to its device "
                   "(.to(devices[i]))")


# ---- the 1F1B order --------------------------------------------------------------------------
def _mlp_stages(g, p):
    """A small random MLP of p layers (the unsplit model) and its widths."""
    widths = [randint(g, 3, 12) for _ in range(p + 1)]
    layers = [nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in pairwise(widths)]
    with torch.no_grad():
        for layer in layers:
            for q in layer.parameters():
                q.copy_(torch.randn(q.shape, generator=g) * 0.5)
    return nn.Sequential(*layers), widths


@check("order_1f1b", references=["one_f_one_b_order", "one_f_one_b_rank_order",
                                "torch.distributed.pipelining.schedules._get_1f1b_rank_ops"],
       observes=[
    "the order is RUN (run_schedule) on fresh stages: the unsplit model's loss and gradients, "
    "the clock ticks of the run (GPipe's 2(m+p-1)), and the micro-batches alive on each stage "
    "counted from the run (at most p - s on stage s)"])
def check_order_1f1b(fn):
    """fn(p, m): per stage, the list of ("F", j) / ("B", j) that 1F1B runs."""
    g = fresh_generator()
    # m < p - 1 once ((4, 2)): a warm-up of p - 1 - s forwards not capped at m runs F(2), B(-1)
    cases = [(randint(g, 2, 4), 0) for _ in range(3)] + [(2, 1), (3, 2), (4, 2)]
    for p, m in cases:
        m = m or randint(g, p + 1, 8)
        call = f"order_1f1b({p}, {m})"
        orders = fn(p, m)
        expect(isinstance(orders, (list, tuple)) and len(orders) == p,
               f"{call} should return {p} lists, one per stage, got {type(orders).__name__}"
               + (f" of length {len(orders)}" if hasattr(orders, "__len__") else ""))
        orders = [[(op[0], as_int(op[1], call)) for op in ops] for ops in orders]
        try:
            got_m = validate_orders(orders)
            ticks = 1 + max(clock_ticks(orders).values())
        except (ValueError, TypeError, IndexError) as e:
            raise CheckFailed(f"{call} cannot run: {e}") from None
        expect(got_m == m, f"{call}: stage 0 runs {got_m} forwards, expected {m}")
        net, widths = _mlp_stages(g, p)
        X = torch.randn(2 * m, widths[0], generator=g)
        y = torch.randn(2 * m, widths[-1], generator=g)
        mse = lambda out, t: ((out - t) ** 2).sum(dim=1)
        want = mse(net(X), y).mean()
        want.backward()
        stages = [copy.deepcopy(layer) for layer in net]
        for st in stages:
            st.zero_grad()
        total, schedule = run_schedule(stages, X, y, mse, [CPU] * p, orders)
        grads = [q.grad for st in stages for q in st.parameters()]
        expect(abs(total - want.item()) <= 1e-4 * max(1.0, abs(want.item()))
               and all_close(grads, [q.grad for q in net.parameters()]),
               f"{call}: the step's loss or gradients differ from the unsplit model's")
        expect(ticks == 2 * (m + p - 1),
               f"{call} takes {ticks} ticks; 1F1B keeps GPipe's 2(m+p-1) = {2 * (m + p - 1)}"
               " (start each stage with the forwards that fill the pipeline)")
        live = peak_live(schedule)
        for s_, n_live in enumerate(live):
            expect(n_live <= p - s_,
                   f"{call}: stage {s_} held {n_live} micro-batches at once (peaks counted "
                   f"from the run: {live}); 1F1B holds at most p - s = {p - s_}: run a "
                   "backward as soon as one can run")


# ---- network_split: interleaving -------------------------------------------------------------
@check("interleaved_costs", references=["interleaved_bubble", "interleaved_ticks",
                                        "interleaved_order"], observes=[
    "the pair returned for fresh (p, m, v) against the bubble counted on the clock of the "
    "interleaved 1F1B order (interleaved_order, interleaved_ticks) and the hand-offs between "
    "devices that one micro-batch makes, forward and back, through v*p chunks"])
def check_interleaved_costs(fn):
    """fn(p, m, v) -> (bubble, hand-offs per micro-batch) of interleaved 1F1B: p devices of v
    chunks each, m micro-batches, every chunk op the same time."""
    g = fresh_generator()
    cases = [(randint(g, 2, 5), 0, randint(g, 2, 4)) for _ in range(4)] + [(3, 0, 1)]
    for p, _, v in cases:
        m = p * randint(g, 1, 4)
        ticks = 1 + max(interleaved_ticks(interleaved_order(p, m, v), v).values())
        bubble = fractions.Fraction(ticks - 2 * m * v, ticks)
        sends = 2 * (v * p - 1)
        call = f"interleaved_costs({p}, {m}, {v})"
        (got_bubble, got_sends), dtype = as_pair(fn(p, m, v), call, "bubble, hand-offs", True)
        if not same_number(got_bubble, float(bubble), dtype, 8, share=True):
            hint = ""
            if same_number(got_bubble, (p - 1) / (m + p - 1), dtype, 8, share=True):
                hint = (": that is GPipe's (p-1)/(m+p-1); with v chunks per device the fill and "
                        "drain take p-1 chunk-ops, each 1/v of a stage's")
            shown_got, shown_want = number_words(got_bubble, float(bubble), dtype, 4)
            expect(False, f"{call}: bubble {shown_got}, but the schedule's clock counts "
                          f"{ticks} ticks of which each device works {2 * m * v}: "
                          f"{shown_want}{hint}")
        hint = ""
        if got_sends == 2 * (p - 1):
            hint = (f": a micro-batch crosses from device to device at every chunk boundary, "
                    f"{v * p - 1} of them, not only at the {p - 1} device boundaries of one lap")
        elif got_sends == v * p - 1:
            hint = ": count the gradient's way back too"
        expect(got_sends == sends, f"{call}: {got_sends:g} hand-offs per micro-batch, expected "
                                   f"{sends}{hint}")
