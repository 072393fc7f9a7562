"""Part VII, everything at once: the chapter's runs, `fn(rank, world, cfg) -> result`."""
import torch
import torch.distributed as dist

from ..activations import saved_tensor_bytes
from ..context_parallel.scratch import shard_sequence
from ..devices import synchronize
from ..models import unwrap
from ..runtime.comm import DistComm
from ..runtime.launch import take, take_kwargs
from ..runtime.mesh import coords_of, new_groups
from ..runtime.traffic import count_traffic
from ..sharding.memory import PeakBytes
from ..sharding.zero import Zero2, optimizer_state_bytes
from .model import gpt, gpt_batches, gpt_layers, gpt_loss, validate_data_split
from .results import CPMemory, CPSent, CPZero2Run
from .scratch import cp_gpt

__all__ = ["train_cp_zero2"]


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
