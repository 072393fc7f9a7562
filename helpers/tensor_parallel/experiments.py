"""Part VI's tensor-parallel experiments across processes: the from-scratch TPMLP and TPBlock
against DTensor on the same weights (tp_worker), and a 2x2 mesh of data and tensor
parallelism (mesh2d_worker).
"""
import copy

import torch
import torch.distributed as dist

from ..runtime.comm import DistComm
from ..runtime.progress import report_progress
from ..runtime.traffic import FuncolBytes
from .scratch import TPBlock, TPMLP, block_inputs, block_loss, small_block
from .torch_api import tp_plan

__all__ = ["tp_worker", "mesh2d_worker"]


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _grads(module):
    return {n: _local(p.grad).detach().cpu().clone() for n, p in module.named_parameters()}


def _run(module, X, R, counter):
    """Forward and backward once; returns output, grads (the module's and the input's) and the
    counter's log split into forward and backward."""
    module.zero_grad()
    X = X.detach().clone().requires_grad_()
    out = module(X)
    fwd = list(counter.log)
    block_loss(_local(out), R).backward()
    return dict(out=_local(out).detach().cpu().clone(), grads=_grads(module), fwd=fwd,
                bwd=list(counter.log[len(fwd):]), x_grad=X.grad.detach().cpu().clone())


def tp_worker(rank, world, cfg):
    """spawn_ranks target: the from-scratch TPMLP and TPBlock, and the DTensor SmallBlock (with and
    without PrepareModuleInput), on the same weights and input. Returns {name: result} where a
    result has out, grads (this rank's slices) and the fwd/bwd logs of (op, bytes)."""
    device = cfg["device"]
    block = small_block(**cfg.get("block", {})).to(device)
    X, R = (t.to(device) for t in block_inputs(**cfg["inputs"]))
    comm = DistComm(device=device)
    results = {}
    for name, module in (("mlp", TPMLP(block.mlp, comm)), ("block", TPBlock(block, comm))):
        comm.log = []
        results[name] = _run(module, X, R, comm)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module
    mesh = init_device_mesh(device.type, (world,))
    for name, prep in (("dtensor", True), ("dtensor_plain", False)):
        module = parallelize_module(copy.deepcopy(block), mesh, tp_plan(True, prep))
        with CommDebugMode() as debug, FuncolBytes() as counter:
            got = _run(module, X, R, counter)
        got["comm_counts"] = {str(k): v for k, v in debug.get_comm_counts().items()}
        results[name] = got
    return results


def mesh2d_worker(rank, world, cfg):
    """spawn_ranks target on 4 ranks: a 2x2 device mesh ("dp", "tp"); the SmallBlock tensor parallel
    over "tp" (parallelize_module) and data parallel over "dp" (each dp group gets half of each
    global batch; gradients averaged over "dp" by FSDP2 fully_shard, or by an all-reduce where
    fully_shard is unavailable). SGD for cfg["steps"] steps; returns the full weights
    (rank 0), the losses and how the dp dimension was done."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    import logging
    # full_tensor() of a 2D-sharded weight warns that it gathers in two steps: true, harmless
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    device = cfg["device"]
    dp, tp = cfg.get("shape", (2, 2))
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()
    block = small_block(**cfg.get("block", {})).to(device)
    model = parallelize_module(block, mesh["tp"], tp_plan(True, True))
    how = "manual all-reduce over dp"
    if cfg.get("fsdp", True):
        try:
            from torch.distributed.fsdp import fully_shard
            model = fully_shard(model, mesh=mesh["dp"])
            how = "fully_shard over dp"
        except Exception as e:   # noqa: BLE001 - old torch without FSDP2 on a 2D mesh
            how = f"manual all-reduce over dp (fully_shard: {type(e).__name__})"
    opt = torch.optim.SGD(model.parameters(), lr=cfg.get("lr", 0.1))
    losses = []
    for step in range(cfg.get("steps", 3)):
        report_progress(step + 1, cfg.get("steps", 3), "step")
        X, R = block_inputs(**dict(cfg["inputs"], seed=step))
        rows = X.shape[0] // dp
        Xs = X[dp_rank * rows:(dp_rank + 1) * rows].to(device)
        Rs = R[dp_rank * rows:(dp_rank + 1) * rows].to(device)
        opt.zero_grad()
        loss = block_loss(_local(model(Xs)), Rs) / X.shape[0] * dp   # mean over this dp shard
        loss.backward()
        if how.startswith("manual"):
            group = mesh.get_group("dp")
            for p in model.parameters():
                g = _local(p.grad)
                dist.all_reduce(g, group=group)
                g /= dp
        opt.step()
        total = loss.detach().clone() / dp
        dist.all_reduce(total, group=mesh.get_group("dp"))
        losses.append(float(total))
    full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
            for n, p in model.named_parameters()}
    local = {n: tuple(_local(p).shape) for n, p in model.named_parameters()}
    return dict(weights=full if rank == 0 else None, losses=losses, how=how, local_shapes=local,
                coords=(dp_rank, mesh["tp"].get_local_rank()))
