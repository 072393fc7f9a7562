"""Part VI: tensor parallelism across processes, from scratch and with DTensor, and 2D.

From scratch (Megatron-LM): in an MLP the first linear is split by output columns, the second by
input rows; each rank computes its slice, and one all-reduce (g) sums the partial outputs in
forward; the copy of the input (f) all-reduces its gradient in backward. Attention splits the
same way by heads: q, k, v by columns (whole heads per rank), the output projection by rows.
The DTensor version (parallelize_module with ColwiseParallel / RowwiseParallel) does the same
on the same block; `FuncolBytes` counts the bytes its collectives carry.
"""
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .ranks import DistComm

__all__ = ["SmallMLP", "SmallAttention", "SmallBlock", "small_block", "CopyToTP", "ReduceFromTP",
           "copy_to_tp", "reduce_from_tp", "TPMLP", "TPAttention", "TPBlock", "split_dims",
           "shard_of", "gather_shards", "FuncolBytes", "tp_plan", "tp_worker", "mesh2d_worker",
           "block_inputs", "block_loss"]


# --- the small transformer block (the unsplit reference) --------------------------------------
class SmallMLP(nn.Module):
    """Linear up to `hidden`, GELU, linear back down."""

    def __init__(self, width, hidden):
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class SmallAttention(nn.Module):
    """Causal self-attention with separate q, k, v projections (so each can be split by whole
    heads). The head count comes from the tensor: a rank holding half the heads just works."""

    def __init__(self, width, heads):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} must be a multiple of heads {heads}")
        self.head_dim = width // heads
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (lin(x).view(B, T, -1, self.head_dim).transpose(1, 2)
                   for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class SmallBlock(nn.Module):
    """A pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, width=32, heads=4, hidden=None):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn, self.mlp = SmallAttention(width, heads), SmallMLP(width, hidden or 4 * width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def small_block(width=32, heads=4, hidden=None, seed=0):
    """The SmallBlock with weights from `seed` (every rank builds the same one)."""
    torch.manual_seed(seed)
    return SmallBlock(width, heads, hidden)


def block_inputs(batch, seq, width, seed=0):
    """Input X (batch, seq, width) and the weights R of the loss (out * R).sum()."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, width, generator=g), torch.randn(batch, seq, width, generator=g)


def block_loss(out, R):
    """A loss whose gradient reaches every output element differently."""
    return (out * R).sum()


# --- f and g: the two communication operators of Megatron-LM ----------------------------------
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
    return CopyToTP.apply(x, comm)


def reduce_from_tp(x, comm):
    return ReduceFromTP.apply(x, comm)


def shard_of(t, dim, rank, k):
    """Rank `rank`'s slice of `t` along `dim` in k equal pieces (a copy)."""
    if t.shape[dim] % k:
        raise ValueError(f"size {t.shape[dim]} along dim {dim} does not split into {k} ranks")
    return t.detach().chunk(k, dim)[rank].clone()


def _sharded_linear(full, dim, rank, k, bias=True):
    """An nn.Linear holding rank's slice of `full` (dim 0: output columns, dim 1: input rows;
    a row-split keeps the whole bias, added once after the all-reduce)."""
    w = shard_of(full.weight, dim, rank, k)
    lin = nn.Linear(w.shape[1], w.shape[0], bias=bias)
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

    def forward(self, x):
        x = copy_to_tp(x, self.comm)
        partial = F.linear(F.gelu(self.up(x)), self.down.weight)
        return reduce_from_tp(partial, self.comm) + self.down.bias


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

    def forward(self, x):
        B, T, _ = x.shape
        x = copy_to_tp(x, self.comm)
        q, k, v = (lin(x).view(B, T, -1, self.head_dim).transpose(1, 2)
                   for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        partial = F.linear(y.transpose(1, 2).reshape(B, T, -1), self.proj.weight)
        return reduce_from_tp(partial, self.comm) + self.proj.bias


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


# --- DTensor ---------------------------------------------------------------------------------
class FuncolBytes(TorchDispatchMode):
    """Counts the collectives DTensor runs, and the bytes of each (its input tensor), by watching
    the functional collective ops (torch.ops._c10d_functional) as they are dispatched."""

    OPS = ("all_reduce", "all_reduce_", "reduce_scatter_tensor", "all_gather_into_tensor",
           "all_to_all_single", "broadcast", "broadcast_")

    def __init__(self):
        super().__init__()
        self.log = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        from torch.distributed.tensor import DTensor
        if any(t is DTensor for t in types):
            return NotImplemented               # let DTensor turn itself into plain ops first
        ns = getattr(func, "namespace", "")
        name = func._overloadpacket.__name__
        if ns in ("_c10d_functional", "c10d_functional", "c10d") and name in self.OPS:
            first = args[0] if args else None
            tensors = first if isinstance(first, (list, tuple)) else [first]
            nbytes = sum(t.numel() * t.element_size() for t in tensors
                         if isinstance(t, torch.Tensor))
            self.log.append((name, None, nbytes))
        return func(*args, **kwargs)

    def bytes_sent(self, op=None):
        return sum(b for o, _, b in self.log if op is None or op in o)

    def calls(self, op):
        return sum(1 for o, _, _ in self.log if op in o)


def tp_plan(block=True, prepare_input=True):
    """The parallelize_module plan for the SmallBlock (or for a SmallMLP alone: block=False).
    prepare_input: turn the attention's input into one replicated DTensor, so q, k and v share
    it and backward all-reduces its gradient once, not once per projection."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel)
    if not block:
        return {"up": ColwiseParallel(), "down": RowwiseParallel()}
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(),
            "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    if prepare_input:
        plan["attn"] = PrepareModuleInput(input_layouts=(Replicate(),),
                                          desired_input_layouts=(Replicate(),),
                                          use_local_output=False)
        plan["mlp"] = PrepareModuleInput(input_layouts=(Replicate(),),
                                         desired_input_layouts=(Replicate(),),
                                         use_local_output=False)
    return plan


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _grads(module):
    return {n: _local(p.grad).detach().cpu().clone() for n, p in module.named_parameters()}


def _run(module, X, R, counter):
    """Forward and backward once; returns output, grads (the module's and the input's) and the
    counter's log split into forward and backward."""
    module.zero_grad()
    X = X.detach().clone().requires_grad_()
    out = module(X)
    fwd = list(counter.log)
    block_loss(_local(out), R).backward()
    return dict(out=_local(out).detach().cpu().clone(), grads=_grads(module), fwd=fwd,
                bwd=list(counter.log[len(fwd):]), x_grad=X.grad.detach().cpu().clone())


def tp_worker(rank, world, cfg):
    """spawn_ranks target: the from-scratch TPMLP and TPBlock, and the DTensor SmallBlock (with and
    without PrepareModuleInput), on the same weights and input. Returns {name: result} where a
    result has out, grads (this rank's slices) and the fwd/bwd logs of (op, bytes)."""
    device = cfg["device"]
    block = small_block(**cfg.get("block", {})).to(device)
    X, R = (t.to(device) for t in block_inputs(**cfg["inputs"]))
    comm = DistComm(device=device)
    results = {}
    for name, module in (("mlp", TPMLP(block.mlp, comm)), ("block", TPBlock(block, comm))):
        comm.log = []
        results[name] = _run(module, X, R, comm)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module
    mesh = init_device_mesh(device.type, (world,))
    for name, prep in (("dtensor", True), ("dtensor_plain", False)):
        module = parallelize_module(copy.deepcopy(block), mesh, tp_plan(True, prep))
        with CommDebugMode() as debug, FuncolBytes() as counter:
            got = _run(module, X, R, counter)
        got["comm_counts"] = {str(k): v for k, v in debug.get_comm_counts().items()}
        results[name] = got
    return results


def mesh2d_worker(rank, world, cfg):
    """spawn_ranks target on 4 ranks: a 2x2 device mesh ("dp", "tp"); the SmallBlock tensor parallel
    over "tp" (parallelize_module) and data parallel over "dp" (each dp group gets half of each
    global batch; gradients averaged over "dp" by FSDP2 fully_shard, or by an all-reduce where
    fully_shard is unavailable). SGD for cfg["steps"] steps; returns the full weights
    (rank 0), the losses and how the dp dimension was done."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    import logging
    # full_tensor() of a 2D-sharded weight warns that it gathers in two steps: true, harmless
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    device = cfg["device"]
    dp, tp = cfg.get("shape", (2, 2))
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()
    block = small_block(**cfg.get("block", {})).to(device)
    model = parallelize_module(block, mesh["tp"], tp_plan(True, True))
    how = "manual all-reduce over dp"
    if cfg.get("fsdp", True):
        try:
            from torch.distributed.fsdp import fully_shard
            model = fully_shard(model, mesh=mesh["dp"])
            how = "fully_shard over dp"
        except Exception as e:   # noqa: BLE001 - old torch without FSDP2 on a 2D mesh
            how = f"manual all-reduce over dp (fully_shard: {type(e).__name__})"
    opt = torch.optim.SGD(model.parameters(), lr=cfg.get("lr", 0.1))
    losses = []
    for step in range(cfg.get("steps", 3)):
        X, R = block_inputs(**dict(cfg["inputs"], seed=step))
        rows = X.shape[0] // dp
        Xs = X[dp_rank * rows:(dp_rank + 1) * rows].to(device)
        Rs = R[dp_rank * rows:(dp_rank + 1) * rows].to(device)
        opt.zero_grad()
        loss = block_loss(_local(model(Xs)), Rs) / X.shape[0] * dp   # mean over this dp shard
        loss.backward()
        if how.startswith("manual"):
            group = mesh.get_group("dp")
            for p in model.parameters():
                g = _local(p.grad)
                dist.all_reduce(g, group=group)
                g /= dp
        opt.step()
        total = loss.detach().clone() / dp
        dist.all_reduce(total, group=mesh.get_group("dp"))
        losses.append(float(total))
    full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
            for n, p in model.named_parameters()}
    local = {n: tuple(_local(p).shape) for n, p in model.named_parameters()}
    return dict(weights=full if rank == 0 else None, losses=losses, how=how, local_shapes=local,
                coords=(dp_rank, mesh["tp"].get_local_rank()))
