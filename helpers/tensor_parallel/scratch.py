"""Part VI: tensor parallelism across processes, from scratch (Megatron-LM) over a comm.

In an MLP the first linear is split by output columns, the second by input rows; each rank
computes its slice, and one all-reduce (g) sums the partial outputs in forward; the copy of the
input (f) all-reduces its gradient in backward. Attention splits the same way by heads: q, k, v
by columns (whole heads per rank), the output projection by rows. tensor_parallel.torch_api does
the same on the same block with DTensor.
"""
import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..tiny_models import SmallAttention, SmallBlock, SmallMLP  # noqa: F401  the unsplit block

__all__ = ["CopyToTP", "ReduceFromTP", "copy_to_tp", "reduce_from_tp", "TPMLP", "TPAttention",
           "TPBlock", "split_dims", "shard_of", "gather_shards"]


class CopyToTP(torch.autograd.Function):
    """f: identity in forward; in backward, all-reduce the gradient (each rank's slice of the
    layer sent back only its part of the input's gradient)."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_reduce(grad.contiguous().clone()), None


class ReduceFromTP(torch.autograd.Function):
    """g: all-reduce in forward (sum the partial outputs of the row-split layer); identity in
    backward (every rank needs the whole output gradient, and has it)."""

    @staticmethod
    def forward(ctx, x, comm):
        return comm.all_reduce(x.contiguous().clone())

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x, comm):
    """CopyToTP (Megatron's f): identity in forward, the gradient all-reduced in backward."""
    return CopyToTP.apply(x, comm)


def reduce_from_tp(x, comm):
    """ReduceFromTP (Megatron's g): the partial outputs all-reduced, identity in backward."""
    return ReduceFromTP.apply(x, comm)


def shard_of(t, dim, rank, k):
    """Rank `rank`'s slice of `t` along `dim` in k equal pieces (a copy)."""
    if t.shape[dim] % k:
        raise ValueError(f"size {t.shape[dim]} along dim {dim} does not split into {k} ranks")
    return t.detach().chunk(k, dim)[rank].clone()


def _sharded_linear(full, dim, rank, k, bias=True):
    """An nn.Linear holding rank's slice of `full` (dim 0: output columns, dim 1: input rows;
    a row-split keeps the whole bias, added once after the all-reduce), on `full`'s device."""
    w = shard_of(full.weight, dim, rank, k)
    # skip_init: no random init to overwrite (on thread ranks a draw would race with a seeded
    # build in another thread: helpers.seeding)
    lin = nn.utils.skip_init(nn.Linear, w.shape[1], w.shape[0], bias=bias, device=w.device,
                             dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias:
            lin.bias.copy_(shard_of(full.bias, 0, rank, k) if dim == 0 else full.bias)
    return lin


class TPMLP(nn.Module):
    """Rank comm.rank's part of `mlp`: up split by columns, down by rows; f before, g after."""

    def __init__(self, mlp, comm):
        super().__init__()
        self.comm, r, k = comm, comm.rank, comm.world
        self.up = _sharded_linear(mlp.up, 0, r, k)
        self.down = _sharded_linear(mlp.down, 1, r, k)

    def partial(self, x):
        """This rank's partial output (its hidden columns' share), before any sum."""
        return F.linear(F.gelu(self.up(x)), self.down.weight)

    def forward(self, x):
        x = copy_to_tp(x, self.comm)                                   # f
        return reduce_from_tp(self.partial(x), self.comm) + self.down.bias   # g, bias once


class TPAttention(nn.Module):
    """Rank comm.rank's heads of `attn`: q, k, v split by columns, whole heads per rank, the
    output projection by rows; f before, g after. Heads never talk to each other."""

    def __init__(self, attn, comm):
        super().__init__()
        self.comm, r, k = comm, comm.rank, comm.world
        heads = attn.q.out_features // attn.head_dim
        if heads % k:
            raise ValueError(f"{heads} heads do not split over {k} ranks")
        self.head_dim = attn.head_dim
        self.q, self.k, self.v = (_sharded_linear(lin, 0, r, k)
                                  for lin in (attn.q, attn.k, attn.v))
        self.proj = _sharded_linear(attn.proj, 1, r, k)

    def partial(self, x):
        """This rank's heads, projected: its partial output, before any sum."""
        B, T, _ = x.shape
        q, k, v = (lin(x).view(B, T, -1, self.head_dim).transpose(1, 2)
                   for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(y.transpose(1, 2).reshape(B, T, -1), self.proj.weight)

    def forward(self, x):
        x = copy_to_tp(x, self.comm)                                   # f
        return reduce_from_tp(self.partial(x), self.comm) + self.proj.bias   # g, bias once


class TPBlock(nn.Module):
    """The SmallBlock, tensor parallel: layer norms replicated, attention and MLP split."""

    def __init__(self, block, comm):
        super().__init__()
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        self.attn, self.mlp = TPAttention(block.attn, comm), TPMLP(block.mlp, comm)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def split_dims(names):
    """For each parameter name of a SmallBlock/SmallMLP: the dim it is split along (0 for
    column-split weights and their biases, 1 for row-split weights), None if replicated."""
    dims = {}
    for name in names:
        layer, kind = name.rsplit(".", 1)[-2:] if "." in name else ("", name)
        layer = layer.rsplit(".", 1)[-1]
        if layer in ("up", "q", "k", "v"):
            dims[name] = 0
        elif layer in ("down", "proj") and kind == "weight":
            dims[name] = 1
        else:
            dims[name] = None
    return dims


def gather_shards(per_rank):
    """Whole tensors from each rank's {name: slice}: slices concatenated along their split dim,
    replicated ones checked equal on every rank and taken from rank 0."""
    dims = split_dims(per_rank[0])
    out = {}
    for name, dim in dims.items():
        parts = [d[name] for d in per_rank]
        if dim is None:
            for r, t in enumerate(parts[1:], 1):
                if not torch.allclose(t, parts[0], rtol=1e-5, atol=1e-6):
                    raise AssertionError(f"{name} differs between rank 0 and rank {r}")
            out[name] = parts[0]
        else:
            out[name] = torch.cat(parts, dim)
    return out
