"""The checks of Part VI's tensor-parallel chapter (helpers/checks/tensor_parallel_dist.py): the
worked answers (taken from the notebook's solution cells: tests/part6_solutions.py), shortcuts of
different kinds, known cheats among them, with the words of their messages, and other right
answers (tests/check_cases.py)."""
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from check_cases import other, parametrize_cases, shortcut, worked
from part6_solutions import REFUSED, solution

import helpers
from helpers.tensor_parallel.scratch import reduce_from_tp

for check, notebook, name in [
        ("check_row_parallel_linear", "tensor_parallel_dist.ipynb", "row_parallel_linear"),
        ("check_megatron_mlp", "tensor_parallel_dist.ipynb", "megatron_mlp_rank"),
        ("check_tp_ring_bytes", "tensor_parallel_dist.ipynb", "tp_ring_bytes")]:
    worked(check)(solution(notebook, name, __name__))


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


@shortcut("check_tp_ring_bytes", "each ring all-reduce counted as (k-1)/k: half, as forward only",
          ["forward only", "reduce-scatter then an all-gather"])
def tp_bytes_one_ring_phase(batch, seq, width, k):
    return 4 * batch * seq * width * 4 * (k - 1) / k


@shortcut("check_tp_ring_bytes", "the payload, no ring", "that is the payload")
def tp_bytes_payload(batch, seq, width, k):
    return 4 * batch * seq * width * 4


@shortcut("check_tp_ring_bytes", "the course's ring_bytes_per_device", REFUSED)
def tp_bytes_reference(batch, seq, width, k):
    return 4 * helpers.ring_bytes_per_device(batch * seq * width * 4, k)


@other("check_tp_ring_bytes", "an integer, with numpy")
def tp_bytes_numpy(batch, seq, width, k):
    return np.int64(8 * batch * seq * width * 4 * (k - 1) // k)


# ---- the loss over a split vocabulary -----------------------------------------------------------
worked("check_vocab_loss")(solution("tensor_parallel_dist.ipynb", "vocab_loss", __name__))


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


test_case = parametrize_cases(__name__)
