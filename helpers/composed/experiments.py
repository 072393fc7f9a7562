"""Part VII, everything at once: the chapter's runs, `fn(rank, world, cfg) -> result`.

`train_3d_scratch`: the small GPT on a 3-D mesh from the course's own pieces (scratch.py);
`train_3d_torch`: the same run with PyTorch's engines, in torchtitan's order: one device mesh
(runtime.mesh.device_mesh: init_device_mesh, dims "pp", "dp", "tp"), this rank's pipeline
stage, tensor parallel (parallelize_module with the course's tp_plan) over "tp", then FSDP2
(fully_shard per layer and on the stage) over "dp", then torch.distributed.pipelining's
Schedule1F1B over "pp";
`train_cp_zero2`: the sequence split over "cp" with ZeRO-2 over "dp".
"""
import logging

import torch
import torch.distributed as dist

from ..activations import saved_tensor_bytes
from ..context_parallel.scratch import shard_sequence
from ..data_parallel.scratch import DDPFromScratch
from ..devices import synced_now, synchronize
from ..models import unwrap
from ..pipeline_parallel.schedules import one_f_one_b_rank_order
from ..pipeline_parallel.scratch import pipeline_rank_step, stage_of
from ..runtime.comm import DistComm
from ..runtime.launch import take, take_kwargs
from ..runtime.mesh import MESH_DIMS, coords_of, device_mesh, new_groups
from ..runtime.traffic import count_traffic
from ..sharding.memory import PeakBytes
from ..sharding.zero import Zero2, optimizer_state_bytes
from ..tensor_parallel.torch_api import tp_plan
from ..tiny_models import SmallBlock
from .model import gpt, gpt_batches, gpt_layers, gpt_loss, stage_cuts, validate_data_split
from .results import CPMemory, CPSent, CPZero2Run, Memory3D, Run3D, Sent3D, TorchRun3D
from .scratch import _optimizer, build_stage, cp_gpt

__all__ = ["train_cp_zero2", "train_3d_scratch", "train_3d_torch"]


def _cp_zero2_run(rank, device, shape, model_cfg, batch, steps, lr, groups,
                  recompute) -> CPZero2Run:
    dp, cp = shape
    c = coords_of(rank, (dp, cp), ("dp", "cp"))
    cp_comm = DistComm(groups["cp"][0], device=device)
    lm = gpt(**model_cfg)
    model = Zero2(cp_gpt(lm, cp_comm, recompute).to(device), torch.optim.SGD,
                  lr=lr, momentum=0.9)
    params = list(unwrap(model).parameters())
    held = [*params, *(piece for _, piece, *_ in model.pieces)]
    losses = []
    for X, y in gpt_batches(steps, batch, model_cfg["seq"], model_cfg["vocab"]):
        Xl, yl = (shard_sequence(t.chunk(dp)[c["dp"]], cp, c["cp"], "zigzag", dim=1).to(device)
                  for t in (X, y))
        cp_comm.reset_counts()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with count_traffic() as dp_log, PeakBytes().skip(held) as peak:
            saved, out = saved_tensor_bytes(model, Xl, params=params)
            loss = gpt_loss(out, yl) / len(Xl)
            kept = peak.now                  # what forward left alive for backward
            del out
            loss.backward()
            model.finish_gradient_synchronization()
            grads = sum(g.numel() * g.element_size() for g in model.shard_grads)
            model.step()
        model.zero_grad()
        state = dict(params=sum(p.numel() * p.element_size() for p in params), grads=grads,
                     optim=optimizer_state_bytes(model.optimizer))
        synchronize(device)
        total = torch.tensor([float(loss.detach())], device=device)
        dist.all_reduce(total)
        losses.append(float(total) / (dp * cp))
    return CPZero2Run(coords=c, losses=losses,
                      memory=CPMemory(**state, acts_saved=saved, acts_kept=kept, peak=peak.peak),
                      cuda_peak=torch.cuda.max_memory_allocated(device)
                      if device.type == "cuda" else None,
                      sent=CPSent(dp=dp_log.wire_bytes(), cp=cp_comm.traffic.wire_bytes("send")),
                      weights={n: p.detach().cpu().clone()
                               for n, p in gpt_layers(lm).named_parameters()}
                      if rank == 0 else None)


def train_cp_zero2(rank: int, world: int, cfg: dict) -> dict[str, CPZero2Run]:
    """launch target: cfg["steps"] SGD steps of the GPT (cfg["model"]) on a (dp, cp) =
    cfg["shape"] mesh, for each recomputation in cfg["recomputes"] ("none", "full"): the
    sequence split zig-zag over "cp" (ring attention in every block), ZeRO-2 (helpers.Zero2)
    over all dp x cp ranks (context-parallel ranks hold different tokens: data parallel for
    the weights). Per recomputation: this rank's coords, the losses, the bytes it sent in the
    last step (dp: ZeRO-2's collectives; cp: the ring), its memory by the planner's definition
    (params, grads, optim; acts_saved: what autograd saved in forward, acts_kept: the bytes
    forward left alive for backward) and the allocator's (peak: PeakBytes over the step, beside
    the state; on CUDA also cuda_peak: max_memory_allocated), and rank 0's weights: a
    results.CPZero2Run per recomputation, by its name."""
    # device: models, batches and flags live there (NCCL takes no CPU tensor)
    device, shape, model_cfg, batch, steps, lr, recomputes = take(
        cfg, "device", "shape", "model", "batch", "steps", lr=0.05, recomputes=("none", "full"))
    model_cfg = take_kwargs(model_cfg, gpt)               # gpt's defaults for what it omits
    dp, cp = shape = tuple(shape)
    if dp * cp != world:
        raise ValueError(f"a {dp}x{cp} (dp, cp) mesh needs {dp * cp} ranks, not {world}")
    validate_data_split(batch, dp)
    groups = new_groups(shape, ("dp", "cp"))
    return {rec: _cp_zero2_run(rank, device, shape, model_cfg, batch, steps, lr, groups, rec)
            for rec in recomputes}


def train_3d_scratch(rank: int, world: int, cfg: dict) -> Run3D:
    """launch target: cfg["steps"] SGD steps of the GPT (cfg["model"]: kwargs of gpt) on a
    cfg["shape"] = (pp, dp, tp) mesh, cfg["batch"] sequences per global batch, cfg["m"]
    micro-batches per data-parallel rank. Returns this rank's coords and groups, its weights
    (its tensor-parallel slices, named as in gpt_layers: a slice of an nn.Sequential keeps the
    names), the losses (last stage), the bytes it sent in the last step by dimension, its
    memory (params, grads, optimizer state, peak saved activations) and seconds per step: a
    results.Run3D."""
    device, shape, model_cfg, batch, steps, m, lr = take(cfg, "device", "shape", "model", "batch",
                                                         "steps", m=2, lr=0.05)
    model_cfg = take_kwargs(model_cfg, gpt)               # gpt's defaults for what it omits
    pp, dp, tp = shape = tuple(shape)
    if pp * dp * tp != world:
        raise ValueError(f"a {pp}x{dp}x{tp} mesh needs {pp * dp * tp} ranks, not {world}")
    validate_data_split(batch, dp)
    groups = new_groups(shape)
    c = coords_of(rank, shape)
    tp_comm = DistComm(groups["tp"][0], device=device)
    pp_comm = DistComm(groups["pp"][0], device=device)
    net = gpt_layers(gpt(**model_cfg))
    cuts = stage_cuts(model_cfg["layers"], pp)
    stage = build_stage(net, cuts, c["pp"], tp_comm).to(device)
    model = DDPFromScratch(stage, group=groups["dp"][0])
    opt = _optimizer(model.parameters(), lr)
    first, last = c["pp"] == 0, c["pp"] == pp - 1
    order = one_f_one_b_rank_order(pp, m, c["pp"])
    in_shape = (model_cfg["seq"], model_cfg["width"])
    losses, seconds, peak = [], [], 0
    batches = gpt_batches(steps, batch, model_cfg["seq"], model_cfg["vocab"])
    for X, y in batches:
        # copies, as a data loader gives them (a view would keep the whole data set alive)
        Xl, yl = (t.tensor_split(dp)[c["dp"]].clone().to(device) for t in (X, y))
        tp_comm.reset_counts()
        pp_comm.reset_counts()
        start = synced_now(device)
        with model.no_sync():
            got = pipeline_rank_step(model, pp_comm, order, Xl if first else None,
                                     yl if last else None, m, len(Xl), in_shape,
                                     loss_fn=gpt_loss)
        with count_traffic() as dp_log:
            model.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()
        seconds.append(synced_now(device) - start)
        peak = max(peak, got["peak_bytes"])
        if last:
            loss = torch.tensor(got["loss"], device=device)
            dist.all_reduce(loss, group=groups["dp"][0])
            losses.append(float(loss) / dp)
    tp_bytes = tp_comm.traffic.wire_bytes("all_reduce")
    params = sum(p.numel() * p.element_size() for p in stage.parameters())
    return Run3D(coords=c, groups={k: v[1] for k, v in groups.items()}, losses=losses,
                 weights={n: p.detach().cpu().clone() for n, p in stage.named_parameters()},
                 sent=Sent3D(tp=tp_bytes, pp=pp_comm.traffic.wire_bytes(),
                             dp=dp_log.wire_bytes()),
                 memory=Memory3D(params=params, grads=params, optim=optimizer_state_bytes(opt),
                                 acts=peak),
                 seconds=seconds)


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
    from torch.distributed.tensor.parallel import parallelize_module
    # full_tensor() of a 2-D sharded weight warns that it gathers in two steps: true, harmless
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    device, shape, model_cfg, batch, steps, m, lr = take(cfg, "device", "shape", "model", "batch",
                                                         "steps", m=2, lr=0.05)
    model_cfg = take_kwargs(model_cfg, gpt)               # gpt's defaults for what it omits
    pp, dp, tp = shape = tuple(shape)
    validate_data_split(batch, dp)
    mesh = device_mesh(shape, MESH_DIMS, device.type)
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
