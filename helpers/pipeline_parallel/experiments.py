"""Part VI's pipeline experiments across processes, one launch target per kind of run:
`pipeline_run` (the hand-built GPipe, 1F1B and zero-bubble steps), `pipelining_run` (torch's
pipelining schedules) and `pingpong_run` (a message between two ranks). The chapter runs them
all in one launch, each under its label (helpers.run_ranks). A step runs either as it runs on
this machine or emulated (helpers.Clock: the real math, then the box's modelled duration, from
FLOPs at helpers.Rates).
"""
from itertools import pairwise

import torch
from torch import nn

from ..devices import synced_now
from ..runtime.comm import DistComm
from ..runtime.emulate import ASSUMED_RATES, Clock, Rates
from ..runtime.launch import take
from ..validate import validate_positive_int
from .results import PingPong, PipelineRun, PipeliningRun
from .schedules import gpipe_rank_order, one_f_one_b_rank_order
from .scratch import pipeline_net, pipeline_rank_step, stage_of
from .timelines import zero_bubble_rank_order
from .torch_api import pipelining_runs, validate_pipelining

__all__ = ["pipeline_run", "pipelining_run", "pingpong_run", "forward_flops", "box_model",
           "PIPELINE_ORDERS"]

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


def _net_and_batch(net_cfg, n, seed, device):
    """The seeded net, whole on every rank (each keeps its stage), and the batch (X, y)."""
    net = pipeline_net(**net_cfg).to(device)
    g = torch.Generator().manual_seed(seed)
    X = torch.randint(0, net[0].num_embeddings, (n,), generator=g).to(device)
    y = torch.randint(0, net[-1].out_features, (n,), generator=g).to(device)
    return net, X, y


def _model(net, cuts, schedule, emulate, equal, rates):
    """The emulated boxes' box_seconds (None: real boxes); rates: Rates' figures as a dict
    (default: Rates.load())."""
    if emulate is None:
        return None
    split = schedule in ("zb", "ScheduleInterleavedZeroBubble")
    return box_model(net, cuts, Rates(**rates) if rates else Rates.load(), split, equal)


def _clock(emulate, device):
    return Clock(emulate=emulate is not None, scale=emulate or 1.0, device=device)


def pipeline_run(rank: int, world: int, cfg: dict) -> PipelineRun:
    """Launch target: `repeats` steps of the hand-built `schedule` ("gpipe", "1f1b" or "zb")
    with `m` micro-batches, the net cut at `cuts` (one stage per rank). cfg: net (kwargs of
    pipeline_net), batch_size, seed, repeats, emulate (a Clock scale: emulated boxes; None:
    real), equal (emulated stages all of the mean length), rates (dict of helpers.Rates'
    figures; default: Rates.load()). Returns a results.PipelineRun: schedule, m, loss (the
    last rank's) and grads ({stage: [...]}) of the first step, timelines (one per step),
    peak_live, peak_bytes, bytes_sent (per step)."""
    (device, schedule, m, cuts, n, net_cfg, seed, repeats, emulate, equal, rates,
     comm) = take(cfg, "device", "schedule", "m", "cuts", "batch_size", net={}, seed=0,
                  repeats=1, emulate=None, equal=False, rates=None, comm=None)
    if schedule not in PIPELINE_ORDERS:
        raise ValueError(f"schedule {schedule!r}: pick one of {list(PIPELINE_ORDERS)} "
                         "(torch's schedules: helpers.pipelining_run)")
    validate_positive_int(m, "m")
    validate_positive_int(repeats, "repeats", fix="the first step's results")
    net, X, y = _net_and_batch(net_cfg, n, seed, device)
    stage = stage_of(net, cuts, rank, world)      # refuses cuts that do not fit the ranks
    model = _model(net, cuts, schedule, emulate, equal, rates)
    seconds = (lambda ph, j, rows: model(rank, ph, rows)) if model else None
    order = PIPELINE_ORDERS[schedule](world, m, rank)
    comm = comm or DistComm(device=device)     # given: thread ranks (threads=True)
    comm.reset_counts()
    timelines, first = [], None
    for rep in range(repeats):
        stage.zero_grad()
        got = pipeline_rank_step(stage, comm, order, X if rank == 0 else None,
                                 y if rank == world - 1 else None, m, n,
                                 (net[0].embedding_dim,), clock=_clock(emulate, device),
                                 box_seconds=seconds)
        timelines.append(got["timeline"])
        if rep == 0:
            first = dict(loss=got["loss"], peak_live=got["peak_live"],
                         peak_bytes=got["peak_bytes"],
                         grads={rank: [p.grad.detach().cpu().clone()
                                       for p in stage.parameters()]})
    sent = comm.traffic.wire_bytes() / repeats
    comm.reset_counts()
    return PipelineRun(schedule=schedule, m=m, timelines=timelines, bytes_sent=sent, **first)


def pipelining_run(rank: int, world: int, cfg: dict) -> PipeliningRun:
    """Launch target: `repeats` steps of torch.distributed.pipelining's `schedule` (a class
    name) with `m` micro-batches, the net cut at `cuts` (one stage per rank; two, looped, for
    LOOPED_SCHEDULES). cfg as pipeline_run's; process ranks only (torch's schedules need a
    process group). Returns a results.PipeliningRun: what pipeline_run does, less bytes_sent,
    plus cuts and stages (this rank's)."""
    (device, schedule, m, cuts, n, net_cfg, seed, repeats, emulate, equal, rates,
     comm) = take(cfg, "device", "schedule", "m", "cuts", "batch_size", net={}, seed=0,
                  repeats=1, emulate=None, equal=False, rates=None, comm=None)
    if comm is not None:
        raise ValueError(f"{schedule} is one of torch's schedules, which need a process "
                         "group: launch on process ranks (threads=False), or leave this run "
                         "out on thread ranks")
    net, X, y = _net_and_batch(net_cfg, n, seed, device)
    validate_pipelining(schedule, n, m, world, len(net), cuts)
    model = _model(net, cuts, schedule, emulate, equal, rates)
    return pipelining_runs(net, cuts, rank, world, device, X, y, m, schedule, repeats,
                           _clock(emulate, device), model)


def pingpong_run(rank: int, world: int, cfg: dict) -> PingPong:
    """Launch target: a `shape` float32 message from rank 0 to rank 1 and back, `repeats`
    times after one warm-up round; returns seconds: half of each round trip (rank 0's), in a
    results.PingPong."""
    device, shape, repeats, comm = take(cfg, "device", "shape", repeats=1, comm=None)
    comm = comm or DistComm(device=device)     # given: thread ranks (threads=True)
    return PingPong(seconds=_pingpong(comm, rank, tuple(shape), repeats))
