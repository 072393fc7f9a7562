"""Part VII, expert parallelism: the chapter's runs, `fn(rank, world, cfg) -> result` for
helpers.launch. Every rank builds the same MoE and the same global tokens from the seeds, on
its device, and keeps its group of tokens and its experts; results come back on the CPU."""
import torch

from ..compare import cpu_copy
from ..devices import synced_now
from ..runtime.comm import DistComm
from ..runtime.launch import take, take_kwargs
from .moe import MoE, moe_inputs
from .results import EqualRun, ImbalanceRow, ProductionRun
from .scratch import ExpertParallelMoE
from .torch_api import EPMoE, ep_dp_mesh

__all__ = ["moe_step", "ep_equal_run", "ep_imbalance_run", "ep_production_run"]

AUX = 0.01      # weight of the load-balancing loss in the training loss
Z_LOSS = 0.001  # weight of the router z-loss


def moe_step(ep, comm, X, R):
    """Forward and backward of this rank's tokens (the loss: sum(y * R) over every token plus
    AUX x the mean of the ranks' balancing losses and Z_LOSS x that of their z-losses); the
    router's (and a shared expert's) gradient summed over the ranks. Returns y, the input's
    gradient, the gradients this rank holds and aux."""
    x = X.clone().requires_grad_()
    y, aux = ep(x)
    ((y * R).sum() + (AUX * aux["loss"] + Z_LOSS * aux["z_loss"]) / comm.world).backward()
    dense = [*ep.router.parameters(), *(ep.shared.parameters() if ep.shared is not None else ())]
    for p in dense:
        comm.all_reduce(p.grad)
    return y.detach(), x.grad, aux


def _dense_grads(ep):
    grads = {"router." + n: cpu_copy(p.grad) for n, p in ep.router.named_parameters()}
    if ep.shared is not None:
        grads.update({"shared." + n: cpu_copy(p.grad) for n, p in ep.shared.named_parameters()})
    return grads


def ep_equal_run(rank: int, world: int, cfg: dict) -> list[EqualRun]:
    """For each capacity factor in cfg["factors"] (None: dropless): this rank's output, input
    gradient, gradients (named as in the unsplit MoE), dropped choices, the bytes its
    all-to-alls sent in forward and in backward: a results.EqualRun per factor. cfg: moe (MoE
    kwargs), tokens, seed."""
    device, moe_cfg, tokens, factors, seed = take(cfg, "device", "moe", "tokens", "factors",
                                                  seed=0)
    moe_cfg = take_kwargs(moe_cfg, MoE)                   # MoE's defaults for what it omits
    comm = DistComm(device=device)
    X, R = (t.to(device) for t in moe_inputs(tokens, moe_cfg["width"], seed))
    Xl, Rl = X.chunk(world)[rank], R.chunk(world)[rank]
    out = []
    for factor in factors:
        moe = MoE(**dict(moe_cfg, capacity_factor=factor)).to(device)
        ep = ExpertParallelMoE(moe, comm)
        comm.reset_counts()
        y, x_grad, aux = moe_step(ep, comm, Xl, Rl)
        first = rank * ep.local
        mine = {f"experts.{first + i}." + n: cpu_copy(p.grad) for i, e in enumerate(ep.experts)
                for n, p in e.named_parameters()}
        mine.update(_dense_grads(ep))
        total = comm.traffic.wire_bytes("all_to_all")
        out.append(EqualRun(factor=factor, y=cpu_copy(y), x_grad=cpu_copy(x_grad), grads=mine,
                            dropped=aux["dropped"], aux_loss=float(aux["loss"].detach()),
                            fwd_bytes=aux["sent_bytes"], bwd_bytes=total - aux["sent_bytes"],
                            tokens=len(Xl), received=aux["received"].tolist()))
    return out


def ep_imbalance_run(rank: int, world: int, cfg: dict) -> list[ImbalanceRow]:
    """The router pushed towards expert 0 (its bias raised by each value of cfg["skews"]): for
    each skew and each capacity factor in cfg["factors"], this rank's dropped choices, the real
    tokens its experts computed, the bytes it sent forward, its balancing loss and the seconds
    its forward took (median of cfg["repeats"], read with helpers.synced_now): a
    results.ImbalanceRow each. cfg: moe, tokens, skews, factors, repeats, seed."""
    device, moe_cfg, tokens, skews, factors, repeats, seed = take(
        cfg, "device", "moe", "tokens", "skews", "factors", repeats=3, seed=0)
    moe_cfg = take_kwargs(moe_cfg, MoE)                   # MoE's defaults for what it omits
    comm = DistComm(device=device)
    X, _ = moe_inputs(tokens, moe_cfg["width"], seed)
    Xl = X.chunk(world)[rank].to(device)
    rows = []
    for skew in skews:
        for factor in factors:
            moe = MoE(**dict(moe_cfg, capacity_factor=factor)).to(device)
            with torch.no_grad():
                moe.router.bias[0] += skew
            ep = ExpertParallelMoE(moe, comm)
            times = []
            with torch.no_grad():
                for _ in range(repeats):
                    torch.distributed.barrier()
                    start = synced_now(device)
                    _, aux = ep(Xl)
                    times.append(synced_now(device) - start)
            rows.append(ImbalanceRow(skew=skew, factor=factor, dropped=aux["dropped"],
                                     choices=len(Xl) * moe.k,
                                     received=int(aux["received"].sum()),
                                     sent_bytes=aux["sent_bytes"],
                                     aux_loss=float(aux["loss"].detach()),
                                     seconds=sorted(times)[len(times) // 2]))
    return rows


def ep_production_run(rank: int, world: int, cfg: dict) -> ProductionRun:
    """The dropless MoE (cfg["moe"], e.g. with shared_hidden) as EPMoE on a (world / ep, ep)
    mesh: this rank's output and input gradient, its gradients after reduce_gradients (the
    experts' over their own dp group), named as in the unsplit MoE, the bytes its all-to-alls
    sent, which grouped GEMM ran, the tokens its experts computed: a results.ProductionRun.
    cfg: moe, tokens, ep, seed."""
    device, moe_cfg, tokens, ep_size, seed = take(cfg, "device", "moe", "tokens", "ep", seed=0)
    moe_cfg = take_kwargs(moe_cfg, MoE)                   # MoE's defaults for what it omits
    mesh = ep_dp_mesh(world, ep_size, device.type)
    moe = MoE(**dict(moe_cfg, capacity_factor=None)).to(device)
    model = EPMoE(moe, mesh)
    X, R = moe_inputs(tokens, moe_cfg["width"], seed)
    x = X.chunk(world)[rank].to(device).requires_grad_()
    y, aux = model(x)
    loss = (y * R.chunk(world)[rank].to(device)).sum()
    (loss + (AUX * aux["loss"] + Z_LOSS * aux["z_loss"]) / world).backward()
    model.reduce_gradients()
    grads = _dense_grads(model)
    names = {"w1": ("0.weight", True), "b1": ("0.bias", False), "w2": ("2.weight", True),
             "b2": ("2.bias", False)}
    for key, (name, transposed) in names.items():
        g = getattr(model.experts, key).grad
        g = g.to_local() if hasattr(g, "to_local") else g
        for i in range(model.local):
            grads[f"experts.{model.first + i}.{name}"] = cpu_copy(g[i].t() if transposed else g[i])
    return ProductionRun(y=cpu_copy(y), x_grad=cpu_copy(x.grad), grads=grads,
                         sent_bytes=aux["sent_bytes"], grouped_mm=aux["grouped_mm"],
                         received=aux["received"].tolist(), z_loss=float(aux["z_loss"].detach()),
                         first=model.first, local=model.local)
