"""Part III's data-parallel experiments across processes: BatchNorm per device against
synchronised BatchNorm under DDP (bn_worker), and uneven inputs with and without Join
(join_worker).
"""
import torch
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ..data import load_tensors
from ..models import unwrap
from ..runtime.group import setup, teardown
from .torch_api import bn_net, bn_stats, convert_sync_batchnorm, evaluate_exact, global_batches, \
    train_bn_steps

__all__ = ["bn_worker", "join_worker"]


def bn_worker(rank, world_size, port, cfg):
    """mp.spawn target: train bn_net under DDP with per-device BatchNorm, then with synchronised
    BatchNorm, from the same start on the same global batches. Each rank saves its results to
    f"{cfg['out']}.rank{rank}.pt": per variant, BN running statistics, weights, test accuracy."""
    rank, world_size, device = setup(rank, world_size, master_port=port,
                                     timeout=cfg.get("timeout", 60))
    X, y = load_tensors(True, cfg["subset"])
    X_test, y_test = load_tensors(False, cfg["subset"])
    batches = global_batches(len(y), cfg["batch_size"], cfg["num_steps"], cfg["seed"])
    results = {}
    for variant in ("bn", "syncbn"):
        torch.manual_seed(cfg["seed"])
        net = bn_net(cfg.get("channels", 16)).to(device)
        if variant == "syncbn":
            net = convert_sync_batchnorm(net, device)
        model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
        train_bn_steps(model, X, y, batches, cfg["lr"], device, rank, world_size)
        correct, total = evaluate_exact(model, X_test, y_test, device)
        results[variant] = dict(
            stats=bn_stats(model), acc=correct / total, total=total,
            state={k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()})
    torch.save(results, f"{cfg['out']}.rank{rank}.pt")
    teardown()


def join_worker(rank, world_size, port, out, use_join=True, timeout=20):
    """mp.spawn target for uneven inputs: rank r trains on 3 + 2r batches. Under `Join`, a rank
    that runs out of data shadows the others' gradient all-reduces (with zeros) until all are done,
    so nobody waits forever. Saves {steps, weight, finished} to f"{out}.rank{rank}.pt"."""
    rank, world_size, device = setup(rank, world_size, master_port=port, backend="gloo",
                                     timeout=timeout)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))   # CPU and gloo: a lesson about collectives, not speed
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps, g = 3 + 2 * rank, torch.Generator().manual_seed(rank)
    finished = True
    try:
        with Join([model], enable=use_join):
            for _ in range(steps):
                loss = model(torch.randn(8, 4, generator=g)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    except RuntimeError:   # without Join: the rank with more batches times out waiting
        finished = False
    torch.save(dict(steps=steps, finished=finished, weight=model.module.weight.detach().clone()),
               f"{out}.rank{rank}.pt")
    teardown()
