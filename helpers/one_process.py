"""The one-process runs every distributed run is compared with: the same model, the same
initialisation, the combined batch (Parts III and V), and the pieces they share: a rank's slice
of a global batch, the loss, the optimizers and their param groups.
"""
import copy

import torch
from torch.nn import functional as F

from .tiny_models import make_model

__all__ = ["flat_cross_entropy", "params_of", "local_batch", "adamw_groups", "make_optimizer",
           "plain_optimizer", "train_one_process"]


def flat_cross_entropy(out, y):
    """Cross-entropy of (batch, ..., classes) logits against (batch, ...) labels, in float32."""
    return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))


def params_of(module):
    """{name: a CPU copy of the parameter}: what runs are compared by."""
    return {n: p.detach().clone().cpu() for n, p in module.named_parameters()}


def local_batch(batch, rank, world, device):
    """This rank's slice (tensor_split) of a global batch (X, y), on `device`."""
    X, y = batch
    return X.tensor_split(world)[rank].to(device), y.tensor_split(world)[rank].to(device)


def adamw_groups(module, lr=1e-3, weight_decay=0.1):
    """Two param groups, as in practice: weight decay on matrices, none on biases and norms."""
    ps = [p for p in module.parameters() if p.requires_grad]
    return [dict(params=[p for p in ps if p.dim() >= 2], weight_decay=weight_decay),
            dict(params=[p for p in ps if p.dim() < 2], weight_decay=0.0)], dict(lr=lr)


def make_optimizer(module, optim):
    """"sgd": SGD with momentum; "adamw" or "adamw_groups": AdamW with two param groups;
    "sgd_groups": SGD with momentum and the same two groups (weight decay on matrices)."""
    if optim == "sgd":
        return torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    groups, kw = adamw_groups(module)
    if optim == "sgd_groups":
        return torch.optim.SGD(groups, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(groups, **kw)


def plain_optimizer(params, optim):
    """One param group: AdamW (lr 1e-3; "adamw": no weight decay, "adamw_decay": 0.1 on every
    parameter, as the ZeRO wrappers given weight_decay=0.1 step) or SGD (lr 0.05, momentum 0.9)."""
    if optim == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1 if optim == "adamw_decay" else 0.0)


def train_one_process(kind, batches, device, num_steps, optim="adamw", compute_dtype=None,
                      sizes=None, groups=True, micro=1, clip=None, norms=None):
    """One process, the combined batch, the same init: what every distributed run must equal.
    `groups`: the two param groups of make_optimizer (Parts III and V's wrappers), or one group,
    plain_optimizer's (the FSDP runs step all shards alike). With `compute_dtype`, a
    low-precision copy computes and the fp32 weights take its gradients. Each step takes
    `micro` batches (each loss divided by `micro`); with `clip`, the gradients are clipped by
    their global norm before the step, and the norms appended to the list `norms`."""
    model = make_model(kind, **(sizes or {})).to(device)
    opt = make_optimizer(model, optim) if groups else plain_optimizer(model.parameters(), optim)
    for s in range(min(num_steps, len(batches) // micro)):
        for X, y in batches[s * micro:(s + 1) * micro]:
            X, y = X.to(device), y.to(device)
            if compute_dtype is None:
                (flat_cross_entropy(model(X), y) / micro).backward()
            else:   # low-precision copy for the compute, fp32 master weights and gradients
                low = copy.deepcopy(model).to(compute_dtype)
                Xl = X.to(compute_dtype) if X.is_floating_point() else X
                (flat_cross_entropy(low(Xl).float(), y) / micro).backward()
                for p, q in zip(model.parameters(), low.parameters(), strict=True):
                    p.grad = q.grad.float() if p.grad is None else p.grad + q.grad.float()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if norms is not None:
                norms.append(float(norm))
        opt.step()
        opt.zero_grad()
    return params_of(model)
