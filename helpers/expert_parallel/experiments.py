"""Part VII, expert parallelism: the chapter's runs, `fn(rank, world, cfg) -> result` for
helpers.launch. Every rank builds the same MoE and the same global tokens from the seeds
and keeps its group of tokens and its experts."""
import time

import torch

from .. import DistComm
from .moe import MoE, moe_inputs
from .scratch import ExpertParallelMoE

__all__ = ["moe_step", "ep_equal_run", "ep_imbalance_run", "ep_chapter"]

AUX = 0.01   # weight of the load-balancing loss in the training loss


def moe_step(ep, comm, X, R):
    """Forward and backward of this rank's tokens (the loss: sum(y * R) over every token plus
    AUX x the mean of the ranks' balancing losses); the router's gradient summed over the
    ranks. Returns y, the input's gradient, the gradients this rank holds and aux."""
    x = X.clone().requires_grad_()
    y, aux = ep(x)
    ((y * R).sum() + AUX * aux["loss"] / comm.world).backward()
    for p in ep.router.parameters():
        comm.all_reduce(p.grad)
    return y.detach(), x.grad, aux


def ep_equal_run(rank, world, cfg):
    """For each capacity factor in cfg["factors"] (None: dropless): this rank's output, input
    gradient, gradients (named as in the unsplit MoE), dropped choices, the bytes its
    all-to-alls sent in forward and in backward. cfg: moe (MoE kwargs), tokens, seed."""
    comm = DistComm(device=cfg["device"])
    X, R = moe_inputs(cfg["tokens"], cfg["moe"]["width"], cfg.get("seed", 0))
    Xl, Rl = X.chunk(world)[rank], R.chunk(world)[rank]
    out = []
    for factor in cfg["factors"]:
        moe = MoE(**dict(cfg["moe"], capacity_factor=factor))
        ep = ExpertParallelMoE(moe, comm)
        comm.log = []
        y, x_grad, aux = moe_step(ep, comm, Xl, Rl)
        first = rank * ep.local
        mine = {f"experts.{first + i}." + n: p.grad for i, e in enumerate(ep.experts)
                for n, p in e.named_parameters()}
        mine.update({"router." + n: p.grad for n, p in ep.router.named_parameters()})
        total = sum(b for op, _, b in comm.log if op == "all_to_all")
        out.append(dict(factor=factor, y=y, x_grad=x_grad, grads=mine, dropped=aux["dropped"],
                        aux_loss=float(aux["loss"].detach()), fwd_bytes=aux["sent_bytes"],
                        bwd_bytes=total - aux["sent_bytes"], tokens=len(Xl),
                        received=aux["received"].tolist()))
    return out


def ep_imbalance_run(rank, world, cfg):
    """The router pushed towards expert 0 (its bias raised by each value of cfg["skews"]): for
    each skew and each capacity factor in cfg["factors"], this rank's dropped choices, the real
    tokens its experts computed, the bytes it sent forward, its balancing loss and the seconds
    its experts took (median of cfg["repeats"]). cfg: moe, tokens, seed."""
    comm = DistComm(device=cfg["device"])
    X, R = moe_inputs(cfg["tokens"], cfg["moe"]["width"], cfg.get("seed", 0))
    Xl = X.chunk(world)[rank]
    rows = []
    for skew in cfg["skews"]:
        for factor in cfg["factors"]:
            moe = MoE(**dict(cfg["moe"], capacity_factor=factor))
            with torch.no_grad():
                moe.router.bias[0] += skew
            ep = ExpertParallelMoE(moe, comm)
            times = []
            with torch.no_grad():
                for _ in range(cfg.get("repeats", 3)):
                    torch.distributed.barrier()
                    start = time.perf_counter()
                    _, aux = ep(Xl)
                    times.append(time.perf_counter() - start)
            rows.append(dict(skew=skew, factor=factor, dropped=aux["dropped"],
                             choices=len(Xl) * moe.k, received=int(aux["received"].sum()),
                             sent_bytes=aux["sent_bytes"], aux_loss=float(aux["loss"].detach()),
                             seconds=sorted(times)[len(times) // 2]))
    return rows


def ep_chapter(rank, world, cfg):
    """Both runs in one launch: cfg["equal"] and cfg["imbalance"] are their cfgs."""
    device = dict(device=cfg["device"])
    return dict(equal=ep_equal_run(rank, world, dict(cfg["equal"], **device)),
                imbalance=ep_imbalance_run(rank, world, dict(cfg["imbalance"], **device)))
