"""Part VII: the same 3-D run with PyTorch's engines, in torchtitan's order: one device mesh
(init_device_mesh, dims "pp", "dp", "tp"), this rank's pipeline stage, tensor parallel
(parallelize_module with the course's tp_plan) over "tp", then FSDP2 (fully_shard per layer
and on the stage) over "dp", then torch.distributed.pipelining's Schedule1F1B over "pp"."""
import logging

import torch

from ..devices import synced_now
from ..pipeline_parallel.scratch import stage_of
from ..runtime.launch import take, take_kwargs
from ..runtime.mesh import MESH_DIMS
from ..tensor_parallel.torch_api import tp_plan
from ..tiny_models import SmallBlock
from .model import gpt, gpt_batches, gpt_layers, gpt_loss, stage_cuts, validate_data_split
from .results import TorchRun3D

__all__ = ["train_3d_torch"]


def _fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:                          # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def train_3d_torch(rank: int, world: int, cfg: dict) -> TorchRun3D:
    """launch target with the cfg of train_3d_scratch. Returns this rank's coords, the full
    weights (rank 0; gathered with full_tensor), the losses (last stage), the seconds per step
    and the mesh's groups as torch built them: a results.TorchRun3D."""
    import torch.distributed.pipelining as pp_api
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    # full_tensor() of a 2-D sharded weight warns that it gathers in two steps: true, harmless
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    device, shape, model_cfg, batch, steps, m, lr = take(cfg, "device", "shape", "model", "batch",
                                                         "steps", m=2, lr=0.05)
    model_cfg = take_kwargs(model_cfg, gpt)               # gpt's defaults for what it omits
    pp, dp, tp = shape = tuple(shape)
    validate_data_split(batch, dp)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=MESH_DIMS)
    c = {name: mesh[name].get_local_rank() for name in MESH_DIMS}
    net = gpt_layers(gpt(**model_cfg))
    stage = stage_of(net, stage_cuts(model_cfg["layers"], pp), c["pp"]).to(device)
    fully_shard = _fully_shard()
    for layer in stage:                                   # 1. TP over "tp"
        if isinstance(layer, SmallBlock) and tp > 1:
            parallelize_module(layer, mesh["tp"], tp_plan(True, True))
    for layer in stage:                                   # 2. FSDP over "dp", per layer
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(stage, mesh=mesh["dp"])
    rows = batch // dp
    pstage = pp_api.PipelineStage(stage, c["pp"], pp, device, group=mesh["pp"].get_group())
    kwargs = dict(n_microbatches=m, loss_fn=lambda out, y: gpt_loss(out, y) / rows)
    import inspect
    if "scale_grads" in inspect.signature(pp_api.Schedule1F1B.__init__).parameters:
        kwargs["scale_grads"] = False                     # the loss is already a mean
    schedule = pp_api.Schedule1F1B(pstage, **kwargs)      # 3. pipeline over "pp"
    opt = torch.optim.SGD(stage.parameters(), lr=lr, momentum=0.9)
    first, last = c["pp"] == 0, c["pp"] == pp - 1
    losses, seconds = [], []
    batches = gpt_batches(steps, batch, model_cfg["seq"], model_cfg["vocab"])
    for X, y in batches:
        Xl, yl = X.tensor_split(dp)[c["dp"]].to(device), y.tensor_split(dp)[c["dp"]].to(device)
        start = synced_now(device)
        got = []
        kw = dict(target=yl, losses=got) if last else {}
        schedule.step(*([Xl] if first else []), **kw)
        opt.step()
        opt.zero_grad()
        seconds.append(synced_now(device) - start)
        if last:
            loss = torch.stack([g.detach() for g in got]).sum()
            torch.distributed.all_reduce(loss, group=mesh["dp"].get_group())
            losses.append(float(loss) / dp)
    full = {n: p.full_tensor().detach().cpu().clone() for n, p in stage.named_parameters()}
    groups = {name: sorted(torch.distributed.get_process_group_ranks(mesh[name].get_group()))
              for name in MESH_DIMS}
    return TorchRun3D(coords=c, groups=groups, losses=losses, seconds=seconds,
                      weights=full if c["dp"] == 0 and c["tp"] == 0 else None)
