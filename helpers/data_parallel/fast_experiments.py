"""Part IV's fast trainer across processes: `train_fast_rank`, the launch target that trains
FastDataParallel (fast.py) on each rank's slice of the global batch, the flat gradients summed
in one all_reduce (scripts/bench.py and the fixes chapter time it)."""
import torch

from ..data import load_tensors
from ..devices import synced_now, synchronize
from ..models import init_lenet_params
from ..runtime.launch import take
from .fast import FastDataParallel, ResidentLoader, resident_accuracy
from .results import EpochRun

__all__ = ["train_fast_rank"]


def train_fast_rank(rank, world, cfg):
    """One rank of the fast trainer across processes, a launch target (`helpers.launch`): the
    default process group is already set up, `cfg["device"]` (set by launch) is this rank's.

    Every rank builds the same LeNet (`cfg["seed"]`) and draws the same global batches of
    `cfg["batch_size"]` (ResidentLoader's order); FastDataParallel(group=WORLD) trains on this
    rank's slice and sums the flat gradients with one all_reduce. cfg: batch_size, lr,
    num_epochs, subset, seed, compile (default False), return_params. Returns this rank's
    results.EpochRun: epoch_times (from one barrier to the next: the slowest rank's time),
    test_acc, param_sum (the sum of |params| in float64: equal on every rank), compiled, and
    the parameters as lists when return_params is set."""
    import torch.distributed as dist
    device, batch_size, lr, num_epochs, subset, seed, compile_, return_params = take(
        cfg, "device", "batch_size", "lr", "num_epochs", "subset", "seed", compile=False,
        return_params=False)
    device = torch.device(device)
    if device.type == "cpu":   # as the benchmark's other ranks: one thread, on a core of its own
        from ..runtime.group import pin_to_core
        pin_to_core(rank)
    X, y = load_tensors(True, subset, device)
    X_test, y_test = load_tensors(False, subset, device)
    net = FastDataParallel(init_lenet_params(seed=seed), [device], lr, X, y,
                           compile=compile_, group=dist.group.WORLD)
    loader = ResidentLoader(X, y, batch_size, seed=seed)
    times = []
    for _ in range(num_epochs):
        dist.barrier()
        t0 = synced_now(device)
        for idx in loader.index_batches():
            net.step(idx)
        synchronize(device)
        dist.barrier()
        times.append(synced_now(device) - t0)
    params = net.params[0]
    return EpochRun(epoch_times=times, test_acc=resident_accuracy(params, X_test, y_test),
                    param_sum=float(sum(p.detach().double().abs().sum() for p in params)),
                    compiled=net.compiled,
                    params=[p.tolist() for p in params] if return_params else None)
