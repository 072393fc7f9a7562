"""Part VI's tensor-parallel experiments across processes: the from-scratch TPMLP and TPBlock
against DTensor on the same weights (tp_worker), and a 2x2 mesh of data and tensor
parallelism (mesh2d_worker).
"""
import copy

import torch
import torch.distributed as dist

from ..activations import local_tensor, saved_tensor_bytes
from ..runtime.comm import DistComm
from ..runtime.launch import take
from ..runtime.mesh import device_mesh
from ..runtime.progress import report_progress
from ..runtime.traffic import ByteLog, FuncolBytes, count_traffic
from ..tiny_models import block_inputs, block_loss, small_block, small_stack
from .results import BlockRun, HsdpRun, Mesh2DRun, VocabRun
from .scratch import TPMLP, TPBlock, copy_to_tp, shard_of
from .sequence import (
    SPBlock,
    VocabEmbedding,
    sync_replicated_grads,
    tiny_tp_lm,
    vocab_parallel_cross_entropy,
)
from .torch_api import sp_plan, tp_plan, vocab_plan

__all__ = ["tp_worker", "sp_runs", "vocab_runs", "mesh2d_worker", "hsdp_worker"]


def _grad_like(p):
    """A parameter's gradient, this rank's piece laid out as the parameter is: DTensor may
    leave it Partial (a sequence-parallel layer norm's: each rank holds part of the sum) or
    Replicate (a vocabulary-split embedding's), and redistributing does the missing step."""
    g = p.grad
    if hasattr(g, "placements") and tuple(g.placements) != tuple(p.placements):
        g = g.redistribute(p.device_mesh, p.placements)
    return local_tensor(g)


def _grads(module):
    return {n: _grad_like(p).detach().cpu().clone() for n, p in module.named_parameters()}


def _run(module, X, R, counter):
    """Forward and backward once; returns output, grads (the module's and the input's) and the
    counter's log split into forward and backward."""
    module.zero_grad()
    X = X.detach().clone().requires_grad_()
    out = module(X)
    fwd = counter.traffic.mark()
    block_loss(local_tensor(out), R).backward()
    return dict(out=local_tensor(out).detach().cpu().clone(), grads=_grads(module),
                fwd=counter.traffic.until(fwd).records, bwd=counter.traffic.since(fwd).records,
                x_grad=X.grad.detach().cpu().clone())


def tp_worker(rank: int, world: int, cfg: dict) -> dict[str, BlockRun | VocabRun]:
    """Launch target: the from-scratch TPMLP and TPBlock, and the DTensor SmallBlock (with and
    without PrepareModuleInput), on the same weights and input. Returns {name: result}, a
    results.BlockRun (out, grads: this rank's slices, the fwd/bwd logs) per module, with sp_runs'
    and (given lm) vocab_runs' results."""
    device, inputs, block_cfg, lm = take(cfg, "device", "inputs", block={}, lm=None)
    block = small_block(**block_cfg).to(device)
    X, R = (t.to(device) for t in block_inputs(**inputs))
    comm = DistComm(device=device)
    results = {}
    for name, module in (("mlp", TPMLP(block.mlp, comm)), ("block", TPBlock(block, comm))):
        comm.reset_counts()
        results[name] = BlockRun(**_run(module, X, R, comm))
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module
    mesh = device_mesh((world,), ("tp",), device.type)
    for name, prep in (("dtensor", True), ("dtensor_plain", False)):
        module = parallelize_module(copy.deepcopy(block), mesh, tp_plan(True, prep))
        with CommDebugMode() as debug, FuncolBytes() as counter:
            got = _run(module, X, R, counter)
        results[name] = BlockRun(**got, comm_counts={str(k): v for k, v in
                                                     debug.get_comm_counts().items()})
    results.update(sp_runs(rank, world, block, X, R, comm, mesh))
    if lm:
        results.update(vocab_runs(rank, world, lm, comm, mesh))
    return results


def _seq(t, rank, world):
    return t.chunk(world, 1)[rank].contiguous()


def sp_runs(rank, world, block, X, R, comm, mesh) -> dict[str, BlockRun]:
    """The block without and with sequence parallelism, by hand (SPBlock) and with DTensor
    (sp_plan), on this rank's positions: output and input-gradient shards, the gradients, the
    collectives in forward and backward, and the activations autograd saved in forward."""
    from torch.distributed.tensor.parallel import parallelize_module
    out = {}
    for name in ("unsplit", "tp", "sp"):
        module = {"unsplit": lambda: copy.deepcopy(block), "tp": lambda: TPBlock(block, comm),
                  "sp": lambda: SPBlock(block, comm)}[name]()
        x = (X if name != "sp" else _seq(X, rank, world)).detach().clone().requires_grad_()
        comm.reset_counts()
        saved, y = saved_tensor_bytes(module, x)
        fwd = comm.traffic.mark()
        block_loss(y, R if name != "sp" else _seq(R, rank, world)).backward()
        if name == "sp":
            sync_replicated_grads(module, comm)
        out[name] = BlockRun(out=y.detach().cpu().clone(), x_grad=x.grad.detach().cpu().clone(),
                             grads=_grads(module), saved=saved,
                             fwd=comm.traffic.until(fwd).records,
                             bwd=comm.traffic.since(fwd).records)
    module = parallelize_module(copy.deepcopy(block), mesh, sp_plan())
    x = _seq(X, rank, world).detach().clone().requires_grad_()
    with FuncolBytes() as counter:
        saved, y = saved_tensor_bytes(module, x)
        fwd = counter.traffic.mark()
        block_loss(local_tensor(y), _seq(R, rank, world)).backward()
    placements = {n: str(getattr(p.grad, "placements", None)) for n, p in
                  module.named_parameters() if n.startswith("ln")}
    out["sp_dtensor"] = BlockRun(out=local_tensor(y).detach().cpu().clone(), grads=_grads(module),
                                 ln_grad_placements=placements,
                                 x_grad=x.grad.detach().cpu().clone(), saved=saved,
                                 fwd=counter.traffic.until(fwd).records,
                                 bwd=counter.traffic.since(fwd).records)
    return out


def vocab_runs(rank, world, lm_cfg, comm, mesh) -> dict[str, VocabRun]:
    """The TinyTPLM with its vocabulary split, by hand (VocabEmbedding, a column-split head,
    vocab_parallel_cross_entropy) and with DTensor (vocab_plan, loss_parallel): the loss, the
    gradients of this rank's slices, the collectives, and the logits' bytes on this rank."""
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module
    model_cfg, batch, seq, seed = take(lm_cfg, "model", "batch", "seq", seed=0)
    lm = tiny_tp_lm(**model_cfg).to(comm.device)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, lm.head.out_features, (batch, seq), generator=g)
    y = torch.randint(0, lm.head.out_features, ids.shape, generator=g)
    ids, y = ids.to(comm.device), y.to(comm.device)
    emb, blk = VocabEmbedding(lm.emb, comm), TPBlock(lm.block, comm)
    head_w = torch.nn.Parameter(shard_of(lm.head.weight, 0, rank, world))
    comm.reset_counts()
    logits = torch.nn.functional.linear(copy_to_tp(blk(emb(ids)), comm), head_w)
    loss = vocab_parallel_cross_entropy(logits, y, comm, start=rank * head_w.shape[0])
    fwd = comm.traffic.mark()
    loss.backward()
    grads = dict(_grads(blk), **{"emb.weight": emb.weight.grad.detach().cpu().clone(),
                                 "head.weight": head_w.grad.detach().cpu().clone()})
    out = {"vocab": VocabRun(loss=loss.item(), grads=grads, fwd=comm.traffic.until(fwd).records,
                             bwd=comm.traffic.since(fwd).records,
                             logits_bytes=logits.numel() * logits.element_size())}
    model = parallelize_module(copy.deepcopy(lm), mesh, vocab_plan())
    with FuncolBytes() as counter:
        logits = model(ids)
        with loss_parallel():
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss.backward()
    placements = {n: (str(p.placements), str(p.grad.placements))
                  for n, p in model.named_parameters() if not n.startswith("block")}
    out["vocab_dtensor"] = VocabRun(loss=local_tensor(loss).item(), grads=_grads(model),
                                    log=counter.traffic.records,
                                    placements=placements,
                                    logits_bytes=local_tensor(logits).numel() * 4)
    return out


def _per_dim(log, tp_log, groups):
    """A step's collectives by mesh dimension: {dim: {op: [calls, wire bytes]}}. FSDP's go
    through torch.distributed (count_traffic, by group); DTensor's tensor-parallel ones are
    functional collectives (FuncolBytes)."""
    out = {}
    for ranks, g_log in log.by_group().items():
        dim = next((d for d, g in groups.items() if tuple(g) == ranks), str(ranks))
        out[dim] = {op: [n, g_log.wire_bytes(op)] for op, n in g_log.ops().items()}
    for op, n in tp_log.ops().items():
        row = out.setdefault("tp", {}).setdefault(op, [0, 0.0])
        row[0] += n
        row[1] += tp_log.wire_bytes(op)
    return out


def mesh2d_worker(rank: int, world: int, cfg: dict) -> Mesh2DRun:
    """Launch target on 4 ranks: a 2x2 device mesh ("dp", "tp"); a stack of SmallBlocks, each
    tensor parallel over "tp" (parallelize_module) and data parallel over "dp" (each dp group
    gets half of each global batch): cfg["wrap"] "block" (fully_shard per block, then the root,
    as FSDP2 is meant to be used) or "root" (the root only). SGD for cfg["steps"] steps; returns
    the full weights (rank 0), the losses, the local shapes, and the last step's collectives
    per mesh dimension: a results.Mesh2DRun."""
    import logging

    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module
    # full_tensor() of a 2D-sharded weight warns that it gathers in two steps: true, harmless
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    device, inputs, (dp, tp), blocks, block_cfg, wrap, lr, steps = take(
        cfg, "device", "inputs", shape=(2, 2), blocks=2, block={}, wrap="block", lr=0.1, steps=3)
    mesh = device_mesh((dp, tp), ("dp", "tp"), device.type)
    dp_rank = mesh["dp"].get_local_rank()
    model = small_stack(blocks, **block_cfg).to(device)
    for block in model:                        # tensor parallel inside each block, over "tp"
        parallelize_module(block, mesh["tp"], tp_plan(True, True))
    if wrap == "block":
        for block in model:                    # one FSDP unit per block, over "dp"
            fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])        # the root: what no block holds
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    groups = {d: dist.get_process_group_ranks(mesh.get_group(d)) for d in ("dp", "tp")}
    for step in range(steps):
        report_progress(step + 1, steps, "step")
        X, R = block_inputs(**dict(inputs, seed=step))
        rows = X.shape[0] // dp
        Xs = X[dp_rank * rows:(dp_rank + 1) * rows].to(device)
        Rs = R[dp_rank * rows:(dp_rank + 1) * rows].to(device)
        opt.zero_grad()
        with count_traffic() as log, FuncolBytes() as tp_log:
            # this dp shard's mean
            loss = block_loss(local_tensor(model(Xs)), Rs) / X.shape[0] * dp
            loss.backward()
        opt.step()
        total = loss.detach().clone() / dp
        dist.all_reduce(total, group=mesh.get_group("dp"))
        losses.append(float(total))
    full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
            for n, p in model.named_parameters()}
    local = {n: tuple(local_tensor(p).shape) for n, p in model.named_parameters()}
    return Mesh2DRun(weights=full if rank == 0 else None, losses=losses, local_shapes=local,
                     coords=(dp_rank, mesh["tp"].get_local_rank()),
                     traffic=_per_dim(log, tp_log.traffic, groups), groups=groups)


def hsdp_worker(rank: int, world: int, cfg: dict) -> HsdpRun:
    """launch target on 4 ranks: HSDP, fully_shard over a 2-D mesh ("replicate", "shard"):
    each parameter sharded over "shard" (2 ranks), replicated over "replicate" (2 groups), so
    gradients are reduce-scattered within a group and all-reduced across; each of the 4 ranks
    trains on a quarter of the batch. Also an nn.Linear(5, 3) fully_shard over "shard": rows
    that do not divide (torch.chunk: 2 and 1). Returns losses, weights (rank 0), local shapes,
    the placements, the last step's collectives per mesh dimension: a results.HsdpRun."""
    from torch.distributed.fsdp import fully_shard
    device, inputs, blocks, block_cfg, lr, steps = take(cfg, "device", "inputs", blocks=2,
                                                        block={}, lr=0.1, steps=3)
    mesh = device_mesh((2, 2), ("replicate", "shard"), device.type)
    model = small_stack(blocks, **block_cfg).to(device)
    for block in model:
        fully_shard(block, mesh=mesh)          # a 2-D mesh: HSDP (replicate, shard)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    groups = {d: dist.get_process_group_ranks(mesh.get_group(d)) for d in ("replicate", "shard")}
    losses = []
    for step in range(steps):
        X, R = block_inputs(**dict(inputs, seed=step))
        rows = X.shape[0] // world
        Xs, Rs = (t[rank * rows:(rank + 1) * rows].to(device) for t in (X, R))
        opt.zero_grad()
        with count_traffic() as log:
            loss = block_loss(model(Xs), Rs) / X.shape[0] * world
            loss.backward()
        opt.step()
        total = loss.detach().clone() / world
        dist.all_reduce(total)
        losses.append(float(total))
    traffic = _per_dim(log, ByteLog(), groups)
    p0 = next(model.parameters())
    torch.manual_seed(1)
    odd = torch.nn.Linear(5, 3).to(device)
    want = {n: p.detach().cpu().clone() for n, p in odd.named_parameters()}
    fully_shard(odd, mesh=mesh["shard"])
    odd_local = {n: tuple(p.to_local().shape) for n, p in odd.named_parameters()}
    odd_full = {n: p.full_tensor().detach().cpu() for n, p in odd.named_parameters()}
    full = {n: p.full_tensor().detach().cpu().clone()       # a collective: every rank
            for n, p in model.named_parameters()}
    return HsdpRun(losses=losses, traffic=traffic, groups=groups,
                   weights=full if rank == 0 else None,
                   local_shapes={n: tuple(p.to_local().shape)
                                 for n, p in model.named_parameters()},
                   placements=str(p0.placements), odd_local=odd_local,
                   odd_equal=all(torch.equal(odd_full[n], want[n]) for n in want))
