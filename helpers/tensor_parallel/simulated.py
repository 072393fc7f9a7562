"""Part I: splitting within a layer over simulated devices (lists of tensors, one per device):
a convolution or a dense layer in shards, and the Megatron MLP, whose all-reduces are the ring's
(helpers.ring). Every tensor moves with `runtime.traffic.send`, so a ByteLog counts the bytes each
device would put on its link. `f` and `g` are Megatron-LM's two operators (Shoeybi et al., 2019)
as autograd functions: f (copy_to_shards) is the identity forward and an all-reduce backward,
g (reduce_from_shards) an all-reduce forward and the identity backward. all_gather_shards is the
column split's: an all-gather of the shards forward, its adjoint, a reduce-scatter, backward.
"""
import torch
from torch.nn import functional as F

from ..ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from ..runtime.traffic import send

__all__ = ["CopyToShards", "ReduceFromShards", "copy_to_shards", "reduce_from_shards",
           "megatron_mlp", "conv_split_channels", "dense_split_columns", "dense_split_rows",
           "lenet_within_layer", "all_gather_shards", "lenet_gathered_shards"]


class CopyToShards(torch.autograd.Function):
    """Megatron's f: forward, the identity (every device already holds X, as the previous block's
    all-reduce left it, so the copies here log nothing); backward, all-reduce the k devices'
    gradients of X, since each device's shard of the next layer contributes to it."""

    @staticmethod
    def forward(ctx, X, devices, log):
        ctx.devices, ctx.log, ctx.home = devices, log, X.device
        return tuple(X.to(d, copy=True) for d in devices)

    @staticmethod
    def backward(ctx, *grads):
        total = ring_all_reduce(list(grads), ctx.devices, ctx.log, "f backward")
        return total[0].to(ctx.home), None, None


class ReduceFromShards(torch.autograd.Function):
    """Megatron's g: forward, all-reduce the k devices' partial sums; backward, the identity
    (every device holds the gradient of the summed output already: the copies log nothing)."""

    @staticmethod
    def forward(ctx, devices, log, *partials):
        ctx.devices = devices
        return ring_all_reduce(list(partials), devices, log, "g forward")[0]

    @staticmethod
    def backward(ctx, grad):
        return (None, None, *(grad.to(d, copy=True) for d in ctx.devices))


def copy_to_shards(X, devices, log=None):
    """Megatron's f: X on every device (identity forward, all-reduce of its gradient backward)."""
    return CopyToShards.apply(X, devices, log)


def reduce_from_shards(partials, devices, log=None):
    """Megatron's g: the sum of the devices' partial results (all-reduce forward, identity
    backward), as seen on devices[0]."""
    return ReduceFromShards.apply(devices, log, *partials)


def megatron_mlp(X, W1, b1, W2, b2, devices, log=None):
    """relu(X @ W1 + b1) @ W2 + b2 on k devices: W1 split by columns (hidden units), W2 by the
    matching rows. Each device applies the ReLU to its own hidden units; one all-reduce (g) adds
    the partial outputs, and b2 is added once, after it."""
    k = len(devices)
    Xs = copy_to_shards(X, devices, log)                                 # f
    shards = zip(Xs, W1.tensor_split(k, dim=1), b1.tensor_split(k), W2.tensor_split(k), devices)  # noqa: B905
    partials = [F.relu(Xi @ W1i.to(d) + b1i.to(d)) @ W2i.to(d) for Xi, W1i, b1i, W2i, d in shards]
    return reduce_from_shards(partials, devices, log) + b2.to(devices[0])   # g, then b2 once


# ---- Within a layer: shards of a convolution or a dense layer on k devices ----------------------
# The weight shards are moved to their device inside the call to keep the code short; a real
# system keeps each shard resident on its device, so only activations are logged.

def conv_split_channels(X, W, b, devices, log=None, **conv_args):
    """A convolution with its output channels split over the devices: device i computes its
    channels from the whole input; the outputs are gathered on devices[0]."""
    k, Ys = len(devices), []
    for i, (Wi, bi) in enumerate(zip(W.tensor_split(k), b.tensor_split(k))):  # noqa: B905
        Xi = send(X, 0, i, devices, log, "input")
        Ys.append(F.conv2d(Xi, Wi.to(devices[i]), bi.to(devices[i]), **conv_args))
    return torch.cat([send(Y, i, 0, devices, log, "output") for i, Y in enumerate(Ys)], dim=1)


def dense_split_columns(X, W, b, devices, log=None):
    """X @ W + b with W (in, out) split by columns (output units): device i computes its outputs
    from the whole input; the outputs are gathered on devices[0]."""
    k, Ys = len(devices), []
    for i, (Wi, bi) in enumerate(zip(W.tensor_split(k, dim=1), b.tensor_split(k))):  # noqa: B905
        Xi = send(X, 0, i, devices, log, "input")
        Ys.append(torch.mm(Xi, Wi.to(devices[i])) + bi.to(devices[i]))
    return torch.cat([send(Y, i, 0, devices, log, "output") for i, Y in enumerate(Ys)], dim=1)


def dense_split_rows(X, W, b, devices, log=None):
    """X @ W + b with W split by rows (input features): device i multiplies its slice of the
    features by its rows, giving a partial sum of the WHOLE output; the partial sums are added up
    on devices[0], and the bias is added once, after the sum."""
    k = len(devices)
    shards = zip(X.tensor_split(k, dim=1), W.tensor_split(k))  # noqa: B905
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


# ---- The column split with ring collectives: all-gather forward, reduce-scatter backward -------

def _ring_order(shards):
    """Shards in helpers.ring's chunk order: its ring leaves chunk (i+1) % k on device i, so
    device i's shard i is chunk (i+1) % k."""
    return [shards[-1], *shards[:-1]]


def _shard_order(chunks):
    """helpers.ring's chunks back in shard order (undoes _ring_order)."""
    return [*chunks[1:], chunks[0]]


class _AllGatherShards(torch.autograd.Function):
    """Forward, a ring all-gather: device i holds shards[i] (its slice along `dim`) and every
    device ends with the whole tensor. Backward, its adjoint, a ring reduce-scatter: device j
    needs only its own slice of the gradient, summed over the k devices' contributions, which
    is (k-1)/k of the tensor per device where an all-reduce would send twice that. With
    `replicated=True` (the logits, whose loss every device computes alike) every device
    holds the same whole gradient already, so each takes its slice and nothing moves.
    Both are helpers.ring's, on the shards as its chunks (cut along `dim`, sizes as given)."""

    @staticmethod
    def forward(ctx, devices, log, dim, replicated, *shards):
        ctx.devices, ctx.log, ctx.dim, ctx.replicated = devices, log, dim, replicated
        ctx.sizes = [s.shape[dim] for s in shards]
        held = [_ring_order([s if c == i else None for c in range(len(shards))])
                for i, s in enumerate(shards)]                # device i holds its shard only
        held = ring_all_gather(held, devices, log, "all-gather")
        return tuple(torch.cat(_shard_order(h), dim=dim) for h in held)

    @staticmethod
    def backward(ctx, *grads):
        if ctx.replicated:
            return (None, None, None, None, *grads[0].split(ctx.sizes, dim=ctx.dim))
        chunks = ring_reduce_scatter(list(grads), ctx.devices, ctx.log, "reduce-scatter",
                                     cut=lambda g: _ring_order(g.split(ctx.sizes, dim=ctx.dim)))
        return (None, None, None, None, *(_shard_order(c)[j] for j, c in enumerate(chunks)))


def all_gather_shards(shards, devices, log=None, dim=1, replicated=False):
    """The whole tensor on every device from the devices' slices along `dim` (ring all-gather;
    backward, a ring reduce-scatter of the gradient: _AllGatherShards)."""
    return list(_AllGatherShards.apply(devices, log, dim, replicated, *shards))


def lenet_gathered_shards(X, params, devices, log=None):
    """helpers.lenet with every layer split by output channels or units, as a real split runs
    it: each device applies the ReLU and pooling to its own channels (they act on each channel
    alone), and the pooled shards are all-gathered (all_gather_shards: a reduce-scatter backward).
    Every device reads the data itself; the logits are returned as devices[0] holds them."""
    k, (W1, b1, W2, b2, W3, b3, W4, b4) = len(devices), params
    xs = [X.to(d) for d in devices]
    for W, b in ((W1, b1), (W2, b2)):
        ys = [F.avg_pool2d(F.relu(F.conv2d(x, Wi.to(d), bi.to(d))), kernel_size=2, stride=2)
              for x, Wi, bi, d in zip(xs, W.tensor_split(k), b.tensor_split(k), devices)]  # noqa: B905
        xs = all_gather_shards(ys, devices, log)
    xs = [x.reshape(x.shape[0], -1) for x in xs]
    ys = [F.relu(x @ Wi.to(d) + bi.to(d))
          for x, Wi, bi, d in zip(xs, W3.tensor_split(k, dim=1), b3.tensor_split(k), devices)]  # noqa: B905
    xs = all_gather_shards(ys, devices, log)
    ys = [x @ Wi.to(d) + bi.to(d)
          for x, Wi, bi, d in zip(xs, W4.tensor_split(k, dim=1), b4.tensor_split(k), devices)]  # noqa: B905
    return all_gather_shards(ys, devices, log, replicated=True)[0]
