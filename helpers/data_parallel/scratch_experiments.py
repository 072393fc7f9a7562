"""Part III: DDPFromScratch on real ranks, each experiment a launch target fn(rank, world, cfg)
returning numbers: against one process on the combined batch and against torch's DDP (bucket
sizes, tied and frozen weights, parameters some ranks skip, accumulation), and what it refuses.
(When its all-reduces launch and complete: overlap_experiments.py.)
"""
import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ..compare import max_diff
from ..models import unwrap
from ..one_process import (
    flat_cross_entropy,
    local_batch,
    make_optimizer,
    params_of,
    train_one_process,
)
from ..runtime.launch import take
from ..runtime.traffic import count_traffic
from ..timing import turn_order
from ..tiny_models import make_batches, make_model
from .overlap_experiments import timed_step, timeline_model
from .results import (
    DdpCase,
    ExposedMode,
    ExposedRun,
    NoSyncCase,
    Refusal,
    ScratchRefusals,
    UnusedCase,
)
from .scratch import DDPFromScratch

__all__ = ["ddp_vs_one_process", "Branchy", "unused_vs_torch", "accumulation_vs_torch",
           "scratch_refusals", "scratch_skipped_step", "exposed_comm_times"]


def ddp_vs_one_process(rank, world, cfg):
    """DDPFromScratch and torch's DDP against one process, for each (model kind, bucket_mb): a
    list of results.DdpCase."""
    device, cases, num_steps, batch_size = take(cfg, "device", "cases", num_steps=3, batch_size=8)
    out = []
    for kind, bucket_mb in cases:
        batches = make_batches(kind, num_steps, batch_size)
        ref = train_one_process(kind, batches, device, num_steps, optim="sgd")
        diffs, counts = {}, {}
        for impl in ("scratch", "torch"):
            # different init per rank: broadcast fixes it
            net = make_model(kind, seed=rank).to(device)
            if impl == "scratch":
                model = DDPFromScratch(net, bucket_mb=bucket_mb)
            else:
                model = nn.parallel.DistributedDataParallel(
                    net, bucket_cap_mb=bucket_mb if bucket_mb is not None else 25)
            opt = make_optimizer(unwrap(model), "sgd")
            for batch in batches:
                X, y = local_batch(batch, rank, world, device)
                with count_traffic() as log:
                    flat_cross_entropy(model(X), y).backward()
                    if impl == "scratch":
                        model.finish_gradient_synchronization()
                opt.step()
                opt.zero_grad()
            diffs[impl] = max_diff(params_of(unwrap(model)), ref)
            if impl == "scratch":
                counts = dict(calls=log.calls("all_reduce"),   # all-reduces in the last step
                              num_buckets=len(model.buckets),
                              sizes=[len(b) for b in model.buckets])
        out.append(DdpCase(kind=kind, bucket_mb=bucket_mb, **diffs, **counts,
                           num_trainable=sum(1 for p in net.parameters() if p.requires_grad)))
    return out


class Branchy(nn.Module):
    """A model whose forward skips parameters depending on the data a rank holds: layer `b` only
    when `use_b`, the auxiliary head only when `aux`, and `never` in no forward at all."""

    def __init__(self, d_in=6, hidden=8, num_out=4):
        super().__init__()
        self.a, self.b = nn.Linear(d_in, hidden), nn.Linear(hidden, hidden)
        self.never = nn.Linear(hidden, hidden)
        self.c, self.aux = nn.Linear(hidden, num_out), nn.Linear(hidden, 1)

    def forward(self, X, use_b=True, aux=False):
        h = torch.tanh(self.a(X))
        if use_b:
            h = torch.tanh(self.b(h))
        out = self.c(h).pow(2).mean()
        return out + self.aux(h).pow(2).mean() if aux else out


def _branchy_batches(num_steps, world, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(4 + r, 6, generator=g) for r in range(world)] for _ in range(num_steps)]


def _branches(r, world):
    """Rank r's forward: b on even ranks, the auxiliary head on the last rank only."""
    return dict(use_b=r % 2 == 0, aux=r == world - 1)


def unused_vs_torch(rank, world, cfg):
    """Parameters used by some ranks only (and one by none): DDPFromScratch (buckets of each
    size in cfg) against torch's DDP with find_unused_parameters=True and against one process
    whose loss is the mean of the ranks' losses. Returns per (optimizer, bucket_mb) a
    results.UnusedCase: the largest parameter difference, whether the never-used layer's .grad
    stayed None."""
    device, bucket_sizes, num_steps = take(cfg, "device", bucket_sizes=(None, 1e-4, 25),
                                           num_steps=3)
    batches = _branchy_batches(num_steps, world)
    out = []
    for optim in ("sgd", "adamw_groups"):
        torch.manual_seed(0)
        ref = Branchy().to(device)
        opt = make_optimizer(ref, optim)
        for step in batches:
            sum(ref(X.to(device), **_branches(r, world)) for r, X in enumerate(step)).div(
                world).backward()
            opt.step()
            opt.zero_grad()
        ref = params_of(ref)
        for bucket_mb in (*bucket_sizes, "torch"):
            torch.manual_seed(rank)          # a different init per rank: the broadcast fixes it
            net = Branchy().to(device)
            model = DDP(net, find_unused_parameters=True) if bucket_mb == "torch" else \
                DDPFromScratch(net, bucket_mb=bucket_mb)
            opt = make_optimizer(net, optim)
            for step in batches:
                model(step[rank].to(device), **_branches(rank, world)).backward()
                if bucket_mb != "torch":
                    model.finish_gradient_synchronization()
                never_none = net.never.weight.grad is None
                opt.step()
                opt.zero_grad()
            out.append(UnusedCase(optim=optim, bucket_mb=bucket_mb, never_none=never_none,
                                  diff=max_diff(params_of(net), ref), state=params_of(net)))
    return out


def accumulation_vs_torch(rank, world, cfg):
    """Gradient accumulation over k micro-batches: DDPFromScratch with all but the last inside
    no_sync() ("last"), or all inside and finish averaging the sum ("all"), against torch's DDP
    with no_sync and against one process on the whole batch (AdamW with weight decay groups).
    Returns per (k, how) a results.NoSyncCase: the largest difference and the all-reduces of
    the last step."""
    device, ks, num_steps, bucket_mb = take(cfg, "device", ks=(1, 2, 3), num_steps=2,
                                            bucket_mb=0.004)
    out = []
    for k in ks:
        batches = make_batches("mlp", num_steps, 6 * world * k)
        ref = train_one_process("mlp", batches, device, num_steps, optim="adamw")
        for how in ("last", "all", "torch"):
            net = make_model("mlp", seed=rank).to(device)
            model = DDP(net, bucket_cap_mb=bucket_mb) if how == "torch" else \
                DDPFromScratch(net, bucket_mb=bucket_mb)
            opt = make_optimizer(net, "adamw")
            for batch in batches:
                X, y = local_batch(batch, rank, world, device)
                with count_traffic() as log:
                    micro = zip(X.tensor_split(k), y.tensor_split(k), strict=True)
                    for i, (Xm, ym) in enumerate(micro):
                        sync = how != "all" and i == k - 1
                        with contextlib.nullcontext() if sync else model.no_sync():
                            (flat_cross_entropy(model(Xm), ym) / k).backward()
                    if how != "torch":
                        model.finish_gradient_synchronization()
                opt.step()
                opt.zero_grad()
            out.append(NoSyncCase(k=k, how=how, diff=max_diff(params_of(net), ref),
                                  calls=log.calls("all_reduce"),
                                  num_buckets=None if how == "torch" else len(model.buckets)))
    return out


def _raises(fn, *words):
    """The error fn() raises, a results.Refusal (None if it raises none), its message checked
    for `words`."""
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        msg = str(e)
        return Refusal(kind=type(e).__name__, has_words=all(w in msg for w in words), message=msg)
    return None


def scratch_refusals(rank, world, cfg):
    """What DDPFromScratch refuses, on every rank alike, before a wrong number: two backwards
    before finish, a forward or an optimizer step before finish, models that differ between
    ranks; and what is harmless: finish twice, finish on one rank only (no communication).
    Returns a results.ScratchRefusals."""
    (device,) = take(cfg, "device")
    X, y = torch.randn(8, 32).to(device), torch.randint(10, (8,)).to(device)

    def fresh():
        model = DDPFromScratch(make_model("mlp", seed=0).to(device))
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def two_backwards():          # accumulation without no_sync
        model, _ = fresh()
        losses = [flat_cross_entropy(model(Xm), ym)
                  for Xm, ym in zip(X.split(4), y.split(4), strict=True)]
        for loss in losses:
            loss.backward()

    def forward_before_finish():
        model, _ = fresh()
        for _ in range(2):
            flat_cross_entropy(model(X), y).backward()

    def step_early():
        model, opt = fresh()
        flat_cross_entropy(model(X), y).backward()
        opt.step()

    def other_model():
        DDPFromScratch(make_model("mlp", width=64 + 8 * rank).to(device))

    def mixed_dtypes():
        DDPFromScratch(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2).double()).to(device),
                       bucket_mb=25)

    def trainable_later():
        net = make_model("frozen").to(device)
        model = DDPFromScratch(net)
        net[0].requires_grad_(True)
        flat_cross_entropy(model(X), y).backward()
        model.finish_gradient_synchronization()

    refused = dict(two_backwards=_raises(two_backwards, "second backward", "no_sync"),
                   forward_before_finish=_raises(forward_before_finish, "forward before",
                                                 "no_sync"),
                   step_early=_raises(step_early, "finish_gradient_synchronization"),
                   other_model=_raises(other_model, "rank 1: a DDPFromScratch", "fingerprint",
                                       "same model"),
                   mixed_dtypes=_raises(mixed_dtypes, "mixes", "bucket_mb=None"),
                   trainable_later=_raises(trainable_later, "0.weight", "before wrapping"))
    dist.barrier()
    model, opt = fresh()
    flat_cross_entropy(model(X), y).backward()
    model.finish_gradient_synchronization()
    with count_traffic() as log:
        model.finish_gradient_synchronization()          # again: nothing to do
        if rank == 0:
            model.finish_gradient_synchronization()      # on one rank only: nothing either
    return ScratchRefusals(refused=refused, extra_finish_calls=log.calls())


def scratch_skipped_step(rank, world, cfg):
    """Rank 1 skips a step that rank 0 takes: rank 0's finish waits for an all-reduce nobody
    joins, and after the group's `timeout` (seconds) raises an error naming the likely causes
    instead of gloo's bare timeout. Returns that message on rank 0, None on the others."""
    import datetime
    device, timeout = take(cfg, "device", timeout=3)
    group = dist.new_group(timeout=datetime.timedelta(seconds=timeout))
    model = DDPFromScratch(make_model("mlp", seed=0).to(device), group=group)
    message = None
    if rank == 0:
        X, y = torch.randn(4, 32).to(device), torch.randint(10, (4,)).to(device)
        flat_cross_entropy(model(X), y).backward()
        try:
            model.finish_gradient_synchronization()
        except RuntimeError as e:
            message = str(e)
    dist.barrier()
    return message


def split_step(timeline, t0, t2):
    """One step's timeline (DDPFromScratch.timeline, from `t0`, the start of backward, to `t2`,
    the end of finish) split so that the buckets' launches fall on the same side in both modes:
    "launches", the seconds spent launching buckets (copying the gradients into a buffer and
    queueing its all-reduce), wherever they ran (in the hooks with overlap, in finish without);
    "compute", backward up to the last gradient's hook plus every launch made after it;
    "exposed", the rest of finish (the all-reduces waited for, and the averages copied back
    into .grad); "pending", the all-reduces not completed when the last gradient was ready."""
    last_grad = max(t for t, what, _ in timeline if what == "grad")
    start = {i: t for t, what, i in timeline if what == "launch"}
    launches = [(start[i], t) for t, what, i in timeline if what == "queued"]
    late = sum(b - a for a, b in launches if a >= last_grad)   # made after the last gradient
    done = sum(1 for t, what, _ in timeline if what == "done" and t <= last_grad)
    return {"compute": last_grad - t0 + late, "exposed": t2 - last_grad - late,
            "launches": sum(b - a for a, b in launches), "pending": len(start) - done}


def exposed_comm_times(rank, world, cfg):
    """The communication a step waits for, measured on the real ranks: per round, for the
    all-reduces launched from the hooks ("overlap") and all in finish ("after"), timed in turns
    (the order reversed every other round, the ranks meeting in a barrier before each step) and
    split by split_step: "compute" (backward and every bucket's launch), "exposed" (the rest of
    finish), "launches" and "pending". Returns a results.ExposedRun: per mode, one sample per
    round of each, and the number of buckets."""
    device, bucket_mb, sizes, rounds, warmup, batch_size = take(
        cfg, "device", bucket_mb=None, sizes=None, rounds=7, warmup=2, batch_size=32)
    modes = ("overlap", "after")
    models = {k: timeline_model(device, sizes, bucket_mb, overlap=k == "overlap")[0]
              for k in modes}
    X, y = local_batch(timeline_model(device, sizes, bucket_mb)[1], rank, world, device)
    X, y = X[:batch_size], y[:batch_size]
    out = {k: {"exposed": [], "compute": [], "launches": [], "pending": []} for k in modes}
    for r in range(warmup + rounds):
        for k in turn_order(modes, r):
            dist.barrier()
            t0, _, t2 = timed_step(models[k], X, y)
            if r >= warmup:
                for key, value in split_step(models[k].timeline, t0, t2).items():
                    out[k][key].append(value)
    return ExposedRun(**{k: ExposedMode(**v) for k, v in out.items()},
                      num_buckets=len(models["overlap"].buckets))
