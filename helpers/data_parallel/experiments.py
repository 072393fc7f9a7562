"""Part III: a custom module to wrap, and the worker that mp.spawn starts from a notebook.

Worker functions live here, not in a notebook: mp.spawn pickles its target by name, and a child
process cannot find a function that was defined in a notebook's __main__.
"""
import torch
from torch import nn
from torch.nn import functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from .data import load_tensors
from .distributed import convert_sync_batchnorm, evaluate_exact, setup, teardown, unwrap

__all__ = ["TwoInputNet", "side_features", "bn_net", "bn_stats", "global_batches",
           "train_bn_steps", "bn_worker", "join_worker"]


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


def train_bn_steps(model, X, y, batches, lr, device, rank=0, world_size=1):
    """SGD (momentum 0.9) over the given global batches; this rank trains on its slice of each."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    for idx in batches:
        idx = idx.tensor_split(world_size)[rank]
        loss = F.cross_entropy(model(X[idx].to(device)), y[idx].to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return model


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
