"""Checks for the exercises of Part I's costs chapter: a GPipe step's time, the largest batch
data parallelism fits, the bytes autograd saves."""
import torch
from torch import nn

from .. import OPTIMIZER_STATE_BYTES, saved_per_layer
from ._core import (
    as_int,
    as_number,
    check,
    expect,
    fresh_generator,
    number_words,
    randint,
    same_number,
)

__all__ = ["check_gpipe_time", "check_largest_batch_data_parallel", "check_saved_bytes",
           "check_dp_step_seconds"]


@check("gpipe_time", observes=["the time returned for fresh (t_stage, p, m), m > 1 and p > 1 "
                               "included, against (m + p - 1) ticks of t_stage / m"])
def check_gpipe_time(fn):
    """fn(t_stage, p, m): the time of a GPipe step with p equal stages and m micro-batches, where
    t_stage is one stage's forward+backward time on the whole batch."""
    g = fresh_generator()
    cases = [(randint(g, 1, 100) / 10, randint(g, 2, 8), randint(g, 2, 16)) for _ in range(5)]
    cases.append((randint(g, 1, 100) / 10, 1, randint(g, 1, 16)))
    for t, p, m in cases:
        call = f"gpipe_time({t}, {p}, {m})"
        got, dtype = as_number(fn(t, p, m), call, with_dtype=True)
        want = (m + p - 1) * t / m                                    # after the answer ran
        steps = m + p + 4           # the m + p - 1 ticks summed one by one, or the formula
        if same_number(got, want, dtype, steps):
            continue
        hint = ""
        if same_number(got, (m + p - 1) * t, dtype, steps):
            hint = ": a tick runs one micro-batch, t_stage / m, not the whole batch"
        elif same_number(got, t * p, dtype, steps) or same_number(got, t, dtype, steps):
            hint = ": count the ticks, m + p - 1, while the pipeline fills and drains"
        got_s, want_s = number_words(got, want, dtype)
        expect(False, f"{call} returned {got_s}, expected {want_s}: {m + p - 1} ticks of "
                      f"{t / m:g} s each{hint}")


@check("largest_batch_data_parallel", references=["split_costs"], observes=[
    "the batch returned for fresh layer sizes, devices, memories and optimizers, against the "
    "largest batch the memory model fits (the check's arithmetic), and 0 when nothing fits"])
def check_largest_batch_data_parallel(fn):
    """fn(sizes, k, memory_bytes, optimizer): the largest global batch whose data-parallel step
    fits in `memory_bytes` per device (split_costs' model: float32 parameters and gradients, the
    optimizer's state, activations of the largest shard), 0 if one example per device does not."""
    g = fresh_generator()
    P = randint(g, 20000, 100000)     # more parameters than activations per example, as in
    acts = [randint(g, 10, 2000) for _ in range(4)]   # LeNet: forgetting the grads shows
    # each layer's output (what a pipeline would send) a third to a half of what it saves for
    # backward: an answer that reads "out" for the activations fits a larger batch
    sizes = [dict(name="layer", params=P // 4, out=max(1, a // randint(g, 2, 3)), acts=a,
                  weighted=[]) for a in acts]
    total_p = 4 * (P // 4)
    per_example = sum(acts) * 4
    names = ["momentum", "adam", "sgd", "adam", "momentum"]
    for optimizer in names:
        k = randint(g, 2, 8)
        fixed = (8 + OPTIMIZER_STATE_BYTES[optimizer]) * total_p
        memory = fixed + randint(g, 1, 300) * per_example + randint(g, 0, per_example - 1)
        call = f"largest_batch_data_parallel(…, k={k}, …, {optimizer!r})"
        got = as_int(fn(sizes, k, memory, optimizer), call)
        want = k * ((memory - fixed) // per_example)
        hint = ""
        outs = sum(s["out"] for s in sizes) * 4
        if got * k == want:
            hint = " (the batch is split over the devices: multiply by k)"
        elif got == k * ((memory - fixed) // outs) != want:
            hint = (" (each example's activations are the tensors its layers keep for backward, "
                    "`acts`, not their outputs, `out`)")
        elif got == k * ((memory - 8 * total_p) // per_example) != want:
            hint = f" ({optimizer} keeps {OPTIMIZER_STATE_BYTES[optimizer]} bytes of state " \
                   "per parameter on every device)"
        expect(got == want, f"{call} with {memory} bytes per device: the largest batch is "
                            f"{want}, you returned {got:g}{hint}")
    small = (8 + OPTIMIZER_STATE_BYTES["adam"]) * total_p - 1
    expect(as_int(fn(sizes, 2, small, "adam"), "largest_batch_data_parallel") == 0,
           "when the parameters, gradients and optimizer state alone do not fit, the answer "
           "is 0")


class _Neighbours(nn.Module):
    """x[:, 1:] * x[:, :-1]: saves two offset slices of its input and never the whole of it, so
    counting a slice's bytes, or one storage per address, is off."""

    def forward(self, x):
        return x[:, 1:] * x[:, :-1]


def _random_net(g, max_pool):
    """A small random conv net with a view (Flatten), pooling (max pooling saves int64 indices,
    average pooling nothing of its own), slices (_Neighbours) and ReLUs."""
    c1, c2, hidden = randint(g, 2, 6), randint(g, 2, 6), randint(g, 4, 16)
    pool = nn.MaxPool2d(2) if max_pool else nn.AvgPool2d(2)
    side = randint(g, 8, 12)
    net = nn.Sequential(nn.Conv2d(1, c1, 3), nn.ReLU(), pool, nn.Conv2d(c1, c2, 3), nn.ReLU(),
                        nn.Flatten(), nn.Linear(c2 * ((side - 2) // 2 - 2) ** 2, hidden),
                        _Neighbours(), nn.ReLU(), nn.Linear(hidden - 1, 3))
    return net, torch.randn(randint(g, 1, 4), 1, side, side, generator=g)


@check("saved_bytes", references=["saved_per_layer", "saved_tensor_bytes", "LiveActivations",
                                  "LiveActivations.micro_batch"], observes=[
    "the bytes returned for fresh random conv nets (views, two slices of one activation, "
    "ReLUs, max and average pooling both), against what autograd saves in the check's own "
    "count; helpers.saved_per_layer is unavailable"])
def check_saved_bytes(fn):
    """fn(net, X): the bytes of activations autograd saves for backward in net(X), each storage
    once, parameters left out (as helpers.saved_per_layer measures them)."""
    g = fresh_generator()
    first = bool(randint(g, 0, 1))      # a max-pool net and an average-pool net both, forced
    for max_pool in (first, not first, bool(randint(g, 0, 1)), bool(randint(g, 0, 1))):
        net, X = _random_net(g, max_pool)
        call = f"saved_bytes on a batch of {X.shape[0]}"
        got = as_int(fn(net, X), call)
        want = sum(saved_per_layer(net, X))                           # after the answer ran
        outputs = []
        hooks = [m.register_forward_hook(
                     lambda m, i, o, outputs=outputs: outputs.append(o.numel() * 4))
                 for m in net]
        with torch.no_grad():
            net(X)
        for h in hooks:
            h.remove()
        params = sum(q.numel() * 4 for q in net.parameters())
        hint = ""
        if got in (sum(outputs), sum(outputs) + X.numel() * 4):
            hint = " (that is what the layers output; autograd keeps other tensors: count " \
                   "what saved_tensors_hooks packs)"
        elif got == want + params:
            hint = " (the weights are parameters, not activations: leave them out)"
        elif got > want:
            hint = " (a tensor saved twice, or a view of a saved one, takes its memory " \
                   "once: count each storage once, keyed by t.untyped_storage().data_ptr() " \
                   "(two slices of one tensor have different data_ptr()), and no parameters)"
        elif got < want:
            hint = " (a slice saved alone keeps its whole storage alive: count " \
                   "t.untyped_storage().nbytes(), not the slice's numel() * element_size())"
        expect(got == want, f"{call}: autograd saved {want} bytes of activations, you "
                            f"returned {got:g}{hint}")


# ---- costs: a data-parallel step with overlap ------------------------------------------------
@check("dp_step_seconds", references=["split_costs"], observes=[
    "the seconds returned for fresh (compute, k, communication), where the communication is "
    "shorter and longer than the backward it can hide behind, against compute/k plus the part "
    "of the communication that the backward (2/3 of the compute) does not hide"])
def check_dp_step_seconds(fn):
    """fn(compute_s, k, comm_s): one data-parallel step: each of k devices computes 1/k of the
    one-device step `compute_s` (backward 2/3 of it), and the all-reduce of `comm_s` overlaps
    with the backward, as far as the backward lasts."""
    g = fresh_generator()
    for hidden in (True, False, True, False, False):
        k = randint(g, 2, 16)
        compute = randint(g, 10, 1000) / 1000
        back = 2 / 3 * compute / k
        comm = back * (randint(g, 10, 90) / 100 if hidden else 1 + randint(g, 10, 300) / 100)
        call = f"dp_step_seconds({compute:g}, {k}, {comm:.6g})"
        got, dtype = as_number(fn(compute, k, comm), call, with_dtype=True)
        want = compute / k + max(0.0, comm - back)
        if same_number(got, want, dtype, 16):
            continue
        hint = ""
        if same_number(got, compute / k + comm, dtype, 16):
            hint = (": the all-reduce of the first buckets starts while the backward still runs, "
                    "so only what outlasts the backward adds to the step")
        elif same_number(got, compute / k + comm - back, dtype, 16):
            hint = (": an all-reduce shorter than the backward hides completely; it cannot make "
                    "the step shorter than the compute")
        elif same_number(got, compute + max(0.0, comm - 2 / 3 * compute), dtype, 16):
            hint = ": each device computes 1/k of the batch"
        got_s, want_s = number_words(got, want, dtype)
        expect(False, f"{call} returned {got_s}, expected {want_s}{hint}")
