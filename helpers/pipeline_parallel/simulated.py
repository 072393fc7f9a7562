"""Part I: one training step split across layers (network split, GPipe pipeline) or within a layer.

Every function takes `devices`, a list that may repeat a device (simulated GPUs): the results
agree with one device up to float32 rounding either way. Transfers are logged by position in
`devices`, so simulated devices count the bytes that real ones would send.
"""
import copy
import time

import torch
from torch.nn import functional as F

from .devices import synchronize

__all__ = ["CommLog", "send", "all_close", "split_sequential", "network_split_forward",
           "pipeline_step", "bubble_fraction", "schedule_bubble", "plot_schedule",
           "gpipe_order", "one_f_one_b_order", "check_orders", "clock_ticks", "run_schedule",
           "stage_forward", "stage_backward", "pipeline_1f1b", "replay", "measured_bubble",
           "peak_live", "multiply_adds", "plot_live",
           "conv_split_channels", "dense_split_columns", "dense_split_rows", "lenet_within_layer"]


class CommLog:
    """The transfers between devices: (from index, to index, bytes, what)."""

    def __init__(self):
        self.transfers = []

    def add(self, src, dst, nbytes, what=""):
        self.transfers.append((src, dst, nbytes, what))

    def total(self, what=None):
        """Bytes moved in all (or only those labelled `what`)."""
        return sum(b for _, _, b, w in self.transfers if what is None or w == what)

    def sent_by(self, i):
        """Bytes that device index i sent."""
        return sum(b for s, _, b, _ in self.transfers if s == i)


def send(t, src, dst, devices, log=None, what=""):
    """Move tensor `t` from devices[src] to devices[dst], logging its bytes when src != dst."""
    if log is not None and src != dst:
        log.add(src, dst, t.numel() * t.element_size(), what)
    return t.to(devices[dst])


def all_close(xs, ys, rtol=1e-4, atol=1e-5):
    """True when two tensors (or two lists of tensors) have equal shapes and values within
    rounding."""
    if isinstance(xs, torch.Tensor):
        xs, ys = [xs], [ys]
    return len(xs) == len(ys) and all(
        x.shape == y.shape
        and torch.allclose(x.detach().cpu(), y.detach().cpu(), rtol=rtol, atol=atol)
        for x, y in zip(xs, ys))


# ---- Across layers: network split and the GPipe pipeline ----------------------------------------

def split_sequential(net, cuts, devices):
    """Cut an nn.Sequential before the layer indices in `cuts`; stage i is an independent copy of
    its layers on devices[i] (a copy even on the same device, so stages never share storage)."""
    bounds = [0, *cuts, len(net)]
    if len(bounds) - 1 != len(devices):
        raise ValueError(
            f"{len(cuts)} cuts make {len(bounds) - 1} stages for {len(devices)} devices")
    return [copy.deepcopy(net[a:b]).to(d) for a, b, d in zip(bounds, bounds[1:], devices)]


def network_split_forward(stages, X, devices, log=None):
    """Run X through the stages in turn, moving each activation to the next stage's device."""
    X = X.to(devices[0])
    for i, stage in enumerate(stages):
        if i > 0:
            X = send(X, i - 1, i, devices, log, "activation")
        X = stage(X)
    return X


def gpipe_order(p, m):
    """GPipe's order: every stage runs the forwards of all m micro-batches, then their
    backwards, last micro-batch first. One list of ("F" or "B", micro-batch) per stage."""
    return [[("F", j) for j in range(m)] + [("B", j) for j in reversed(range(m))]
            for _ in range(p)]


def one_f_one_b_order(p, m):
    """1F1B (PipeDream-Flush): stage s runs p-1-s forwards to fill the pipeline, then one
    forward and one backward in turn, then the remaining backwards. Same format as gpipe_order."""
    orders = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        ops = [("F", j) for j in range(warm)]
        for j in range(m - warm):
            ops += [("F", warm + j), ("B", j)]
        orders.append(ops + [("B", j) for j in range(m - warm, m)])
    return orders


def _needs(s, phase, j, p):
    """The op that must have run before (s, phase, j): the previous stage's forward of the same
    micro-batch, the next stage's backward (the last stage: its own forward); None for the first."""
    if phase == "F":
        return (s - 1, "F", j) if s > 0 else None
    return (s + 1, "B", j) if s < p - 1 else (s, "F", j)


def check_orders(orders):
    """The number of micro-batches of per-stage orders, or ValueError naming what is wrong:
    every stage must run the forward and the backward of every micro-batch exactly once."""
    if not isinstance(orders, (list, tuple)) or not orders:
        raise ValueError("expected one list of (phase, micro-batch) per stage")
    m = sum(1 for op in orders[0] if tuple(op)[0] == "F")
    want = sorted([("B", j) for j in range(m)] + [("F", j) for j in range(m)])
    for s, ops in enumerate(orders):
        got = sorted(tuple(op) for op in ops)
        if got != want:
            raise ValueError(f"stage {s} runs {got}; every stage must run ('F', j) and ('B', j) "
                             f"once for each micro-batch j in range({m})")
    return m


def clock_ticks(orders):
    """{(stage, phase, micro): tick}: each stage runs its order one op per clock tick, as soon as
    the op it needs (_needs) ran in an earlier tick. ValueError if some stage would wait forever."""
    p, total = len(orders), sum(len(ops) for ops in orders)
    done, pos, tick = {}, [0] * p, 0
    while len(done) < total:
        ready = []
        for s in range(p):
            if pos[s] < len(orders[s]):
                phase, j = orders[s][pos[s]]
                need = _needs(s, phase, j, p)
                if need is None or done.get(need, tick) < tick:
                    ready.append((s, phase, j))
        if not ready:
            s = min(s for s in range(p) if pos[s] < len(orders[s]))
            phase, j = orders[s][pos[s]]
            raise ValueError(f"deadlock at tick {tick}: stage {s} waits forever for "
                             f"{_needs(s, phase, j, p)} before its {(phase, j)}")
        for s, phase, j in ready:
            done[(s, phase, j)] = tick
            pos[s] += 1
        tick += 1
    return done


def run_schedule(stages, X, y, loss, devices, orders, log=None, timed=False):
    """Forward and backward of one step, each stage running its `orders` (gpipe_order,
    one_f_one_b_order) on its device; returns (mean loss, schedule).

    The stages' .grad accumulate the gradient of the mean loss over the whole batch. `schedule`
    lists what ran, in the order it ran: dict(stage, micro, phase, tick, start, end, live), start
    and end in seconds since the step began, `live` the micro-batches whose activations the stage
    holds after the op. timed=True waits for each op's device, so end - start is its busy time.
    """
    m, p, n = check_orders(orders), len(stages), X.shape[0]
    Xs, ys = X.tensor_split(m), y.tensor_split(m)
    inputs, outputs = [{} for _ in range(p)], [{} for _ in range(p)]   # kept for backward
    handoff = [{} for _ in range(p)]      # input gradients, waiting to go back a stage
    ticks = clock_ticks(orders)
    schedule, total, t0 = [], 0.0, time.perf_counter()
    for (s, phase, j), tick in sorted(ticks.items(), key=lambda kv: (kv[1], kv[0][0])):
        start = time.perf_counter()
        if phase == "F":
            inputs[s][j], outputs[s][j] = stage_forward(stages, s, j, Xs, outputs, devices, log)
        else:
            total = total + stage_backward(stages, s, j, ys, n, inputs, outputs, handoff,
                                           loss, devices, log)
        if timed:
            synchronize([devices[s]])
        schedule.append(dict(stage=s, micro=j, phase=phase, tick=tick, start=start - t0,
                             end=time.perf_counter() - t0, live=len(outputs[s])))
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


def bubble_fraction(p, m):
    """Share of idle device time in a GPipe step with p EQUAL stages and m micro-batches."""
    return (p - 1) / (m + p - 1)


def schedule_bubble(schedule):
    """Idle share counted from a recorded schedule: empty (stage, tick) slots over all slots.
    It counts the slots the schedule built, so it assumes every op takes one tick."""
    p = 1 + max(e["stage"] for e in schedule)
    ticks = 1 + max(e["tick"] for e in schedule)
    return 1 - len({(e["stage"], e["tick"]) for e in schedule}) / (p * ticks)


def replay(schedule):
    """The schedule as it would run with every stage on its own device, all in parallel: each op
    takes its measured time (end - start) and starts when its stage is free and the op it needs
    has finished. Returns a copy with start and end replaced."""
    p = 1 + max(e["stage"] for e in schedule)
    free, finish, out = [0.0] * p, {}, []
    for e in sorted(schedule, key=lambda e: (e["tick"], e["stage"])):
        s = e["stage"]
        start = max(free[s], finish.get(_needs(s, e["phase"], e["micro"], p), 0.0))
        end = start + e["end"] - e["start"]
        finish[(s, e["phase"], e["micro"])] = free[s] = end
        out.append(dict(e, start=start, end=end))
    return out


def measured_bubble(schedule):
    """Time-weighted idle share from the measured busy time of every op: 1 - busy / (p * span)
    of the replayed schedule (see replay). Unequal stages make it larger than (p-1)/(m+p-1)."""
    p = 1 + max(e["stage"] for e in schedule)
    ran = replay(schedule)
    busy = sum(e["end"] - e["start"] for e in ran)
    return 1 - busy / (p * max(e["end"] for e in ran))


def peak_live(schedule):
    """Per stage, the most micro-batches whose activations it held at once, counted from the run."""
    p = 1 + max(e["stage"] for e in schedule)
    return [max(e["live"] for e in schedule if e["stage"] == s) for s in range(p)]


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


def plot_schedule(schedule, ax=None, title=None, clock="tick"):
    """Draw a recorded schedule: one row per device, one box per forward (F) or backward (B);
    clock="tick" places boxes by schedule slot, clock="time" by the measured seconds."""
    import matplotlib.pyplot as plt
    p = 1 + max(e["stage"] for e in schedule)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 1 + 0.5 * p))
    span = lambda e: (e["tick"], 1) if clock == "tick" else (e["start"], e["end"] - e["start"])
    end = max(sum(span(e)) for e in schedule)
    ax.barh(range(p), [end] * p, height=0.8, color="0.93", hatch="//", edgecolor="0.8")
    for e in schedule:
        left, width = span(e)
        ax.barh(e["stage"], width, left=left, height=0.8, edgecolor="white",
                color="tab:blue" if e["phase"] == "F" else "tab:orange")
        if clock == "tick":
            ax.text(left + 0.5, e["stage"], f"{e['phase']}{e['micro']}", ha="center",
                    va="center", color="white", fontsize=8)
    ax.set(yticks=range(p), yticklabels=[f"device {s}" for s in range(p)], xlim=(0, end),
           xlabel="clock tick" if clock == "tick" else "seconds since the step began",
           title=title or f"bubble {schedule_bubble(schedule):.0%}")
    ax.invert_yaxis()
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color="tab:blue", label="forward"),
                       Patch(color="tab:orange", label="backward"),
                       Patch(facecolor="0.93", hatch="//", edgecolor="0.8", label="idle")],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return ax


def plot_live(schedule, ax=None, title=None):
    """Per stage, the micro-batches whose activations it holds, tick by tick (a step plot)."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 2.5))
    p = 1 + max(e["stage"] for e in schedule)
    ticks = 1 + max(e["tick"] for e in schedule)
    for s in range(p):
        live, now = [], 0
        at = {e["tick"]: e["live"] for e in schedule if e["stage"] == s}
        for t in range(ticks):
            now = at.get(t, now)
            live.append(now)
        ax.step(range(ticks), live, where="post", label=f"device {s}")
    ax.set(xlabel="clock tick", ylabel="live micro-batches", title=title, xlim=(0, ticks))
    ax.legend(fontsize=8, frameon=False)
    return ax


# ---- Within a layer: shards of a convolution or a dense layer on k devices ----------------------
# The weight shards are moved to their device inside the call to keep the code short; a real
# system keeps each shard resident on its device, so only activations are logged.

def conv_split_channels(X, W, b, devices, log=None, **conv_args):
    """A convolution with its output channels split over the devices: device i computes its
    channels from the whole input; the outputs are gathered on devices[0]."""
    k, Ys = len(devices), []
    for i, (Wi, bi) in enumerate(zip(W.tensor_split(k), b.tensor_split(k))):
        Xi = send(X, 0, i, devices, log, "input")
        Ys.append(F.conv2d(Xi, Wi.to(devices[i]), bi.to(devices[i]), **conv_args))
    return torch.cat([send(Y, i, 0, devices, log, "output") for i, Y in enumerate(Ys)], dim=1)


def dense_split_columns(X, W, b, devices, log=None):
    """X @ W + b with W (in, out) split by columns (output units): device i computes its outputs
    from the whole input; the outputs are gathered on devices[0]."""
    k, Ys = len(devices), []
    for i, (Wi, bi) in enumerate(zip(W.tensor_split(k, dim=1), b.tensor_split(k))):
        Xi = send(X, 0, i, devices, log, "input")
        Ys.append(torch.mm(Xi, Wi.to(devices[i])) + bi.to(devices[i]))
    return torch.cat([send(Y, i, 0, devices, log, "output") for i, Y in enumerate(Ys)], dim=1)


def dense_split_rows(X, W, b, devices, log=None):
    """X @ W + b with W split by rows (input features): device i multiplies its slice of the
    features by its rows, giving a partial sum of the WHOLE output; the partial sums are added up
    on devices[0], and the bias is added once, after the sum."""
    k = len(devices)
    shards = zip(X.tensor_split(k, dim=1), W.tensor_split(k))
    partials = [torch.mm(send(Xi, 0, i, devices, log, "input"), Wi.to(devices[i]))
                for i, (Xi, Wi) in enumerate(shards)]
    Y = sum(send(P, i, 0, devices, log, "partial sum") for i, P in enumerate(partials))
    return Y + b.to(devices[0])


def lenet_within_layer(X, params, devices, log=None):
    """helpers.lenet with every layer split over the devices by output channels or units."""
    W1, b1, W2, b2, W3, b3, W4, b4 = params
    h1 = F.avg_pool2d(F.relu(conv_split_channels(X, W1, b1, devices, log)), kernel_size=2, stride=2)
    h2 = F.avg_pool2d(F.relu(conv_split_channels(h1, W2, b2, devices, log)), kernel_size=2,
                      stride=2)
    h2 = h2.reshape(h2.shape[0], -1)
    h3 = F.relu(dense_split_columns(h2, W3, b3, devices, log))
    return dense_split_columns(h3, W4, b4, devices, log)
