"""Part III's experiments with torch's own data parallelism across processes, each a launch
target fn(rank, world, cfg): BatchNorm per device against synchronised BatchNorm, uneven inputs
with and without Join. (DDPFromScratch's are in scratch_experiments.py.)
"""
import torch
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ..data import load_tensors
from ..models import unwrap
from ..runtime.launch import take
from ..runtime.progress import report_progress
from .torch_api import bn_net, bn_stats, convert_sync_batchnorm, evaluate_exact, global_batches, \
    train_bn_steps

__all__ = ["bn_vs_syncbn", "bn_grads_same_weights", "bn_step_times", "uneven_inputs_join"]


def bn_vs_syncbn(rank, world, cfg):
    """Train bn_net under DDP with per-device BatchNorm, then with synchronised BatchNorm, from
    the same start on the same global batches (cfg: subset, batch_size, num_steps, lr, seed,
    channels). Returns per variant: BN running statistics, weights, test accuracy."""
    device, subset, batch_size, num_steps, lr, seed, channels = take(
        cfg, "device", "subset", "batch_size", "num_steps", "lr", "seed", channels=16)
    X, y = load_tensors(True, subset)
    X_test, y_test = load_tensors(False, subset)
    batches = global_batches(len(y), batch_size, num_steps, seed)
    results = {}
    for i, variant in enumerate(("bn", "syncbn")):
        report_progress(i + 1, 2, "BatchNorm variant")
        torch.manual_seed(seed)
        net = bn_net(channels).to(device)
        if variant == "syncbn":
            net = convert_sync_batchnorm(net, device)
        model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
        train_bn_steps(model, X, y, batches, lr, device, rank, world)
        correct, total = evaluate_exact(model, X_test, y_test, device)
        results[variant] = dict(
            stats=bn_stats(model), acc=correct / total, total=total,
            state={k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()})
    return results


def _flat_grad(model):
    return torch.cat([p.grad.reshape(-1) for p in unwrap(model).parameters()]).cpu()


def bn_grads_same_weights(rank, world, cfg):
    """The comparison on the same weights: for each state in cfg["states"] (bn_net state dicts
    along one training run) and its global batch (cfg["batches"], indices), the gradient DDP
    leaves (averaged over the ranks) with per-device BatchNorm and with synchronised BatchNorm,
    each from that same state. Returns {"bn": [flat grad, ...], "syncbn": [...]}."""
    device, subset, states, batches, channels = take(cfg, "device", "subset", "states",
                                                     "batches", channels=16)
    X, y = load_tensors(True, subset)
    out = {}
    for variant in ("bn", "syncbn"):
        net = bn_net(channels).to(device)
        if variant == "syncbn":
            net = convert_sync_batchnorm(net, device)
        model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None,
                    broadcast_buffers=False)
        grads = []
        for state, idx in zip(states, batches):
            unwrap(model).load_state_dict(state)
            model.train()
            idx = idx.tensor_split(world)[rank]
            model.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(X[idx].to(device)), y[idx].to(device)).backward()
            grads.append(_flat_grad(model))
        out[variant] = grads
    return out


def bn_step_times(rank, world, cfg):
    """Seconds of a training step (forward, backward, optimizer) of bn_net under DDP with
    per-device BatchNorm and with synchronised BatchNorm, timed in turns (the order reversed
    every other round, the ranks meeting in a barrier before each step) after `warmup`
    rounds. Returns {"bn": [...], "syncbn": [...]}, one sample per round."""
    import time

    import torch.distributed as dist
    device, subset, batch_size, rounds, warmup, channels = take(
        cfg, "device", subset=2048, batch_size=32, rounds=7, warmup=2, channels=16)
    X, y = load_tensors(True, subset)
    idx = global_batches(len(y), batch_size, 1, 0)[0].tensor_split(world)[rank]
    Xb, yb = X[idx].to(device), y[idx].to(device)
    models = {}
    for variant in ("bn", "syncbn"):
        torch.manual_seed(0)
        net = bn_net(channels).to(device)
        if variant == "syncbn":
            net = convert_sync_batchnorm(net, device)
        model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
        models[variant] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
    times = {v: [] for v in models}
    for r in range(warmup + rounds):
        for variant in (("bn", "syncbn") if r % 2 == 0 else ("syncbn", "bn")):
            model, opt = models[variant]
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            nn.functional.cross_entropy(model(Xb), yb).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if r >= warmup:
                times[variant].append(time.perf_counter() - t0)
    return times


def uneven_inputs_join(rank, world, cfg):
    """Uneven inputs: rank r trains on 3 + 2r batches. Under `Join`, a rank that runs out of data
    shadows the others' gradient all-reduces (with zeros) until all are done, so nobody waits
    forever. Launch it with backend="gloo" (a lesson about collectives, not speed). Returns
    {steps, weight, finished}."""
    (use_join,) = take(cfg, use_join=True)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
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
    return dict(steps=steps, finished=finished, weight=model.module.weight.detach().clone())
