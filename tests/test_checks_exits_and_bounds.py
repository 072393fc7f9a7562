"""Values leave torch only through watched exits, and what a rank sends, holds and computes is
bounded (tests/check_cases.py's form): every shortcut fails with the words that name it, the
right answers beside them pass.

- unwatched exits (exits.py): the C base class's methods (`torch._C.TensorBase.tolist`), an
  original bound before the check ran, `to_dlpack`, the Python-callback kernels `apply_`,
  `map_`, `map2_` (map_ reads ANOTHER tensor: provenance);
- a Python-callback kernel on a simulated GPU's tensor is a failed answer, not a crashed
  interpreter (fake.py);
- many small messages: the logits gathered under the per-message cap, bounded by a total per
  rank;
- the work moved to the host: every device at work is bounded (the sharded server's update);
- decoy backwards: the step (or .grad) computed beside the recorded net must be made from the
  gradients the backwards through the net's outputs delivered (recorded.py);
- a node of the right type that does nothing: f's forward must put X on every device;
- every received block kept: ring attention's received K/V blocks alive at once are bounded
  (a ring needs three at most);
- right answers: a `Decimal` result (as_number), SyncBatchNorm's two sums all-reduced in float64
  (the cap counts numbers, not float32 bytes).
"""
from decimal import Decimal

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from check_cases import exact_from_numbers, other, parametrize_cases, shortcut

import helpers

UNWATCHED = "unwatched way out of torch"
READ_OUT = "out of torch into Python numbers"


# ---- unwatched exits ---------------------------------------------------------------------------
@shortcut("check_global_mean_var", "read with the C base class's tolist", UNWATCHED)
def global_mean_var_base_tolist(counts, means, variances):
    tl = torch._C.TensorBase.tolist
    return exact_from_numbers(tl(counts), tl(means), tl(variances))


_TOLIST = torch.Tensor.tolist          # bound before any check ran: the original


@shortcut("check_global_mean_var", "an original tolist bound before the check", UNWATCHED)
def global_mean_var_bound_before(counts, means, variances):
    return exact_from_numbers(_TOLIST(counts), _TOLIST(means), _TOLIST(variances))


def _grab(t):
    out = []
    t.detach().clone().apply_(lambda x: out.append(x) or x)
    return out


@shortcut("check_global_mean_var", "read with apply_'s Python callback", READ_OUT)
def global_mean_var_apply(counts, means, variances):
    c = means.shape[1]
    ms, vs = _grab(means), _grab(variances)
    return exact_from_numbers(_grab(counts), [ms[i:i + c] for i in range(0, len(ms), c)],
                  [vs[i:i + c] for i in range(0, len(vs), c)])


class _Capsule:
    """Anything with __dlpack__: numpy takes it."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kwargs):
        return torch.utils.dlpack.to_dlpack(self.t)

    def __dlpack_device__(self):
        return (1, 0)


@shortcut("check_global_mean_var", "read through torch.utils.dlpack.to_dlpack", READ_OUT)
def global_mean_var_to_dlpack(counts, means, variances):
    def read(t):
        return np.from_dlpack(_Capsule(t)).tolist()
    return exact_from_numbers(read(counts), read(means), read(variances))


_BOARD = {}


@shortcut("check_sync_bn_input_grad", "the second sum passed as apply_'s numbers",
          "read out of its own tensors")
def sync_bn_input_grad_apply(dy, x_hat, invstd, n):
    r, k = dist.get_rank(), dist.get_world_size()
    s1 = dy.sum(0)
    dist.all_reduce(s1)
    out = []
    (dy * x_hat).sum(0).apply_(lambda v: out.append(v) or v)
    _BOARD["apply", r] = out
    dist.barrier()
    s2 = torch.tensor([sum(_BOARD["apply", q][j] for q in range(k)) for j in range(dy.shape[1])])
    dist.barrier()
    return invstd * (dy - s1 / n - x_hat * s2 / n)


@shortcut("check_sync_bn_input_grad", "the second sum passed as a dlpack array", "dlpack")
def sync_bn_input_grad_dlpack(dy, x_hat, invstd, n):
    r, k = dist.get_rank(), dist.get_world_size()
    s1 = dy.sum(0)
    dist.all_reduce(s1)
    _BOARD["dlpack", r] = np.from_dlpack(_Capsule((dy * x_hat).sum(0).double())).copy()
    dist.barrier()
    total = sum(_BOARD["dlpack", q] for q in range(k))
    dist.barrier()
    return invstd * (dy - s1 / n - x_hat * torch.tensor(total, dtype=torch.float32) / n)


@shortcut("check_sync_bn_input_grad", "other ranks' sums copied with map_",
          "used a tensor that rank")
def sync_bn_input_grad_map(dy, x_hat, invstd, n):
    r, k = dist.get_rank(), dist.get_world_size()
    s1 = dy.sum(0)
    dist.all_reduce(s1)
    _BOARD["map", r] = (dy * x_hat).sum(0)
    dist.barrier()
    s2 = torch.zeros(dy.shape[1])
    for q in range(k):
        s2 += torch.zeros(dy.shape[1]).map_(_BOARD["map", q], lambda a, b: b)
    dist.barrier()
    return invstd * (dy - s1 / n - x_hat * s2 / n)


@other("check_sampler_shard", "tolist looked up on torch.Tensor while it runs")
def sampler_shard_unbound_tolist(n, rank, world, epoch, seed):
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    perm = torch.Tensor.tolist(torch.randperm(n, generator=g))     # the watched one
    per = -(-n // world)
    perm += (perm * (per * world // n + 1))[:per * world - n]
    return perm[rank:per * world:world]


# ---- a Python-callback kernel on the simulated GPUs -------------------------------------------
@shortcut("check_reduce_then_broadcast", "apply_ on a simulated CPU tensor (crashed)",
          "simulated GPUs")
def reduce_then_broadcast_apply(grads):
    torch.zeros(2).apply_(lambda v: v)
    total = sum(g.to(grads[0].device) for g in grads)
    for g in grads:
        g.copy_(total.to(g.device))


@shortcut("check_reduce_then_broadcast", "each device sums all itself, as exp().cumprod().log()",
          "rather than every device summing them for itself")
def reduce_then_broadcast_by_cumprod(grads):
    """A sum hidden in a running product counts as additions (observe.py's cumprod)."""
    totals = [torch.stack([g.to(gi.device) for g in grads]).double().exp().cumprod(0)[-1]
              .log().to(gi.dtype) for gi in grads]
    for g, t in zip(grads, totals, strict=True):
        g.copy_(t)


# ---- many small messages ----------------------------------------------------------------------
@shortcut("check_vocab_loss", "the logits gathered two columns per all_reduce", "piece by piece")
def vocab_loss_sliced_gather(logits, target, comm, start):
    n, v = logits.shape
    full = []
    for rank in range(comm.world):
        for c in range(0, v, 2):
            buf = torch.zeros(n, min(2, v - c))
            if rank == comm.rank:
                buf += logits[:, c:c + 2].detach()
            dist.all_reduce(buf)                    # n * 8 bytes: under the per-message cap
            full.append(buf)
    parts = list(torch.cat(full, -1).split(v, -1))
    parts[comm.rank] = logits
    return F.cross_entropy(torch.cat(parts, -1), target)


@shortcut("check_vocab_loss", "the logits sent column by column", "piece by piece")
def vocab_loss_sent_columns(logits, target, comm, start):
    n, v = logits.shape
    parts = []
    for rank in range(comm.world):
        if rank == comm.rank:
            for c in range(v):
                for other in range(comm.world):
                    if other != rank:
                        dist.send(logits[:, c].detach().contiguous(), other)
            parts.append(logits)
        else:
            cols = [torch.empty(n) for _ in range(v)]
            for col in cols:
                dist.recv(col, rank)
            parts.append(torch.stack(cols, -1))
    return F.cross_entropy(torch.cat(parts, -1), target)


# ---- the work moved to the host ---------------------------------------------------------------
@shortcut("check_sharded_server_step", "the whole update on the host, then pulled",
          ["the CPU", "more than serving its chunk needs"])
def sharded_server_step_on_host(params, grads, devices, lr):
    total = sum(g.cpu() for g in grads)
    new = params[0].cpu() - lr * total
    chunks = [c for c in torch.arange(params[0].numel()).tensor_split(len(params)) if len(c)]
    for j, c in enumerate(chunks):
        params[j][c[0]:c[-1] + 1].copy_(new[c[0]:c[-1] + 1].to(devices[j]))
    for i in range(len(params)):
        for j, c in enumerate(chunks):
            if i != j:
                params[i][c[0]:c[-1] + 1].copy_(params[j][c[0]:c[-1] + 1].to(devices[i]))


# ---- decoy backwards, the work beside the net --------------------------------------------------
BESIDE = "beside the net"


def _beside(X, y, W, b):
    Wc, bc = W.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    return torch.autograd.grad(helpers.loss(X @ Wc + bc, y).mean(), (Wc, bc))


@shortcut("check_accumulated_step", "backwards weighted 0, the step from a gradient beside",
          BESIDE)
def accumulated_step_zero_decoys(net, params, X, y, num_micro, lr):
    W, b = params
    for Xm, ym in zip(X.tensor_split(num_micro), y.tensor_split(num_micro)):
        helpers.loss(net(Xm, params), ym).sum().mul(0).backward()
    gW, gb = _beside(X, y, W, b)
    with torch.no_grad():
        W -= lr * gW
        b -= lr * gb
    W.grad = b.grad = None


@shortcut("check_accumulated_step", "real backwards, the step from a gradient beside", BESIDE)
def accumulated_step_beside(net, params, X, y, num_micro, lr):
    W, b = params
    for Xm, ym in zip(X.tensor_split(num_micro), y.tensor_split(num_micro)):
        helpers.loss(net(Xm, params), ym).sum().backward()
    gW, gb = _beside(X, y, W, b)
    with torch.no_grad():
        W -= lr * gW
        b -= lr * gb
    W.grad = b.grad = None


@other("check_accumulated_step", "autograd.grad per micro-batch, summed, then SGD by hand")
def accumulated_step_autograd(net, params, X, y, num_micro, lr):
    total = [torch.zeros_like(p) for p in params]
    for Xm, ym in zip(X.tensor_split(num_micro), y.tensor_split(num_micro)):
        for t, gr in zip(total, torch.autograd.grad(helpers.loss(net(Xm, params), ym).sum(),
                                                    params)):
            t += gr
    with torch.no_grad():
        for p, t in zip(params, total):
            p -= lr * t / len(X)


@other("check_accumulated_step", "an optimizer's step")
def accumulated_step_optimizer(net, params, X, y, num_micro, lr):
    opt = torch.optim.SGD(params, lr=lr)
    for Xm, ym in zip(X.tensor_split(num_micro), y.tensor_split(num_micro)):
        (helpers.loss(net(Xm, params), ym).sum() / len(X)).backward()
    opt.step()
    opt.zero_grad()


@shortcut("check_accumulate_gradients", "tiny-weight backwards, .grad from F.linear beside",
          "beside the model")
def accumulate_gradients_beside(model, loss_fn, micro):
    k = len(micro)
    for i, (X, y) in enumerate(micro):
        with model.no_sync() if i < k - 1 else torch.enable_grad():
            (loss_fn(model(X), y) * 1e-20).backward()
    X, y = torch.cat([m[0] for m in micro]), torch.cat([m[1] for m in micro])
    w = model.lin.weight.detach().clone().requires_grad_()
    b = model.lin.bias.detach().clone().requires_grad_()
    model.lin.weight.grad, model.lin.bias.grad = torch.autograd.grad(
        loss_fn(F.linear(X, w, b), y), (w, b))


# ---- a node of the right type that does nothing ---------------------------------------------
class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X):
        return X.clone()

    @staticmethod
    def backward(ctx, g):
        return g


@shortcut("check_gated_mlp_column_then_row", "an identity Function as f, then plain .to copies",
          "plain copies took it")
def gated_mlp_identity_f(X, W1, V, W2, devices, log=None):
    X0 = _Identity.apply(X)
    shards = zip(W1.tensor_split(len(devices), dim=1), V.tensor_split(len(devices), dim=1),
                 W2.tensor_split(len(devices)), devices)
    partials = [(F.silu(X0.to(d) @ W1i.to(d)) * (X0.to(d) @ Vi.to(d))) @ W2i.to(d)
                for W1i, Vi, W2i, d in shards]
    return helpers.reduce_from_shards(partials, devices, log)


@shortcut("check_attention_by_heads", "an identity Function as f, then plain .to copies",
          "plain copies took it")
def attention_by_heads_identity_f(X, Wq, Wk, Wv, Wo, heads, devices, log=None):
    k, e = len(devices), Wq.shape[1] // heads
    X0 = _Identity.apply(X)
    partials = []
    for hs, d in zip(torch.arange(heads).tensor_split(k), devices):
        cols = torch.cat([torch.arange(h * e, (h + 1) * e) for h in hs.tolist()])
        Xd = X0.to(d)
        Q, K, Vv = ((Xd @ W[:, cols].to(d)).reshape(len(X), len(hs), e).transpose(0, 1)
                    for W in (Wq, Wk, Wv))
        A = torch.softmax(Q @ K.transpose(1, 2) / e ** 0.5, dim=-1) @ Vv
        partials.append(A.transpose(0, 1).reshape(len(X), -1) @ Wo[cols].to(d))
    return helpers.reduce_from_shards(partials, devices, log)


# ---- every block kept -----------------------------------------------------------------------
KEPT = "received K/V blocks alive at once"


def _ring_all_blocks(q, k, v, comm):
    """Every K/V block round the ring, kept in a list (first its own)."""
    r, w = comm.rank, comm.world
    kv, held = torch.stack([k, v]), []
    held.append(kv)
    for i in range(w - 1):
        comm.send(kv, (r + 1) % w, tag=i)
        kv = comm.recv((r - 1) % w, kv.shape, tag=i)
        held.append(kv)
    comm.wait()
    return held


@shortcut("check_ring_forward", "every block kept, a two-pass softmax at the end", KEPT)
def ring_forward_hold_all(q, k, v, comm):
    held = _ring_all_blocks(q, k, v, comm)
    scale = 1 / q.shape[-1] ** 0.5
    top = None
    for b in held:                                 # pass 1: the row maxima, block by block
        m = (q @ b[0].transpose(-2, -1) * scale).amax(-1)
        top = m if top is None else torch.maximum(top, m)
    num, den = 0, 0
    for b in held:                                 # pass 2: exponentials and sums
        p = torch.exp(q @ b[0].transpose(-2, -1) * scale - top[..., None])
        num, den = num + p @ b[1], den + p.sum(-1)
    return num / den[..., None]


@shortcut("check_ring_forward", "every block kept, copied into a list of clones", KEPT)
def ring_forward_hold_clones(q, k, v, comm):
    held = [b.clone() for b in _ring_all_blocks(q, k, v, comm)]
    scale = 1 / q.shape[-1] ** 0.5
    out = torch.zeros_like(q)
    for i in range(q.shape[2]):                    # a plain softmax, one query row at a time
        s = [q[:, :, i:i + 1] @ b[0].transpose(-2, -1) * scale for b in held]
        top = torch.stack([x.amax(-1) for x in s]).amax(0)
        p = [torch.exp(x - top[..., None]) for x in s]
        den = sum(x.sum(-1) for x in p)
        out[:, :, i:i + 1] = sum(x @ b[1] for x, b in zip(p, held)) / den[..., None]
    return out


# ---- right answers --------------------------------------------------------------------------
@other("check_matmul_flops", "a Decimal")
def matmul_flops_decimal(n):
    return Decimal(2) * Decimal(n) ** 3


@other("check_copy_time", "Decimal arithmetic")
def copy_time_decimal(nbytes, bandwidth_gbs, latency_s):
    return Decimal(latency_s) + Decimal(nbytes) / (Decimal(bandwidth_gbs) * 10 ** 9)


@other("check_sync_bn_input_grad", "the two sums all-reduced in float64")
def sync_bn_input_grad_float64(dy, x_hat, invstd, n):
    s = torch.stack([dy.sum(0), (dy * x_hat).sum(0)]).double()
    dist.all_reduce(s)
    s = s.float()
    return invstd * (dy - s[0] / n - x_hat * s[1] / n)


test_case = parametrize_cases(__name__)
