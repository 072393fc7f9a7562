"""Part III: torch's data parallelism on a CPU, on one GPU and on many: evaluation that counts
each example once, synchronised BatchNorm (also on the CPU, where nn.SyncBatchNorm refuses), and
the models of the custom-module and BatchNorm chapters.

Every rank runs the same collectives (evaluation too), and evaluation counts each example once.
"""
import inspect

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from ..models import unwrap
from ..profiling import collectives_in
from ..runtime.group import get_rank, get_world_size

__all__ = ["shard_indices", "exact_counts", "evaluate_exact", "no_forward_buffer_sync",
           "ddp_step_collectives", "combine_stats",
           "SyncBatchNormFunction", "CPUSyncBatchNorm", "convert_sync_batchnorm", "TwoInputNet",
           "side_features", "bn_net", "bn_stats", "global_batches", "train_bn_steps"]


def shard_indices(n, rank, world_size):
    """This rank's share of n examples, each example on exactly one rank (strided, unpadded).

    DistributedSampler pads instead: it repeats examples so every rank gets the same number,
    which is right for training steps but counts some examples twice in an evaluation.
    """
    return torch.arange(n)[rank::world_size]


def exact_counts(correct, total, device=None):
    """Sum (correct, total) over all ranks: every rank must call it (it is a collective)."""
    counts = torch.tensor([int(correct), int(total)], dtype=torch.int64, device=device)
    if get_world_size() > 1:
        dist.all_reduce(counts)
    return int(counts[0]), int(counts[1])


def evaluate_exact(net, X, y, device, batch_size=1024):
    """Accuracy of `net` on (X, y) shared out over all ranks, each example counted once.
    Returns (correct, total) summed over ranks. All ranks call it."""
    idx = shard_indices(len(y), get_rank(), get_world_size())
    module = unwrap(net)   # DDP's own forward may run collectives; ranks' batch counts differ
    was_training = module.training
    module.eval()
    correct = 0
    with torch.no_grad():
        for chunk in idx.split(batch_size):
            Xb, yb = X[chunk].to(device), y[chunk].to(device)
            correct += int((module(Xb).argmax(dim=1) == yb).sum())
    module.train(was_training)
    return exact_counts(correct, len(idx), device)


def no_forward_buffer_sync(ddp_class=nn.parallel.DistributedDataParallel):
    """DDP's keyword argument that stops its buffer broadcast at the start of a forward, as this
    torch spells it: {"forward_sync_buffers": False} where DDP has that keyword (torch 2.13 on,
    where `broadcast_buffers` is deprecated and passing it raises a FutureWarning), else
    {"broadcast_buffers": False} (torch before 2.13: the course's floor, 2.11, too). Chosen
    from DDP's signature, not from the version number, so a nightly in between is read right.

    The two differ at construction: `forward_sync_buffers=False` still broadcasts rank 0's
    buffers once there, `broadcast_buffers=False` skips that broadcast too. So this suits
    buffers that are equal on every rank or loaded afterwards, not per-rank buffers that must
    survive construction (those need the deprecated `broadcast_buffers=False`)."""
    if "forward_sync_buffers" in inspect.signature(ddp_class.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def ddp_step_collectives(model, loss_of, steps=3):
    """What a DDP-wrapped `model` communicates, step by step: for each of `steps` training
    steps, the collectives of its forward (`loss_of(model)`, which returns the loss) and of its
    backward, as helpers.collectives_in lists them: [{"forward": [(op, elements), ...],
    "backward": [...]}, ...]. No optimizer step: the collectives do not depend on it. On one
    process (a group of one) DDP still runs every collective it would run on many."""
    seen, box = [], []
    for _ in range(steps):
        forward = collectives_in(lambda: box.append(loss_of(model)))
        backward = collectives_in(lambda: box.pop().backward())
        seen.append({"forward": forward, "backward": backward})
    return seen


def combine_stats(counts, means, variances):
    """Mean and biased variance of the union of groups from each group's count, mean and biased
    variance (Chan et al.'s parallel formula): no E[x^2] - E[x]^2, whose subtraction of two large
    numbers loses the digits of a small variance."""
    n = counts.sum()
    mean = (counts[:, None] * means).sum(0) / n
    m2 = (counts[:, None] * (variances + (means - mean) ** 2)).sum(0)
    return mean, m2 / n, n


class SyncBatchNormFunction(torch.autograd.Function):
    """The communication of nn.SyncBatchNorm, on any backend: the forward ALL-GATHERS each rank's
    (count, per-channel mean, per-channel variance) and combines them (nn.SyncBatchNorm gathers
    the inverse standard deviation instead of the variance); the backward ALL-REDUCES the
    per-channel sums of the upstream gradient and of gradient * x_hat, which the input gradient
    needs from the whole global batch. The weight and bias gradients stay local (DDP
    averages them over the ranks like any parameter's)."""

    @staticmethod
    def forward(ctx, X, weight, bias, eps, group=None):
        dims = [0] + list(range(2, X.dim()))
        count = torch.tensor([X.numel() / X.shape[1]], dtype=X.dtype, device=X.device)
        local = torch.cat([count, X.mean(dims), X.var(dims, unbiased=False)])
        gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, local, group=group)
        stats = torch.stack(gathered)                     # (world_size, 1 + 2 * channels)
        c = X.shape[1]
        mean, var, n = combine_stats(stats[:, 0], stats[:, 1:1 + c], stats[:, 1 + c:])
        shape = [1, c] + [1] * (X.dim() - 2)
        invstd = torch.rsqrt(var + eps)
        X_hat = (X - mean.view(shape)) * invstd.view(shape)
        ctx.save_for_backward(X_hat, invstd, weight, n)
        ctx.dims, ctx.shape, ctx.group = dims, shape, group
        ctx.mark_non_differentiable(mean, var, n)
        Y = X_hat
        if weight is not None:
            Y = Y * weight.view(shape) + bias.view(shape)
        return Y, mean, var, n

    @staticmethod
    def backward(ctx, dY, _dmean, _dvar, _dn):
        X_hat, invstd, weight, n = ctx.saved_tensors
        dims, shape = ctx.dims, ctx.shape
        sum_dy, sum_dy_xhat = dY.sum(dims), (dY * X_hat).sum(dims)
        grad_w = grad_b = None
        if weight is not None:
            grad_w, grad_b = sum_dy_xhat.clone(), sum_dy.clone()   # local, as nn.SyncBatchNorm
        both = torch.cat([sum_dy, sum_dy_xhat])
        dist.all_reduce(both, group=ctx.group)                      # over the global batch
        c = X_hat.shape[1]
        mean_dy, mean_dy_xhat = both[:c] / n, both[c:] / n
        scale = invstd if weight is None else invstd * weight
        dX = (dY - mean_dy.view(shape) - X_hat * mean_dy_xhat.view(shape)) * scale.view(shape)
        return dX, grad_w, grad_b, None, None


class CPUSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm (1d, 2d or 3d inputs) whose batch statistics come from the whole global batch
    (all ranks), for the CPU, where nn.SyncBatchNorm refuses to run. It communicates as
    nn.SyncBatchNorm does: all-gather of each rank's (count, mean, variance) in the forward,
    all-reduce of two per-channel gradient sums in the backward. Outside training, or in a world
    of one, it is a plain BatchNorm. `process_group`: the ranks to synchronise over (all by
    default), as nn.SyncBatchNorm's."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group

    def _check_input_dim(self, X):
        if X.dim() < 2:
            raise ValueError(f"expected an input of at least 2 dimensions (N, C, ...), got "
                             f"{X.dim()}")

    def _synchronises(self):
        """Whether this forward takes the Python path that all-gathers the statistics."""
        return (self.training and dist.is_initialized()
                and dist.get_world_size(self.process_group) > 1)

    def forward(self, X):
        if not self._synchronises():
            return super().forward(X)
        self._check_input_dim(X)
        Y, mean, var, n = SyncBatchNormFunction.apply(X, self.weight, self.bias, self.eps,
                                                      self.process_group)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = self.momentum if self.momentum is not None \
                    else 1 / int(self.num_batches_tracked)
                self.running_mean.mul_(1 - m).add_(m * mean)
                self.running_var.mul_(1 - m).add_(m * var * n / (n - 1))   # unbiased, as BN
        return Y


def convert_sync_batchnorm(model, device, process_group=None):
    """Every BatchNorm layer (1d, 2d, 3d) made to use the statistics of the whole batch of
    `process_group`'s ranks (all by default) under DDP: nn.SyncBatchNorm on GPUs,
    CPUSyncBatchNorm on the CPU, keeping eps, momentum, affine, track_running_stats, the
    parameters and the buffers. Convert BEFORE wrapping in DDP."""
    if torch.device(device).type != "cpu":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group)
    if isinstance(model, nn.modules.batchnorm._BatchNorm) and \
            not isinstance(model, CPUSyncBatchNorm):
        new = CPUSyncBatchNorm(model.num_features, model.eps, model.momentum, model.affine,
                               model.track_running_stats, process_group)
        new.load_state_dict(model.state_dict())
        new.train(model.training)
        return new
    for name, child in model.named_children():
        setattr(model, name, convert_sync_batchnorm(child, device, process_group))
    return model


class TwoInputNet(nn.Module):
    """A module of the kind readers bring: two inputs (an image and a few side features), buffers
    (input normalisation and a call counter), a dict output, and an auxiliary head used only in
    some steps (`aux=True`)."""

    def __init__(self, num_side=4, hidden=64, num_classes=10):
        super().__init__()
        self.num_classes = num_classes
        self.register_buffer("mean", torch.tensor(0.286))   # Fashion-MNIST pixel mean and std
        self.register_buffer("std", torch.tensor(0.353))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.image = nn.Sequential(nn.Conv2d(1, 8, 5, stride=2), nn.ReLU(), nn.Flatten(),
                                   nn.Linear(8 * 12 * 12, hidden), nn.ReLU())
        self.side = nn.Linear(num_side, hidden)
        self.head = nn.Linear(hidden, num_classes)
        self.aux_head = nn.Linear(hidden, 1)   # predicts the mean brightness; not every step

    def forward(self, X, side, aux=False):
        self.calls += 1
        h = self.image((X - self.mean) / self.std) + F.relu(self.side(side))
        out = {"logits": self.head(h), "embedding": h}
        if aux:
            out["aux"] = self.aux_head(h).squeeze(1)
        return out


def side_features(X):
    """Four side features per image: the mean brightness of its four quadrants, shape (n, 4)."""
    q = X.unfold(2, 14, 14).unfold(3, 14, 14)   # (n, 1, 2, 2, 14, 14)
    return q.mean(dim=(-1, -2)).reshape(X.shape[0], 4)


def bn_net(channels=16, num_classes=10):
    """A small CNN with two BatchNorm layers (the BatchNorm chapter's model)."""
    c = channels
    return nn.Sequential(
        nn.Conv2d(1, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.AvgPool2d(2),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(), nn.AvgPool2d(2),
        nn.Flatten(), nn.Linear(2 * c * 7 * 7, num_classes))


def bn_stats(model):
    """{layer name: (running_mean, running_var)} of every BatchNorm layer, on the CPU."""
    return {name: (m.running_mean.detach().cpu().clone(), m.running_var.detach().cpu().clone())
            for name, m in unwrap(model).named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)}


def global_batches(n, batch_size, num_steps, seed=0):
    """Indices of `num_steps` global batches drawn from n examples, shape (num_steps, batch_size);
    the same on every rank (same seed), so each rank can take its slice of each."""
    g = torch.Generator().manual_seed(seed)
    need = num_steps * batch_size
    perm = torch.cat([torch.randperm(n, generator=g) for _ in range(-(-need // n))])
    return perm[:need].view(num_steps, batch_size)


def train_bn_steps(model, X, y, batches, lr, device, rank=0, world_size=1, keep_every=None):
    """SGD (momentum 0.9) over the given global batches; this rank trains on its slice of each.
    With `keep_every`: also returns the model's state (CPU copies) before every `keep_every`-th
    step, as a list of (step, state_dict)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    kept = []
    for step, idx in enumerate(batches):
        if keep_every and step % keep_every == 0:
            kept.append((step, {k: v.detach().cpu().clone()
                                for k, v in unwrap(model).state_dict().items()}))
        idx = idx.tensor_split(world_size)[rank]
        loss = F.cross_entropy(model(X[idx].to(device)), y[idx].to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return (model, kept) if keep_every else model
