"""The Part VI exercise checks (helpers/checks/pipeline_dist.py, tensor_parallel_dist.py,
mesh2d.py): the worked
answers (taken from the notebooks' solution cells), shortcuts of different kinds, known cheats
among them, with the words of their messages, and other right answers
(tests/check_cases.py)."""
import json

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from book_files import ROOT
from check_cases import other, parametrize_cases, shortcut, worked

import helpers
from helpers.tensor_parallel.scratch import copy_to_tp, reduce_from_tp

REFUSED = "the course's own answer"     # the harness's words for a reference shortcut


def solution(notebook, name):
    """The function `name` as the notebook's solution cell defines it."""
    nb = json.loads((ROOT / "book" / "part6" / notebook).read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if "solution" in cell["metadata"].get("tags", []) and f"def {name}(" in src:
            space = {"torch": torch, "helpers": helpers, "copy_to_tp": copy_to_tp,
                     "reduce_from_tp": reduce_from_tp, "__name__": __name__}
            exec(compile(src, f"{notebook}:{name}", "exec"), space)
            return space[name]
    raise LookupError(f"{notebook} has no solution cell defining {name}")


for check, notebook, name in [
        ("check_idle_share", "pipeline_dist.ipynb", "idle_share"),
        ("check_pipeline_forward", "pipeline_dist.ipynb", "pipeline_forward"),
        ("check_cuts_for_times", "pipeline_dist.ipynb", "cuts_for_times"),
        ("check_microbatches_for", "pipeline_dist.ipynb", "microbatches_for"),
        ("check_row_parallel_linear", "tensor_parallel_dist.ipynb", "row_parallel_linear"),
        ("check_megatron_mlp", "tensor_parallel_dist.ipynb", "megatron_mlp_rank"),
        ("check_tp_ring_bytes", "tensor_parallel_dist.ipynb", "tp_ring_bytes"),
        ("check_mesh_groups", "mesh2d.ipynb", "mesh_groups"),
        ("check_dp_average", "mesh2d.ipynb", "dp_average"),
        ("check_local_shape", "mesh2d.ipynb", "local_shape")]:
    worked(check)(solution(notebook, name))


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


# ---- row-parallel linear ------------------------------------------------------------------------
@shortcut("check_row_parallel_linear", "no all-reduce", "only its partial sum")
def row_no_allreduce(x_shard, w_shard, b, comm):
    return x_shard @ w_shard.T + b


@shortcut("check_row_parallel_linear", "the bias added on every rank first", "counts")
def row_bias_first(x_shard, w_shard, b, comm):
    out = x_shard @ w_shard.T + b
    comm.all_reduce(out)
    return out


@shortcut("check_row_parallel_linear", "all-gathers the inputs and weights", "exactly one")
def row_gather_everything(x_shard, w_shard, b, comm):
    k = comm.world
    xs, ws = [torch.empty_like(x_shard) for _ in range(k)], [torch.empty_like(w_shard)
                                                              for _ in range(k)]
    dist.all_gather(xs, x_shard)
    dist.all_gather(ws, w_shard)
    return torch.cat(xs, -1) @ torch.cat(ws, 1).T + b


@other("check_row_parallel_linear", "b / k added before the all-reduce (right)")
def row_bias_split(x_shard, w_shard, b, comm):
    out = x_shard @ w_shard.T + b / comm.world
    dist.all_reduce(out)
    return out


# ---- Megatron MLP -------------------------------------------------------------------------------
@shortcut("check_megatron_mlp", "no f", "backward")
def mlp_no_f(x, up_w, up_b, down_w, down_b, comm):
    h = F.gelu(x @ up_w.T + up_b)
    return reduce_from_tp(h @ down_w.T, comm) + down_b


@shortcut("check_megatron_mlp", "rebuilds the weights", "rebuilds weights")
def mlp_rebuilt(x, up_w, up_b, down_w, down_b, comm):
    k = comm.world
    ups = [torch.empty_like(up_w) for _ in range(k)]
    dist.all_gather(ups, up_w.detach())
    h = F.gelu(x @ torch.cat(ups).T)
    return h[:, :up_w.shape[0]] @ down_w.T + down_b


@shortcut("check_megatron_mlp", "the course's TPMLP", REFUSED)
def mlp_reference(x, up_w, up_b, down_w, down_b, comm):
    return helpers.TPMLP


class _OwnF(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


@other("check_megatron_mlp", "its own autograd f over torch.distributed (right)")
def mlp_own_f(x, up_w, up_b, down_w, down_b, comm):
    h = F.gelu(_OwnF.apply(x) @ up_w.T + up_b)
    return reduce_from_tp(h @ down_w.T, comm) + down_b


# ---- TP ring bytes ------------------------------------------------------------------------------
@shortcut("check_tp_ring_bytes", "forward only", "forward only")
def tp_bytes_forward(batch, seq, width, k):
    return 2 * batch * seq * width * 4 * 2 * (k - 1) / k


@shortcut("check_tp_ring_bytes", "the batch left out", "leaves out the batch")
def tp_bytes_no_batch(batch, seq, width, k):
    return 4 * seq * width * 4 * 2 * (k - 1) / k


@shortcut("check_tp_ring_bytes", "the payload, no ring", "that is the payload")
def tp_bytes_payload(batch, seq, width, k):
    return 4 * batch * seq * width * 4


@shortcut("check_tp_ring_bytes", "the course's ring_bytes_per_device", REFUSED)
def tp_bytes_reference(batch, seq, width, k):
    return 4 * helpers.ring_bytes_per_device(batch * seq * width * 4, k)


@other("check_tp_ring_bytes", "an integer, with numpy")
def tp_bytes_numpy(batch, seq, width, k):
    return np.int64(8 * batch * seq * width * 4 * (k - 1) // k)


# ---- mesh groups --------------------------------------------------------------------------------
@shortcut("check_mesh_groups", "the groups swapped", "swapped")
def groups_swapped(rank, dp, tp):
    i, j = divmod(rank, tp)
    return dict(coords=(i, j), tp_group=[r * tp + j for r in range(dp)],
                dp_group=[i * tp + c for c in range(tp)])


@shortcut("check_mesh_groups", "column-major coordinates", "coords")
def groups_column_major(rank, dp, tp):
    j, i = divmod(rank, dp)
    return dict(coords=(i, j), tp_group=[i * tp + c for c in range(tp)],
                dp_group=[r * tp + j for r in range(dp)])


@other("check_mesh_groups", "read off an arange")
def groups_arange(rank, dp, tp):
    mesh = torch.arange(dp * tp).view(dp, tp)
    i, j = (mesh == rank).nonzero()[0].tolist()
    return dict(coords=(i, j), tp_group=mesh[i].tolist(), dp_group=mesh[:, j].tolist())


# ---- dp average ---------------------------------------------------------------------------------
@shortcut("check_dp_average", "divides only, no communication", "never called all_reduce")
def dp_divide_only(grads, comm):
    for g in grads:
        g /= comm.world


@shortcut("check_dp_average", "sums without dividing", "holds the sum")
def dp_sum_only(grads, comm):
    for g in grads:
        comm.all_reduce(g)


@shortcut("check_dp_average", "all-reduces a clone it drops", "in place")
def dp_clone(grads, comm):
    for g in grads:
        comm.all_reduce(g.clone())
        g /= comm.world


@other("check_dp_average", "one flat all-reduce, written back")
def dp_flat(grads, comm):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.AVG)
    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))


# ---- local shape --------------------------------------------------------------------------------
@shortcut("check_local_shape", "floor division (wrong only when tp does not divide)",
          "torch.chunk")
def local_shape_floor(shape, split_dim, dp, tp, dp_rank):
    shape = list(shape)
    if split_dim is not None:
        shape[split_dim] //= tp
    shape[0] //= dp
    return tuple(shape)


@shortcut("check_local_shape", "the tensor-parallel slice only", "shards it again")
def local_shape_tp_only(shape, split_dim, dp, tp, dp_rank):
    shape = list(shape)
    if split_dim is not None:
        shape[split_dim] //= tp
    return tuple(shape)


@other("check_local_shape", "torch.chunk on a meta tensor, FSDP's way")
def local_shape_chunk(shape, split_dim, dp, tp, dp_rank):
    t = torch.empty(shape, device="meta")
    if split_dim is not None:
        t = t.chunk(tp, split_dim)[0]
    pieces = t.chunk(dp, 0)
    if dp_rank < len(pieces):
        return tuple(pieces[dp_rank].shape)
    return (0, *t.shape[1:])




# ---- the loss over a split vocabulary -----------------------------------------------------------
worked("check_vocab_loss")(solution("tensor_parallel_dist.ipynb", "vocab_loss"))


@shortcut("check_vocab_loss", "gathers the logits", "gathered the logits")
def vocab_gathered(logits, target, comm, start):
    parts = [torch.empty_like(logits) for _ in range(comm.world)]
    dist.all_gather(parts, logits.detach())
    parts[comm.rank] = logits
    return F.cross_entropy(torch.cat(parts, -1), target)


@shortcut("check_vocab_loss", "its own columns only, no communication", "never communicated")
def vocab_local(logits, target, comm, start):
    local = (target - start).clamp(0, logits.shape[-1] - 1)
    return F.cross_entropy(logits, local)


@shortcut("check_vocab_loss", "no maximum taken out", "overflowed")
def vocab_no_max(logits, target, comm, start):
    total = reduce_from_tp(logits.exp().sum(-1), comm)
    local = target - start
    mine = (local >= 0) & (local < logits.shape[-1])
    picked = logits.gather(-1, local.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    return (total.log() - reduce_from_tp(picked * mine, comm)).mean()


@shortcut("check_vocab_loss", "the course's vocab_parallel_cross_entropy", REFUSED)
def vocab_reference(logits, target, comm, start):
    return helpers.vocab_parallel_cross_entropy(logits, target, comm, start)


class _SumAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


@other("check_vocab_loss", "log-sum-exp per rank, combined with its own g")
def vocab_lse(logits, target, comm, start):
    top = logits.detach().amax(-1)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    total = _SumAll.apply(torch.exp(torch.logsumexp(logits, -1) - top))
    onehot = F.one_hot((target - start).clamp(0, logits.shape[-1] - 1), logits.shape[-1])
    mine = ((target >= start) & (target < start + logits.shape[-1])).unsqueeze(-1)
    picked = _SumAll.apply((logits * onehot * mine).sum(-1))
    return (total.log() + top - picked).mean()




# ---- the weight gradient, later (zero bubble) ---------------------------------------------------
worked("check_weight_grads")(solution("pipeline_dist.ipynb", "weight_grads"))


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
