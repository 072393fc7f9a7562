"""Part I: one training step split across layers (network split, GPipe and 1F1B pipelines).

Every function takes `devices`, a list that may repeat a device (simulated GPUs): the results
agree with one device up to float32 rounding either way. Transfers are logged by position in
`devices` (runtime.traffic.send), so simulated devices count the bytes that real ones would send.
"""
import copy

import torch

from ..devices import rank_clock
from ..runtime.traffic import send
from .schedules import (
    clock_ticks,
    gpipe_order,
    interleaved_ticks,
    one_f_one_b_order,
    validate_orders,
)

__all__ = ["split_sequential", "network_split_forward", "pipeline_step", "run_schedule",
           "stage_forward", "stage_backward", "pipeline_1f1b", "multiply_adds", "run_interleaved",
           "pipeline_order_words"]


def split_sequential(net, cuts, devices):
    """Cut an nn.Sequential before the layer indices in `cuts`; stage i is an independent copy of
    its layers on devices[i] (a copy even on the same device, so stages never share storage)."""
    bounds = [0, *cuts, len(net)]
    if len(bounds) - 1 != len(devices):
        raise ValueError(
            f"{len(cuts)} cuts make {len(bounds) - 1} stages for {len(devices)} devices")
    return [copy.deepcopy(net[a:b]).to(d) for a, b, d in zip(bounds, bounds[1:], devices)]  # noqa: B905


def network_split_forward(stages, X, devices, log=None):
    """Run X through the stages in turn, moving each activation to the next stage's device."""
    X = X.to(devices[0])
    for i, stage in enumerate(stages):
        if i > 0:
            X = send(X, i - 1, i, devices, log, "activation")
        X = stage(X)
    return X


def run_schedule(stages, X, y, loss, devices, orders, log=None, timed=False):
    """Forward and backward of one step, each stage running its `orders` (gpipe_order,
    one_f_one_b_order) on its device; returns (mean loss, schedule).

    The stages' .grad accumulate the gradient of the mean loss over the whole batch. `schedule`
    lists what ran, in the order it ran: dict(stage, micro, phase, tick, start, end, live), start
    and end in seconds since the step began, `live` the micro-batches whose activations the stage
    holds after the op. timed=True waits for each op's device, so end - start is its busy time.
    """
    m, p, n = validate_orders(orders), len(stages), X.shape[0]
    Xs, ys = X.tensor_split(m), y.tensor_split(m)
    inputs, outputs = [{} for _ in range(p)], [{} for _ in range(p)]   # kept for backward
    handoff = [{} for _ in range(p)]      # input gradients, waiting to go back a stage
    ticks = clock_ticks(orders)
    host = rank_clock()                   # an op starts when the host issues it
    done = [rank_clock([d] if timed else ()) for d in devices]   # timed: once its device ran it
    schedule, total, t0 = [], 0.0, host()
    for (s, phase, j), tick in sorted(ticks.items(), key=lambda kv: (kv[1], kv[0][0])):
        start = host()
        if phase == "F":
            inputs[s][j], outputs[s][j] = stage_forward(stages, s, j, Xs, outputs, devices, log)
        else:
            total = total + stage_backward(stages, s, j, ys, n, inputs, outputs, handoff,
                                           loss, devices, log)
        schedule.append(dict(stage=s, micro=j, phase=phase, tick=tick, start=start - t0,
                             end=done[s]() - t0, live=len(outputs[s])))
    return float(total), schedule


def stage_forward(stages, s, j, Xs, outputs, devices, log=None):
    """Stage s's forward of micro-batch j: its input (the batch, or the previous stage's output
    cut out of the graph, so each stage's backward runs on its own) and its output."""
    if s == 0:
        h = Xs[j].to(devices[0])
    else:
        h = send(outputs[s - 1][j].detach(), s - 1, s, devices, log, "activation")
        h.requires_grad_()
    return h, stages[s](h)


def stage_backward(stages, s, j, ys, n, inputs, outputs, handoff, loss, devices, log=None):
    """Stage s's backward of micro-batch j; frees its activations and leaves its input gradient
    for the stage before. The last stage starts from the loss, divided by the WHOLE batch size n
    so that the micro-batches' gradients add up to the mean loss's. Returns its loss (or 0)."""
    l = 0.0
    if s == len(stages) - 1:
        l = loss(outputs[s][j], ys[j].to(devices[s])).sum() / n
        l.backward()
        l = l.detach()
    else:
        grad = send(handoff[s + 1].pop(j), s + 1, s, devices, log, "gradient")
        outputs[s][j].backward(grad)
    h, _ = inputs[s].pop(j), outputs[s].pop(j)
    if s > 0:
        handoff[s][j] = h.grad
    return l


def pipeline_step(stages, X, y, loss, devices, num_microbatches, log=None, timed=False):
    """One GPipe step with `num_microbatches` micro-batches; returns (mean loss, schedule)."""
    orders = gpipe_order(len(stages), num_microbatches)
    return run_schedule(stages, X, y, loss, devices, orders, log, timed)


def pipeline_1f1b(stages, X, y, loss, devices, num_microbatches, log=None, timed=False):
    """One 1F1B step with `num_microbatches` micro-batches; returns (mean loss, schedule)."""
    orders = one_f_one_b_order(len(stages), num_microbatches)
    return run_schedule(stages, X, y, loss, devices, orders, log, timed)


def run_interleaved(chunks, X, y, loss, devices, orders, log=None):
    """One step of an interleaved schedule (schedules.interleaved_order): `chunks` are the v*p
    pieces of the model in order, chunk c*p + d on devices[d]; orders[d] lists device d's
    (phase, micro-batch, chunk). Runs tick by tick (interleaved_ticks); returns (mean loss,
    schedule) with one entry per op: stage (the device), chunk, micro, phase, tick, start, end,
    live (micro-batches whose activations the device holds, over all its chunks)."""
    p = len(devices)
    v = len(chunks) // p
    if v * p != len(chunks) or v < 1:
        raise ValueError(f"{len(chunks)} chunks cannot be spread evenly over {p} devices")
    m = sum(1 for op in orders[0] if op[0] == "F") // v
    placed = [devices[q % p] for q in range(len(chunks))]   # virtual stage q -> its device
    Xs, ys, n = X.tensor_split(m), y.tensor_split(m), X.shape[0]
    inputs, outputs = [{} for _ in chunks], [{} for _ in chunks]
    handoff = [{} for _ in chunks]
    ticks = interleaved_ticks(orders, v)
    host = rank_clock()
    schedule, total, t0 = [], 0.0, host()
    for (d, phase, j, c), tick in sorted(ticks.items(), key=lambda kv: (kv[1], kv[0][0])):
        q, start = c * p + d, host()
        if phase == "F":
            inputs[q][j], outputs[q][j] = stage_forward(chunks, q, j, Xs, outputs, placed, log)
        else:
            total = total + stage_backward(chunks, q, j, ys, n, inputs, outputs, handoff, loss,
                                           placed, log)
        live = sum(len(outputs[c2 * p + d]) for c2 in range(v))
        schedule.append(dict(stage=d, chunk=c, micro=j, phase=phase, tick=tick,
                             start=start - t0, end=host() - t0, live=live))
    return float(total), schedule


def multiply_adds(net, input_shape):
    """Multiply-adds of one example's forward through each top-level layer of an nn.Sequential
    (convolutions and dense layers; the rest counted as 0)."""
    counts = []
    h = torch.zeros((1, *input_shape), device=next(net.parameters()).device)
    with torch.no_grad():
        for layer in net:
            out = layer(h)
            macs = 0
            for mod in layer.modules():
                if isinstance(mod, torch.nn.Linear):
                    macs += out.numel() // out.shape[-1] * mod.in_features * mod.out_features
                elif isinstance(mod, torch.nn.Conv2d):
                    k = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
                    macs += out.numel() * k
            counts.append(macs)
            h = out
    return counts


def pipeline_order_words(one_times, pipe_times, simulated, micro_examples):
    """The network-split chapter's words for the pipelined step against one device, from the
    seconds of each run: faster or slower only where every run says so (the spreads do not
    overlap), else within noise. A cause is offered as possible, never as measured: the runs
    time the steps, not why they differ (`micro_examples`: examples per micro-batch)."""
    if not one_times or not pipe_times:
        raise ValueError("pass the seconds of at least one run of each step")
    if max(pipe_times) < min(one_times):
        why = (f"on a CPU, the {micro_examples}-example micro-batches may fit the caches better "
               "than the whole batch does" if simulated else
               "the launches of the two GPUs may have overlapped")
        return ("faster than one device in every run. That is not devices working at once; a "
                f"possible cause, not measured here: {why}")
    if min(pipe_times) > max(one_times):
        return ("slower than one device in every run; a possible cause, not measured here: the "
                "split's extra work (copies, bookkeeping, smaller matrix products)")
    return "within noise of one device: their spreads overlap, so this run cannot tell them apart"
