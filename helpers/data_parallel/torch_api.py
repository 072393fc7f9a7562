"""Part III: torch.distributed set-up that runs on a CPU, on one GPU and on many.

One process per rank. Every function works the same under `torchrun` (ranks from the environment)
and under `mp.spawn` (ranks passed in). The rules it encodes (see the notes on what learners hit):
- NCCL only when every rank on this machine has a GPU of its own; gloo otherwise (no GPU, or more
  ranks than GPUs: two NCCL ranks on one GPU fail with "Duplicate GPU detected").
- `torch.cuda.set_device(local_rank)` before anything touches CUDA.
- A `timeout` on the process group, so a dead or divergent rank ends the run with an error.
- Every rank runs the same collectives (evaluation too), and evaluation counts each example once.
"""
import datetime
import os
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from .checkpoint import atomic_save, rng_state, save_snapshot
from .devices import exact_float32, num_gpus
from .validate import check_backend

__all__ = ["choose_backend", "env_ranks", "rank_device", "setup", "teardown", "free_port",
           "get_rank", "get_world_size", "log0", "unwrap", "save_checkpoint", "load_checkpoint",
           "save_snapshot_all", "shard_indices", "exact_counts", "evaluate_exact",
           "CPUSyncBatchNorm", "convert_sync_batchnorm"]


def choose_backend(local_world_size=1):
    """"nccl" when every one of the `local_world_size` ranks on this machine has its own GPU,
    "gloo" otherwise (no GPU, or ranks outnumbering GPUs)."""
    if dist.is_nccl_available() and 0 < local_world_size <= num_gpus():
        return "nccl"
    return "gloo"


def env_ranks():
    """(rank, local_rank, world_size, local_world_size) as torchrun sets them; (0, 0, 1, 1) when
    the process was started without a launcher."""
    e = os.environ
    world_size = int(e.get("WORLD_SIZE", 1))
    return (int(e.get("RANK", 0)), int(e.get("LOCAL_RANK", 0)), world_size,
            int(e.get("LOCAL_WORLD_SIZE", world_size)))


def rank_device(local_rank):
    """This rank's device: GPU `local_rank` (round-robin if ranks outnumber GPUs), made the
    current CUDA device; the CPU on a machine without GPUs."""
    n = num_gpus()
    if n == 0:
        return torch.device("cpu")
    device = torch.device("cuda", local_rank % n)
    torch.cuda.set_device(device)
    return device


def free_port():
    """A TCP port on 127.0.0.1 that is free right now (for MASTER_PORT / --rdzv-endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(rank=None, world_size=None, local_rank=None, local_world_size=None, backend=None,
          timeout=60, master_addr=None, master_port=None):
    """Join the process group and pick this rank's device. Returns (rank, world_size, device).

    Under torchrun call it without arguments. Under mp.spawn pass rank, world_size and a
    master_port (all ranks the same). `timeout` (seconds) bounds every collective: a rank that
    waits longer for its peers raises instead of hanging.
    """
    env_rank, env_local, env_world, env_local_world = env_ranks()
    spawned = rank is not None   # mp.spawn: one machine, so local rank = rank
    rank = rank if spawned else env_rank
    world_size = world_size if world_size is not None else env_world
    if local_rank is None:
        local_rank = rank if spawned else env_local
    if local_world_size is None:
        local_world_size = world_size if spawned else env_local_world
    if master_addr is not None or "MASTER_ADDR" not in os.environ:
        os.environ["MASTER_ADDR"] = master_addr or "127.0.0.1"
    if master_port is not None:
        os.environ["MASTER_PORT"] = str(master_port)
    backend = check_backend(backend, local_world_size) or choose_backend(local_world_size)
    device = rank_device(local_rank)
    exact_float32()   # the course compares ranks with one process: no TF32 on Ampere and newer
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # ranks sharing a CPU: split its cores, or their threads fight (torchrun sets 1 per rank)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))
    timeout = datetime.timedelta(seconds=timeout)
    store = _attempt_store(timeout)
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout,
                            **({"store": store} if store is not None else {}))
    return rank, world_size, device


def _attempt_store(timeout):
    """Under torchrun, the launcher's key-value store with keys private to this attempt.

    After `--max-restarts` restarts the group, the new ranks would otherwise find the addresses
    the dead attempt published there and try to connect to them (seen with torch 2.14:
    "Gloo connectFullMesh failed ... Connection refused", then another restart)."""
    e = os.environ
    if e.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "TORCHELASTIC_RESTART_COUNT" not in e:
        return None
    store = dist.TCPStore(e["MASTER_ADDR"], int(e["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(f"/course/attempt_{e['TORCHELASTIC_RESTART_COUNT']}", store)


def teardown():
    """Leave the process group (safe to call when there is none)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def get_rank():
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size():
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def log0(*args, **kwargs):
    """print() on rank 0 only: one log, not one per rank."""
    if get_rank() == 0:
        print(*args, **kwargs, flush=True)


def unwrap(model):
    """The module inside DataParallel / DistributedDataParallel (the model itself otherwise)."""
    while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        model = model.module
    return model


def save_checkpoint(model, path):
    """Rank 0 saves the UNWRAPPED state_dict (keys without "module."); returns True where saved.
    Other ranks that then read the file must wait for it (dist.barrier())."""
    if get_rank() != 0:
        return False
    atomic_save(unwrap(model).state_dict(), path)   # a kill mid-save keeps the old file whole
    return True


def save_snapshot_all(path, model, optimizer, epoch, history=()):
    """Every rank calls it (it gathers each rank's RNG states: a collective); rank 0 writes the
    snapshot atomically. `epoch` is the next epoch to run."""
    rngs = [rng_state()]
    if get_world_size() > 1:
        rngs = [None] * get_world_size()
        dist.all_gather_object(rngs, rng_state())
    if get_rank() == 0:
        save_snapshot(path, model, optimizer, epoch, history, rng=rngs)


def load_checkpoint(model, path, map_location="cpu"):
    """Load a state_dict saved with or without the wrapper's "module." prefix, safely
    (weights_only=True: tensors only, no arbitrary pickled code)."""
    state = torch.load(path, map_location=map_location, weights_only=True)
    consume_prefix_in_state_dict_if_present(state, "module.")
    return unwrap(model).load_state_dict(state)


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


def _combine_stats(counts, means, variances):
    """Mean and biased variance of the union of groups from each group's count, mean and biased
    variance (Chan et al.'s parallel formula): no E[x^2] - E[x]^2, whose subtraction of two large
    numbers loses the digits of a small variance."""
    n = counts.sum()
    mean = (counts[:, None] * means).sum(0) / n
    m2 = (counts[:, None] * (variances + (means - mean) ** 2)).sum(0)
    return mean, m2 / n, n


class _SyncBatchNormFunction(torch.autograd.Function):
    """The communication of nn.SyncBatchNorm, on any backend: the forward ALL-GATHERS each rank's
    (count, per-channel mean, per-channel variance) and combines them; the backward ALL-REDUCES
    the per-channel sums of the upstream gradient and of gradient * x_hat, which the input
    gradient needs from the whole global batch. The weight and bias gradients stay local (DDP
    averages them over the ranks like any parameter's)."""

    @staticmethod
    def forward(ctx, X, weight, bias, eps):
        dims = [0] + list(range(2, X.dim()))
        count = torch.tensor([X.numel() / X.shape[1]], dtype=X.dtype, device=X.device)
        local = torch.cat([count, X.mean(dims), X.var(dims, unbiased=False)])
        gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, local)
        stats = torch.stack(gathered)                     # (world_size, 1 + 2 * channels)
        c = X.shape[1]
        mean, var, n = _combine_stats(stats[:, 0], stats[:, 1:1 + c], stats[:, 1 + c:])
        shape = [1, c] + [1] * (X.dim() - 2)
        invstd = torch.rsqrt(var + eps)
        X_hat = (X - mean.view(shape)) * invstd.view(shape)
        ctx.save_for_backward(X_hat, invstd, weight, n)
        ctx.dims, ctx.shape = dims, shape
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
        dist.all_reduce(both)                                       # over the global batch
        c = X_hat.shape[1]
        mean_dy, mean_dy_xhat = both[:c] / n, both[c:] / n
        scale = invstd if weight is None else invstd * weight
        dX = (dY - mean_dy.view(shape) - X_hat * mean_dy_xhat.view(shape)) * scale.view(shape)
        return dX, grad_w, grad_b, None


class CPUSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm (1d, 2d or 3d inputs) whose batch statistics come from the whole global batch
    (all ranks), for the CPU, where nn.SyncBatchNorm refuses to run. It communicates as
    nn.SyncBatchNorm does: all-gather of each rank's (count, mean, variance) in the forward,
    all-reduce of two per-channel gradient sums in the backward. Outside training, or in a world
    of one, it is a plain BatchNorm."""

    def _check_input_dim(self, X):
        if X.dim() < 2:
            raise ValueError(f"expected an input of at least 2 dimensions (N, C, ...), got "
                             f"{X.dim()}")

    def forward(self, X):
        if not (self.training and get_world_size() > 1):
            return super().forward(X)
        self._check_input_dim(X)
        Y, mean, var, n = _SyncBatchNormFunction.apply(X, self.weight, self.bias, self.eps)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = self.momentum if self.momentum is not None \
                    else 1 / int(self.num_batches_tracked)
                self.running_mean.mul_(1 - m).add_(m * mean)
                self.running_var.mul_(1 - m).add_(m * var * n / (n - 1))   # unbiased, as BN
        return Y


def convert_sync_batchnorm(model, device):
    """Every BatchNorm layer (1d, 2d, 3d) made to use global-batch statistics under DDP:
    nn.SyncBatchNorm on GPUs, CPUSyncBatchNorm on the CPU, keeping eps, momentum, affine,
    track_running_stats, the parameters and the buffers. Convert BEFORE wrapping in DDP."""
    if torch.device(device).type != "cpu":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if isinstance(model, nn.modules.batchnorm._BatchNorm) and \
            not isinstance(model, CPUSyncBatchNorm):
        new = CPUSyncBatchNorm(model.num_features, model.eps, model.momentum, model.affine,
                               model.track_running_stats)
        new.load_state_dict(model.state_dict())
        new.train(model.training)
        return new
    for name, child in model.named_children():
        setattr(model, name, convert_sync_batchnorm(child, device))
    return model
