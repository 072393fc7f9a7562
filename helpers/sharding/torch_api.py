"""Part V: torch's sharding: FSDP2 (`fully_shard`, one call per layer and one for the root; with
its knobs, reshard_after_forward and explicit prefetching) and the full parameters of a sharded
model.
"""
from itertools import pairwise

import torch
from torch import nn

from ..runtime.mesh import device_mesh
from ..tiny_models import make_model

__all__ = ["fsdp2_api", "fsdp2_model", "fsdp2_layers", "full_params"]


def fsdp2_api():
    """fully_shard and MixedPrecisionPolicy: public in torch.distributed.fsdp since torch 2.6,
    under torch.distributed._composable.fsdp before."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def fsdp2_model(kind, world, device, param_dtype=None, seed=0, sizes=None):
    """`make_model(kind)` with fully_shard on every layer that holds parameters, then the root."""
    fully_shard, MixedPrecisionPolicy = fsdp2_api()
    model = make_model(kind, seed=seed, **(sizes or {})).to(device)
    mesh = device_mesh((world,), ("dp",), device.type)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for m in list(model.modules())[1:]:
        if any(True for _ in m.parameters(recurse=False)):
            fully_shard(m, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def fsdp2_layers(world, device, reshard, prefetch, sizes):
    """The MLP with fully_shard on every Linear layer and the root, reshard_after_forward=reshard;
    prefetch: each layer told which one to gather ahead, forward and backward."""
    fully_shard, _ = fsdp2_api()
    net = make_model("mlp", **(sizes or {})).to(device)
    mesh = device_mesh((world,), ("dp",), device.type)
    layers = [m for m in net if isinstance(m, nn.Linear)]
    for m in layers:
        fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(net, mesh=mesh, reshard_after_forward=reshard)
    if prefetch:   # FSDP2 prefetches one unit ahead by itself; explicit lists say which
        for a, b in pairwise(layers):
            a.set_modules_to_forward_prefetch([b])
            b.set_modules_to_backward_prefetch([a])
    return net


def full_params(model):
    """{name: full tensor} of a fully_shard model (every rank must call: it all-gathers)."""
    return {n: p.full_tensor().detach().cpu() for n, p in model.named_parameters()}
