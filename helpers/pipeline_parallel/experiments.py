"""Part VI's pipeline experiments across processes: the hand-built GPipe and 1F1B steps, torch's
pipelining schedules and a ping-pong between two ranks, run by `pipeline_worker` on every rank.
"""
import time

import torch

from ..runtime.comm import DistComm
from ..runtime.progress import report_progress
from .schedules import gpipe_rank_order, one_f_one_b_rank_order
from .scratch import pipeline_net, pipeline_rank_step, stage_of
from .torch_api import pipelining_available, pipelining_runs

__all__ = ["pipeline_worker"]


def _pingpong(comm, rank, shape, repeats):
    """Half the round trip of a `shape` float32 message from rank 0 to rank 1 and back, per
    repeat (seconds, measured on rank 0); other ranks take no part."""
    times = []
    t = torch.ones(shape, device=comm.device)
    for k in range(repeats + 1):               # the first round warms the connection up
        start = time.perf_counter()
        if rank == 0:
            comm.send(t, 1, tag=10_000 + k)
            comm.recv(1, shape, tag=20_000 + k)
        elif rank == 1:
            back = comm.recv(0, shape, tag=10_000 + k)
            comm.send(back, 0, tag=20_000 + k)
        comm.wait()
        if k:
            times.append((time.perf_counter() - start) / 2)
    comm.log = []
    return times


def pipeline_worker(rank, world, cfg):
    """spawn_ranks target, several runs in one launch. cfg: net (kwargs of pipeline_net),
    batch_size, seed, runs: list of dict(kind="scratch"|"pipelining", schedule ("gpipe",
    "1f1b" or a torch schedule class name), m, cuts, repeats), or dict(kind="pingpong", rows,
    repeats). Returns one dict per run: loss, grads (of the first repeat), timelines (one per
    repeat), peak_live, peak_bytes; for a ping-pong, seconds (one-way, per repeat)."""
    device = cfg["device"]
    net = pipeline_net(**cfg.get("net", {})).to(device)
    g = torch.Generator().manual_seed(cfg.get("seed", 0))
    n = cfg["batch_size"]
    X = torch.randint(0, net[0].num_embeddings, (n,), generator=g).to(device)
    y = torch.randint(0, net[-1].out_features, (n,), generator=g).to(device)
    width = net[0].embedding_dim
    comm = DistComm(device=device)
    orders = {"gpipe": gpipe_rank_order, "1f1b": one_f_one_b_rank_order}
    results = []
    for i, run in enumerate(cfg["runs"]):
        report_progress(i + 1, len(cfg["runs"]), "run")
        out = dict(run, timelines=[], skipped=None)
        if run.get("kind") == "pingpong":       # one-way time of a message between 0 and 1
            out["seconds"] = _pingpong(comm, rank, (run["rows"], width), run["repeats"])
            results.append(out)
            continue
        if run.get("kind", "scratch") == "pipelining":
            if not pipelining_available(run["schedule"]):
                out["skipped"] = f"torch {torch.__version__} has no {run['schedule']}"
                results.append(out)
                continue
            out.update(pipelining_runs(net, run["cuts"], rank, world, device, X, y,
                                        run["m"], run["schedule"], run.get("repeats", 1)))
            results.append(out)
            continue
        stage = stage_of(net, run["cuts"], rank)
        order = orders[run["schedule"]](run["m"], world, rank)
        for rep in range(run.get("repeats", 1)):
            stage.zero_grad()
            got = pipeline_rank_step(stage, comm, order, X if rank == 0 else None,
                                     y if rank == world - 1 else None, run["m"], n, (width,))
            out["timelines"].append(got["timeline"])
            if rep == 0:
                out.update(loss=got["loss"], peak_live=got["peak_live"],
                           peak_bytes=got["peak_bytes"],
                           grads={rank: [p.grad.detach().cpu().clone()
                                         for p in stage.parameters()]})
        out["bytes_sent"] = comm.bytes_sent() / max(1, run.get("repeats", 1))
        comm.log = []
        results.append(out)
    return results
