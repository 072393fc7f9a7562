"""Part VI: a pipeline across processes, from scratch and with torch.distributed.pipelining.

Each rank holds one stage (contiguous layers) of the same nn.Sequential. A training step cuts
the batch into micro-batches; activations go forward to the next rank and their gradients come
back, with send/recv (isend: sends never block). The order of the forward (F) and backward (B)
passes on each rank is the schedule: GPipe (all F, then all B) or 1F1B (a short warm-up of F,
then one F and one B in turn), same result, different memory.
"""
import copy
import inspect
import time

import torch
import torch.nn.functional as F
from torch import nn

from .costs import balanced_cuts
from .ranks import DistComm

__all__ = ["pipeline_net", "stage_of", "gpipe_rank_order", "one_f_one_b_rank_order",
           "pipeline_rank_step", "unsplit_step", "timeline_bubble", "busy_times", "layer_times",
           "cuts_by", "pipeline_worker", "pipelining_available", "sum_loss", "as_schedule",
           "LiveActivations"]


def pipeline_net(vocab=4096, width=128, depth=8, classes=10, seed=0):
    """A token classifier as an nn.Sequential: an embedding (many parameters, almost no
    compute), `depth` Linear+Tanh blocks (few parameters, all the compute), a linear head."""
    torch.manual_seed(seed)
    blocks = [nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth)]
    return nn.Sequential(nn.Embedding(vocab, width), *blocks, nn.Linear(width, classes))


def stage_of(net, cuts, rank):
    """Rank `rank`'s stage: an independent copy of the layers between its cuts."""
    bounds = [0, *cuts, len(net)]
    if not 0 <= rank < len(bounds) - 1:
        raise ValueError(f"{len(cuts)} cuts make {len(bounds) - 1} stages: no stage {rank}")
    return copy.deepcopy(net[bounds[rank]:bounds[rank + 1]])


def sum_loss(out, y):
    """Cross-entropy summed over the rows (divide by the batch size for the mean)."""
    return F.cross_entropy(out, y, reduction="sum")


def gpipe_rank_order(m, p, rank):
    """GPipe: every forward, then every backward: m micro-batches live at the peak."""
    return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]


def one_f_one_b_rank_order(m, p, rank):
    """1F1B: p - rank - 1 forwards to fill the pipe, then one forward and one backward in turn,
    then the remaining backwards. At most p - rank micro-batches are live on this rank."""
    warm = min(p - rank - 1, m)
    order = [("F", j) for j in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", j) for j in range(m - warm, m)]


class LiveActivations:
    """What autograd keeps alive on one rank, measured: every tensor saved for backward
    (torch.autograd.graph.saved_tensors_hooks) is wrapped in a holder that reports when autograd
    frees it (after that micro-batch's backward, or when its graph is dropped). A micro-batch
    is live while any of its saved tensors is; parameters are not counted as activations."""

    def __init__(self):
        self.live, self.bytes, self.peak_live, self.peak_bytes = 0, 0, 0, 0

    def micro_batch(self, params):
        """Context manager: everything saved inside belongs to one new micro-batch."""
        return _MicroBatch(self, params)

    def _grow(self, n_live, n_bytes):
        self.live += n_live
        self.bytes += n_bytes
        self.peak_live = max(self.peak_live, self.live)
        self.peak_bytes = max(self.peak_bytes, self.bytes)


class _Held:
    __slots__ = ("t", "mb", "nbytes")

    def __init__(self, t, mb, nbytes):
        self.t, self.mb, self.nbytes = t, mb, nbytes

    def __del__(self):
        self.mb.release(self.nbytes)


class _MicroBatch:
    def __init__(self, tracker, params):
        self.tracker, self.held, self.seen = tracker, 0, set()
        self.skip = {p.untyped_storage().data_ptr() for p in params}
        self.bytes = 0

    def pack(self, t):
        ptr = t.untyped_storage().data_ptr()
        nbytes = 0
        if ptr not in self.skip and ptr not in self.seen and not t.is_meta:
            self.seen.add(ptr)
            nbytes = t.untyped_storage().nbytes()
        if self.held == 0:
            self.tracker._grow(1, 0)           # the micro-batch becomes live
        self.held += 1
        self.bytes += nbytes
        self.tracker._grow(0, nbytes)
        return _Held(t, self, nbytes)

    def release(self, nbytes):
        self.held -= 1
        self.tracker._grow(-1 if self.held == 0 else 0, -nbytes)

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda h: h.t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)


def _sync(t):
    """On a GPU, wait for the queued work before reading the clock (else the boxes are short)."""
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


def pipeline_rank_step(stage, comm, order, X, y, num_microbatches, batch_size, in_shape,
                       loss_fn=sum_loss):
    """One training step of this rank's stage, in the given order of ("F"|"B", micro-batch).

    Rank 0 cuts X into micro-batches; the others receive their input from rank - 1 (shape
    (rows, *in_shape)); the last rank computes loss_fn(out, y_j) / batch_size, so the stages'
    .grad add up to the gradient of the mean loss, as one unsplit step. Returns dict(loss (last
    rank, else None), timeline: dicts stage/micro/phase/start/end (time.perf_counter seconds),
    peak_live: most micro-batches whose saved activations autograd held at once, peak_bytes:
    most bytes of them (LiveActivations)).
    """
    r, p, m = comm.rank, comm.world, num_microbatches
    first, last = r == 0, r == p - 1
    rows = [len(c) for c in torch.arange(batch_size).tensor_split(m)]
    Xs = X.tensor_split(m) if first else None
    ys = y.tensor_split(m) if last else None
    params = list(stage.parameters())
    acts = LiveActivations()
    held, total, timeline = {}, 0.0, []
    for phase, j in order:
        if phase == "F":
            if first:
                h = Xs[j]
            else:
                h = comm.recv(r - 1, (rows[j], *in_shape), tag=j).requires_grad_()
            start = time.perf_counter()
            with acts.micro_batch(params):
                out = stage(h)
                if last:
                    out = loss_fn(out, ys[j]) / batch_size
            _sync(out)
            timeline.append(dict(stage=r, micro=j, phase="F", start=start,
                                 end=time.perf_counter()))
            if last:
                total += float(out.detach())
            else:
                comm.send(out, r + 1, tag=j)
            held[j] = (h, out)
        else:
            h, out = held.pop(j)
            grad = None if last else comm.recv(r + 1, out.shape, tag=j)
            start = time.perf_counter()
            out.backward(grad)
            _sync(out)
            timeline.append(dict(stage=r, micro=j, phase="B", start=start,
                                 end=time.perf_counter()))
            if not first:
                comm.send(h.grad, r - 1, tag=j)
            del h, out                    # autograd has freed what it saved for j
    comm.wait()
    if held:
        raise RuntimeError(f"rank {r}: micro-batches {sorted(held)} never ran backward")
    return dict(loss=total if last else None, timeline=timeline, peak_live=acts.peak_live,
                peak_bytes=acts.peak_bytes)


def unsplit_step(net, X, y, loss_fn=sum_loss):
    """The reference: one forward and backward of the whole net on the whole batch. Returns
    (mean loss, list of gradients in net.parameters() order)."""
    net.zero_grad()
    loss = loss_fn(net(X), y) / X.shape[0]
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in net.parameters()]


def busy_times(timelines):
    """Seconds each rank spent computing (its F and B boxes), from the per-rank timelines."""
    return [sum(e["end"] - e["start"] for e in tl) for tl in timelines]


def timeline_bubble(timelines):
    """Idle share of the step: 1 - busy time / (ranks x span from the first start to the last
    end). All ranks read time.perf_counter, one clock for every process on a machine."""
    events = [e for tl in timelines for e in tl]
    span = max(e["end"] for e in events) - min(e["start"] for e in events)
    return 1 - sum(busy_times(timelines)) / (len(timelines) * span)


def as_schedule(timelines):
    """The per-rank timelines as one list for helpers.plot_schedule(clock="time"): seconds since
    the first box started on any rank."""
    t0 = min(e["start"] for tl in timelines for e in tl)
    return [dict(e, start=e["start"] - t0, end=e["end"] - t0, tick=0)
            for tl in timelines for e in tl]


def layer_times(net, X, y, repeats=5, loss_fn=sum_loss):
    """Median seconds of forward + backward of each top-level layer of `net` on batch X, one
    thread (as each rank runs). The last layer's backward includes the loss."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        inputs, h = [], X
        with torch.no_grad():
            for layer in net:
                inputs.append(h)
                h = layer(h)
        times = []
        for i, layer in enumerate(net):
            runs = []
            for _ in range(repeats):
                x = inputs[i].clone().requires_grad_(inputs[i].is_floating_point())
                start = time.perf_counter()
                out = layer(x)
                out = loss_fn(out, y) if i == len(net) - 1 else out.sum()
                out.backward()
                runs.append(time.perf_counter() - start)
            times.append(sorted(runs)[len(runs) // 2])
        return times
    finally:
        torch.set_num_threads(threads)


def cuts_by(weights, p):
    """Cuts that balance `weights` (per-layer parameter counts, or measured seconds) over p
    stages: the largest stage as small as possible (helpers.balanced_cuts)."""
    return balanced_cuts(list(weights), p)


# --- torch.distributed.pipelining ------------------------------------------------------------
def pipelining_available(name):
    """True when torch.distributed.pipelining has the schedule class `name` on this torch."""
    try:
        import torch.distributed.pipelining as pp
    except ImportError:
        return False
    return hasattr(pp, name)


class _Mark(torch.autograd.Function):
    """Identity whose backward calls `note()`: marks when a gradient passes a point."""

    @staticmethod
    def forward(ctx, x, note):
        ctx.note = note
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.note()
        return g, None


class _Timed(nn.Module):
    """A stage that records its F and B boxes (backward: from the gradient reaching the output
    to the gradient leaving the first float tensor of the stage) and the activations autograd
    saves for each micro-batch until its backward. `memory` is shared by a rank's stages."""

    def __init__(self, stage, rank, timeline, memory):
        super().__init__()
        self.stage, self.rank, self.timeline, self.memory = stage, rank, timeline, memory
        self.f = self.b = 0

    def _b_start(self):
        self._b0 = time.perf_counter()

    def _b_end(self):
        self.timeline.append(dict(stage=self.rank, micro=self.b, phase="B", start=self._b0,
                                  end=time.perf_counter()))
        self.b += 1

    def forward(self, x):
        if x.is_meta or not torch.is_grad_enabled():   # PipelineStage's shape inference
            return self.stage(x)
        start = time.perf_counter()
        layers = list(self.stage)
        with self.memory.micro_batch(self.stage.parameters()):
            if not x.is_floating_point():      # token ids: mark after the embedding
                x, layers = layers[0](x), layers[1:]
            x = _Mark.apply(x, self._b_end)
            for layer in layers:
                x = layer(x)
            x = _Mark.apply(x, self._b_start)
        self.timeline.append(dict(stage=self.rank, micro=self.f, phase="F", start=start,
                                  end=time.perf_counter()))
        self.f += 1
        return x


def _schedule_kwargs(cls, n_microbatches, loss_fn):
    kw = dict(n_microbatches=n_microbatches, loss_fn=loss_fn)
    if "scale_grads" in inspect.signature(cls.__init__).parameters:
        kw["scale_grads"] = False          # our loss is already divided by the batch size
    return kw


def _pipelining_runs(net, cuts, rank, world, device, X, y, m, schedule, repeats):
    """`repeats` steps of torch.distributed.pipelining's `schedule` (a class name) on stages
    built once. Returns the first step's loss and this rank's gradients, every step's
    timeline, and the activations autograd held at the peak of the last step (the first step
    also runs each stage once to infer shapes)."""
    import torch.distributed.pipelining as pp
    n = X.shape[0]
    loss_fn = lambda out, t: sum_loss(out, t) / n                           # noqa: E731
    timeline, memory = [], LiveActivations()
    interleaved = schedule in ("ScheduleInterleaved1F1B", "ScheduleLoopedBFS")
    per_rank = 2 if interleaved else 1
    num_stages = world * per_rank
    ids = [rank + k * world for k in range(per_rank)]      # looped placement: r, r + world
    bounds_cuts = cuts if len(cuts) == num_stages - 1 else cuts_by(
        [1] * len(net), num_stages)
    mods = [_Timed(stage_of(net, bounds_cuts, i).to(device), rank, timeline, memory)
            for i in ids]
    stages = [pp.PipelineStage(mod, i, num_stages, device) for mod, i in zip(mods, ids)]
    cls = getattr(pp, schedule)
    sched = cls(stages if interleaved else stages[0], **_schedule_kwargs(cls, m, loss_fn))
    last_rank = (num_stages - 1) % world
    out = dict(timelines=[], cuts=bounds_cuts)
    for rep in range(repeats):
        for mod in mods:
            mod.zero_grad()
            mod.f = mod.b = 0
        timeline.clear()
        memory.__init__()
        losses = []
        kwargs = dict(target=y.to(device), losses=losses) if rank == last_rank else {}
        sched.step(*([X.to(device)] if rank == 0 else []), **kwargs)
        out["timelines"].append(list(timeline))
        if rep == 0:
            out["grads"] = {i: [p.grad.detach().cpu().clone() for p in mod.stage.parameters()]
                            for i, mod in zip(ids, mods)}
            out["loss"] = (float(sum(float(v.detach()) for v in losses))
                           if rank == last_rank else None)
    out.update(peak_live=memory.peak_live, peak_bytes=memory.peak_bytes)
    return out


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
    for run in cfg["runs"]:
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
            out.update(_pipelining_runs(net, run["cuts"], rank, world, device, X, y,
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
