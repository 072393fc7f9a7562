"""Part I: one training step split across layers (network split, GPipe pipeline) or within a layer.

Every function takes `devices`, a list that may repeat a device (simulated GPUs): the results are
the same either way (up to float32 rounding against the unsplit model). Transfers are logged by position in `devices`, so simulated devices count the
bytes that real ones would send.
"""
import copy
import time

import torch
from torch.nn import functional as F

__all__ = ["CommLog", "send", "all_close", "split_sequential", "network_split_forward",
           "pipeline_step", "bubble_fraction", "schedule_bubble", "plot_schedule",
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
    """True when two tensors (or two lists of tensors) have equal shapes and values within rounding."""
    if isinstance(xs, torch.Tensor):
        xs, ys = [xs], [ys]
    return len(xs) == len(ys) and all(
        x.shape == y.shape and torch.allclose(x.detach().cpu(), y.detach().cpu(), rtol=rtol, atol=atol)
        for x, y in zip(xs, ys))


# ---- Across layers: network split and the GPipe pipeline ------------------------------------------

def split_sequential(net, cuts, devices):
    """Cut an nn.Sequential before the layer indices in `cuts`; stage i is an independent copy of
    its layers on devices[i] (a copy even on the same device, so stages never share storage)."""
    bounds = [0, *cuts, len(net)]
    if len(bounds) - 1 != len(devices):
        raise ValueError(f"{len(cuts)} cuts make {len(bounds) - 1} stages for {len(devices)} devices")
    return [copy.deepcopy(net[a:b]).to(d) for a, b, d in zip(bounds, bounds[1:], devices)]


def network_split_forward(stages, X, devices, log=None):
    """Run X through the stages in turn, moving each activation to the next stage's device."""
    X = X.to(devices[0])
    for i, stage in enumerate(stages):
        if i > 0:
            X = send(X, i - 1, i, devices, log, "activation")
        X = stage(X)
    return X


def pipeline_step(stages, X, y, loss, devices, num_microbatches, log=None):
    """Forward and backward of one GPipe step; returns (mean loss, schedule).

    The batch is cut into micro-batches. At clock tick t, stage s runs the forward of micro-batch
    t - s; after all forwards, the backwards run in reverse. The stages' .grad accumulate the
    gradient of the mean loss over the whole batch, as one unsplit step would.
    `schedule` lists what ran: dict(stage, micro, phase 'F' or 'B', tick, start, end), with start
    and end in seconds since the step began (when Python issued the work).
    """
    p, m, n = len(stages), num_microbatches, X.shape[0]
    Xs, ys = X.tensor_split(m), y.tensor_split(m)
    inputs = [[None] * m for _ in range(p)]    # each stage keeps its inputs and outputs for backward
    outputs = [[None] * m for _ in range(p)]
    schedule, total, t0 = [], 0.0, time.perf_counter()

    def record(s, j, phase, tick, start):
        schedule.append(dict(stage=s, micro=j, phase=phase, tick=tick, start=start - t0,
                             end=time.perf_counter() - t0))

    for tick in range(m + p - 1):              # forward: micro-batch j reaches stage s at tick j+s
        for s in range(p):
            j = tick - s
            if 0 <= j < m:
                start = time.perf_counter()
                if s == 0:
                    h = Xs[j].to(devices[0])
                else:
                    h = send(outputs[s - 1][j].detach(), s - 1, s, devices, log, "activation")
                    h.requires_grad_()
                inputs[s][j], outputs[s][j] = h, stages[s](h)
                record(s, j, "F", tick, start)
    for tick in range(m + p - 1):              # backward: last stage, last micro-batch first
        for s in reversed(range(p)):
            j = m - 1 - tick + (p - 1 - s)
            if 0 <= j < m:
                start = time.perf_counter()
                if s == p - 1:
                    l = loss(outputs[s][j], ys[j].to(devices[s])).sum() / n
                    l.backward()
                    total = total + l.detach()
                else:
                    grad = send(inputs[s + 1][j].grad, s + 1, s, devices, log, "gradient")
                    outputs[s][j].backward(grad)
                record(s, j, "B", m + p - 1 + tick, start)
    return float(total), schedule


def bubble_fraction(p, m):
    """Share of idle device time in a GPipe step with p stages and m micro-batches."""
    return (p - 1) / (m + p - 1)


def schedule_bubble(schedule):
    """Idle share measured from a recorded schedule: empty (stage, tick) slots over all slots."""
    p = 1 + max(e["stage"] for e in schedule)
    ticks = 1 + max(e["tick"] for e in schedule)
    return 1 - len({(e["stage"], e["tick"]) for e in schedule}) / (p * ticks)


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
    h2 = F.avg_pool2d(F.relu(conv_split_channels(h1, W2, b2, devices, log)), kernel_size=2, stride=2)
    h2 = h2.reshape(h2.shape[0], -1)
    h3 = F.relu(dense_split_columns(h2, W3, b3, devices, log))
    return dense_split_columns(h3, W4, b4, devices, log)
