"""Part VI's pipeline experiments across processes: the hand-built GPipe, 1F1B and zero-bubble
steps, torch's pipelining schedules and a ping-pong between two ranks, run by `pipeline_worker`
on every rank, each either as it runs on this machine or emulated (helpers.Clock: the real math,
then the box's modelled duration, from FLOPs at helpers.Rates).
"""
from itertools import pairwise

import torch
from torch import nn

from ..devices import synced_now
from ..runtime.comm import DistComm
from ..runtime.emulate import ASSUMED_RATES, Clock, Rates
from ..runtime.launch import take
from ..runtime.progress import report_progress
from .schedules import gpipe_rank_order, one_f_one_b_rank_order
from .scratch import validate_cuts, pipeline_net, pipeline_rank_step, stage_of
from .timelines import zero_bubble_rank_order
from .torch_api import validate_pipelining, pipelining_runs

__all__ = ["pipeline_worker", "forward_flops", "box_model", "PIPELINE_ORDERS"]

PIPELINE_ORDERS = {"gpipe": gpipe_rank_order, "1f1b": one_f_one_b_rank_order,
          "zb": zero_bubble_rank_order}
# a backward computes two products per forward one (input and weight gradients); split
# (zero bubble), each half is one forward's worth
_SHARE = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}


def forward_flops(module):
    """Floating-point operations of one row's forward through `module`: 2 in x out per
    nn.Linear (a lookup, an activation, the loss: next to nothing)."""
    return sum(2 * mod.in_features * mod.out_features for mod in module.modules()
               if isinstance(mod, nn.Linear))


def box_model(net, cuts, rates=ASSUMED_RATES, split=False, equal=False):
    """box_seconds(stage, phase, rows): a box's modelled seconds from its stage's FLOPs at
    rates.compute. split: the backward is split into B (input gradient) and W (weights).
    equal: every stage gets the mean (the assumption of the bubble formulas)."""
    bounds = [0, *cuts, len(net)]
    flops = [forward_flops(net[a:b]) for a, b in pairwise(bounds)]
    if equal:
        flops = [sum(flops) / len(flops)] * len(flops)

    def box_seconds(stage, phase, rows):
        share = 1.0 if split and phase == "B" else _SHARE[phase]
        return rates.compute(share * flops[stage] * max(rows, 1))
    return box_seconds


def _pingpong(comm, rank, shape, repeats):
    """Half the round trip of a `shape` float32 message from rank 0 to rank 1 and back, per
    repeat (seconds, measured on rank 0, on the rank clock: on a GPU the host waits for the
    message's arrival, not only for its queueing); other ranks take no part."""
    times = []
    t = torch.ones(shape, device=comm.device)
    for k in range(repeats + 1):               # the first round warms the connection up
        start = synced_now(comm.device)
        if rank == 0:
            comm.sendrecv((t, 1), (1, shape))
        elif rank == 1:
            back = comm.sendrecv(recv=(0, shape))
            comm.sendrecv((back, 0))
        comm.wait()
        if k:
            times.append((synced_now(comm.device) - start) / 2)
    comm.reset_counts()
    return times


def _validate_runs(runs, n, world, num_layers, threads=False):
    """Every run's settings, checked on every rank before any run starts."""
    for run in runs:
        kind = run.get("kind", "scratch")
        if kind == "pipelining" and threads:
            raise ValueError(f"run kind pipelining ({run.get('schedule')}) runs torch's "
                             "schedules, which need a process group: launch on process ranks "
                             "(threads=False), or leave that run out on thread ranks")
        if kind == "pipelining":
            validate_pipelining(run["schedule"], n, run["m"], world, num_layers, run["cuts"])
        elif kind == "scratch":
            if run["schedule"] not in PIPELINE_ORDERS:
                raise ValueError(f"schedule {run['schedule']!r}: pick one of "
                                 f"{list(PIPELINE_ORDERS)}")
            validate_cuts(run["cuts"], num_layers, world)
            m = run["m"]
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise ValueError(f"m must be a positive int, got {m!r}")
        elif kind != "pingpong":
            raise ValueError(f"run kind {kind!r}: scratch, pipelining or pingpong")


def pipeline_worker(rank, world, cfg):
    """Launch target, several runs in one launch. cfg: net (kwargs of pipeline_net),
    batch_size, seed, rates (dict of helpers.Rates' figures; default: Rates.load()), runs: list
    of dict(kind="scratch"|"pipelining", schedule ("gpipe", "1f1b", "zb" or a torch schedule
    class name), m, cuts, repeats, emulate (a Clock scale: emulated boxes; absent: real), equal
    (emulated stages all of the mean length)), or
    dict(kind="pingpong", rows, repeats). Returns one dict per run: loss, grads (of the first
    repeat), timelines (one per repeat), peak_live, peak_bytes; for a ping-pong, seconds."""
    device, n, runs, net_cfg, rates, seed, comm = take(cfg, "device", "batch_size", "runs", net={},
                                                       rates=None, seed=0, comm=None)
    net = pipeline_net(**net_cfg).to(device)
    _validate_runs(runs, n, world, len(net), threads=comm is not None)
    rates = Rates(**rates) if rates else Rates.load()
    g = torch.Generator().manual_seed(seed)
    X = torch.randint(0, net[0].num_embeddings, (n,), generator=g).to(device)
    y = torch.randint(0, net[-1].out_features, (n,), generator=g).to(device)
    width = net[0].embedding_dim
    comm = comm or DistComm(device=device)     # given: thread ranks (launch(..., threads=True))
    results = []
    for i, run in enumerate(runs):
        report_progress(i + 1, len(runs), "run")
        out = dict(run, timelines=[], skipped=None, rates=rates.source)
        kind, scale = run.get("kind", "scratch"), run.get("emulate")
        clock = lambda scale=scale: Clock(emulate=scale is not None, scale=scale or 1.0,
                                          device=device)
        if kind == "pingpong":       # one-way time of a message between 0 and 1
            out["seconds"] = _pingpong(comm, rank, (run["rows"], width), run["repeats"])
            results.append(out)
            continue
        split = run["schedule"] in ("zb", "ScheduleInterleavedZeroBubble")
        model = (box_model(net, run["cuts"], rates, split, run.get("equal", False))
                 if scale is not None else None)
        if kind == "pipelining":
            out.update(pipelining_runs(net, run["cuts"], rank, world, device, X, y, run["m"],
                                       run["schedule"], run.get("repeats", 1), clock(), model))
            results.append(out)
            continue
        stage = stage_of(net, run["cuts"], rank, world)
        order = PIPELINE_ORDERS[run["schedule"]](world, run["m"], rank)
        seconds = (lambda ph, j, rows, model=model: model(rank, ph, rows)) if model else None
        for rep in range(run.get("repeats", 1)):
            stage.zero_grad()
            got = pipeline_rank_step(stage, comm, order, X if rank == 0 else None,
                                     y if rank == world - 1 else None, run["m"], n, (width,),
                                     clock=clock(), box_seconds=seconds)
            out["timelines"].append(got["timeline"])
            if rep == 0:
                out.update(loss=got["loss"], peak_live=got["peak_live"],
                           peak_bytes=got["peak_bytes"],
                           grads={rank: [p.grad.detach().cpu().clone()
                                         for p in stage.parameters()]})
        out["bytes_sent"] = comm.bytes_sent() / max(1, run.get("repeats", 1))
        comm.reset_counts()
        results.append(out)
    return results
