"""Part VI: a pipeline across processes, built by hand over a comm (runtime.comm).

Each rank holds one stage (contiguous layers) of the same nn.Sequential. A training step cuts
the batch into micro-batches; activations go forward to the next rank and their gradients come
back, with send/recv (isend: sends never block). The order of the forward (F) and backward (B)
passes on each rank is the schedule (pipeline_parallel.schedules): GPipe (all F, then all B) or
1F1B (a short warm-up of F, then one F and one B in turn), same result, different memory.
"""
import copy
import time

import torch
import torch.nn.functional as F
from torch import nn

from ..costs import balanced_cuts

__all__ = ["pipeline_net", "stage_of", "pipeline_rank_step", "unsplit_step", "layer_times",
           "cuts_by", "sum_loss", "LiveActivations"]


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


