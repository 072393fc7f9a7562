"""The checks of Part VI's pipeline chapter (helpers/checks/pipeline_dist.py): the worked
answers (taken from the notebook's solution cells: tests/part6_solutions.py), shortcuts of
different kinds, known cheats among them, with the words of their messages, and other right
answers (tests/check_cases.py)."""
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from check_cases import other, parametrize_cases, shortcut, worked
from part6_solutions import REFUSED, solution

import helpers

for check, notebook, name in [
        ("check_idle_share", "pipeline_dist.ipynb", "idle_share"),
        ("check_pipeline_forward", "pipeline_dist.ipynb", "pipeline_forward"),
        ("check_cuts_for_times", "pipeline_dist.ipynb", "cuts_for_times"),
        ("check_microbatches_for", "pipeline_dist.ipynb", "microbatches_for")]:
    worked(check)(solution(notebook, name, __name__))


# ---- idle share ---------------------------------------------------------------------------------
@shortcut("check_idle_share", "the equal-stage formula", "assumes equal stages")
def idle_formula(timelines):
    p = len(timelines)
    m = sum(e["phase"] == "F" for e in timelines[0])
    return (p - 1) / (m + p - 1)


@shortcut("check_idle_share", "each rank's own span", "whole step")
def idle_own_span(timelines):
    shares = []
    for tl in timelines:
        span = max(e["end"] for e in tl) - min(e["start"] for e in tl)
        shares.append(1 - sum(e["end"] - e["start"] for e in tl) / span)
    return sum(shares) / len(shares)


@shortcut("check_idle_share", "the course's timeline_bubble", REFUSED)
def idle_reference(timelines):
    return helpers.timeline_bubble(timelines)


@other("check_idle_share", "numpy, returning np.float64")
def idle_numpy(timelines):
    starts = np.array([e["start"] for tl in timelines for e in tl])
    ends = np.array([e["end"] for tl in timelines for e in tl])
    return 1 - (ends - starts).sum() / (len(timelines) * (ends.max() - starts.min()))


# ---- a forward-only pipeline --------------------------------------------------------------------
@shortcut("check_pipeline_forward", "no pipelining (each rank computes the whole batch "
          "once, then sends it in pieces)", "ran its stage once")
def forward_whole_batch(stage, comm, X, num_microbatches, batch_size, in_shape):
    r, p, m = comm.rank, comm.world, num_microbatches
    rows = [len(c) for c in torch.arange(batch_size).tensor_split(m)]
    with torch.no_grad():
        if r == 0:
            h = X
        else:
            h = torch.cat([comm.recv(r - 1, (rows[j], *in_shape), tag=j) for j in range(m)])
        out = stage(h)
        if r < p - 1:
            for j, piece in enumerate(out.tensor_split(m)):
                comm.send(piece, r + 1, tag=j)
    comm.wait()
    return out if r == p - 1 else None


@shortcut("check_pipeline_forward", "receives every micro-batch before computing one",
          "before it computed micro-batch")
def forward_receive_all_first(stage, comm, X, num_microbatches, batch_size, in_shape):
    r, p, m = comm.rank, comm.world, num_microbatches
    rows = [len(c) for c in torch.arange(batch_size).tensor_split(m)]
    inputs = (list(X.tensor_split(m)) if r == 0 else
              [comm.recv(r - 1, (rows[j], *in_shape), tag=j) for j in range(m)])
    outs = []
    with torch.no_grad():
        for j, h in enumerate(inputs):
            outs.append(stage(h))
            if r < p - 1:
                comm.send(outs[-1], r + 1, tag=j)
    comm.wait()
    return torch.cat(outs) if r == p - 1 else None


@shortcut("check_pipeline_forward", "one message of the whole batch", "one per micro-batch")
def forward_one_message(stage, comm, X, num_microbatches, batch_size, in_shape):
    r, p = comm.rank, comm.world
    with torch.no_grad():
        h = X if r == 0 else comm.recv(r - 1, (batch_size, *in_shape))
        out = stage(h)
    if r < p - 1:
        comm.send(out, r + 1)
    comm.wait()
    return out if r == p - 1 else None


@other("check_pipeline_forward", "torch.distributed isend/recv, tag 0 throughout")
def forward_torch_distributed(stage, comm, X, num_microbatches, batch_size, in_shape):
    r, p, m = dist.get_rank(), dist.get_world_size(), num_microbatches
    outs, pending = [], []
    with torch.no_grad():
        for j, rows in enumerate(torch.arange(batch_size).tensor_split(m)):
            if r == 0:
                h = X.tensor_split(m)[j]
            else:
                h = torch.empty(len(rows), *in_shape)
                dist.recv(h, r - 1)
            out = stage(h)
            if r < p - 1:
                pending.append(dist.isend(out.contiguous(), r + 1))
            outs.append(out)
    for work in pending:
        work.wait()
    return torch.cat(outs) if r == p - 1 else None


# ---- cuts by measured time ----------------------------------------------------------------------
@shortcut("check_cuts_for_times", "equal layer counts", "same number of layers")
def cuts_equal_counts(times, p):
    return [round(len(times) * i / p) for i in range(1, p)]


@shortcut("check_cuts_for_times", "the course's balanced_cuts (used in the chapter)", REFUSED)
def cuts_reference(times, p):
    return helpers.balanced_cuts(times, p)


@shortcut("check_cuts_for_times", "a greedy prefix cut", "slowest stage")
def cuts_greedy(times, p):
    target, cuts, acc = sum(times) / p, [], 0.0
    for i, t in enumerate(times[:-1]):
        acc += t
        if acc >= target and len(cuts) < p - 1:
            cuts.append(i + 1)
            acc = 0.0
    while len(cuts) < p - 1:
        cuts.append(cuts[-1] + 1 if cuts else 1)
    return cuts


@other("check_cuts_for_times", "every cut tried, numpy ints")
def cuts_brute_force(times, p):
    import itertools
    best = None
    for cuts in itertools.combinations(range(1, len(times)), p - 1):
        bounds = [0, *cuts, len(times)]
        slowest = max(sum(times[a:b]) for a, b in zip(bounds, bounds[1:]))
        if best is None or slowest < best[0]:
            best = (slowest, cuts)
    return [np.int64(c) for c in best[1]]


# ---- micro-batches PyTorch accepts --------------------------------------------------------------
@shortcut("check_microbatches_for", "keeps the count it wanted", "refuse")
def microbatches_unchanged(batch_size, wanted):
    return wanted


@shortcut("check_microbatches_for", "one micro-batch, always accepted", "closer")
def microbatches_one(batch_size, wanted):
    return 1


@shortcut("check_microbatches_for", "rounds down on a tie", "take the larger")
def microbatches_round_down(batch_size, wanted):
    ok = [m for m in range(1, batch_size + 1) if batch_size % m == 0]
    return min(ok, key=lambda m: (abs(m - wanted), m))


@other("check_microbatches_for", "searching outwards from the count wanted")
def microbatches_outwards(batch_size, wanted):
    for d in range(batch_size):
        for m in (wanted + d, wanted - d):
            if 1 <= m <= batch_size and batch_size % m == 0:
                return m


# ---- the weight gradient, later (zero bubble) ---------------------------------------------------
worked("check_weight_grads")(solution("pipeline_dist.ipynb", "weight_grads", __name__))


@shortcut("check_weight_grads", "the transpose", "the transpose")
def wgrad_transposed(x, dy):
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    return x2.T @ dy2, dy2.sum(0)


@shortcut("check_weight_grads", "the forward run again, through autograd", "forward again")
def wgrad_autograd(x, dy):
    w = torch.zeros(dy.shape[-1], x.shape[-1], requires_grad=True)
    b = torch.zeros(dy.shape[-1], requires_grad=True)
    return torch.autograd.grad(F.linear(x, w, b), (w, b), dy)


@shortcut("check_weight_grads", "the bias summed over the last rows only", "bias")
def wgrad_bias_rows(x, dy):
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    return dy2.T @ x2, dy.sum(-2) if dy.dim() > 2 else dy2.mean(0)


@other("check_weight_grads", "einsum over the leading dimensions")
def wgrad_einsum(x, dy):
    return torch.einsum("...o,...i->oi", dy, x), dy.sum(dim=tuple(range(dy.dim() - 1)))


@other("check_weight_grads", "one product per batch element, summed (3-D x)")
def wgrad_loop(x, dy):
    if x.dim() == 2:
        return dy.T @ x, dy.sum(0)
    return sum(dy[b].T @ x[b] for b in range(x.shape[0])), dy.sum((0, 1))


@other("check_weight_grads", "torch.func.vmap of an outer product, summed (a process's first vmap)")
def wgrad_vmap(x, dy):
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    return torch.func.vmap(torch.outer)(dy2, x2).sum(0), dy2.sum(0)


@other("check_weight_grads", "an outer product per example, accumulated")
def wgrad_rows(x, dy):
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    dW = torch.zeros(dy2.shape[1], x2.shape[1])
    for n in range(x2.shape[0]):
        dW += dy2[n, :, None] @ x2[n, None, :]
    return dW, dy2.sum(0)


@shortcut("check_weight_grads", "the forward again with no product op (mul, sum), through "
          "autograd", "forward again")
def wgrad_forward_elementwise(x, dy):
    w = torch.zeros(dy.shape[-1], x.shape[-1], requires_grad=True)
    b = torch.zeros(dy.shape[-1], requires_grad=True)
    return torch.autograd.grad((x.unsqueeze(-2) * w).sum(-1) + b, (w, b), dy)


@shortcut("check_weight_grads", "the forward again through torch.func.vjp", "forward again")
def wgrad_forward_vjp(x, dy):
    from torch.func import vjp
    _, back = vjp(lambda w, b: (x[..., None, :] * w).sum(-1) + b,
                  torch.zeros(dy.shape[-1], x.shape[-1]), torch.zeros(dy.shape[-1]))
    return back(dy)


@shortcut("check_weight_grads", "a forward by hand (x W^T + b, no autograd) beside dy^T x",
          "a weight")
def wgrad_forward_by_hand(x, dy):
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    y = F.linear(x2, torch.randn(dy2.shape[1], x2.shape[1]), torch.zeros(dy2.shape[1]))
    return dy2.T @ x2 + 0 * y.sum(), dy2.sum(0)


@shortcut("check_weight_grads", "the forward again with a stand-in weight made from dy, "
          "through autograd", "autograd's engine ran")
def wgrad_forward_dy_weight(x, dy):
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    w = dy2[:1].T.expand(-1, x2.shape[1]).clone().requires_grad_()
    b = dy2[0].clone().requires_grad_()
    return torch.autograd.grad(F.linear(x2, w, b), (w, b), dy2)


test_case = parametrize_cases(__name__)
