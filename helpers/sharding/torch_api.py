"""Part V: torch's sharding: FSDP2 (`fully_shard`, one call per layer and one for the root) and
the full parameters of a sharded model.
"""
import torch

from ..tiny_models import make_model

__all__ = ["fsdp2_api", "fsdp2_model", "full_params"]


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
    from torch.distributed.device_mesh import init_device_mesh
    fully_shard, MixedPrecisionPolicy = fsdp2_api()
    model = make_model(kind, seed=seed, **(sizes or {})).to(device)
    mesh = init_device_mesh(device.type, (world,))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for m in list(model.modules())[1:]:
        if any(True for _ in m.parameters(recurse=False)):
            fully_shard(m, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def full_params(model):
    """{name: full tensor} of a fully_shard model (every rank must call: it all-gathers)."""
    return {n: p.full_tensor().detach().cpu() for n, p in model.named_parameters()}
