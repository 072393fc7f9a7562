"""Part VI: a pipeline across processes, built by hand over a comm (runtime.comm).

Each rank holds one stage (contiguous layers) of the same nn.Sequential. A training step cuts
the batch into micro-batches; activations go forward to the next rank and their gradients come
back: each box's send is posted together with the next box's receive (comm.sendrecv, as
torch's schedules batch them), so neighbours sending to each other never wait on each other's
sends, whatever the size of the messages (NCCL). The order of the forward (F) and backward (B)
passes on each rank is the schedule (pipeline_parallel.schedules): GPipe (all F, then all B) or
1F1B (a short warm-up of F, then one F and one B in turn), same result, different memory.
"""
import copy
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from ..seeding import seeded
from ..validate import validate_positive_int

__all__ = ["pipeline_net", "validate_cuts", "stage_of", "validate_pipeline_step",
           "pipeline_rank_step", "unsplit_step", "layer_times", "sum_loss",
           "LiveActivations", "LinearTape"]


def pipeline_net(vocab=4096, width=128, depth=8, classes=10, seed=0):
    """A token classifier as an nn.Sequential: an embedding (many parameters, almost no
    compute), `depth` Linear+Tanh blocks (few parameters, all the compute), a linear head."""
    with seeded(seed):
        blocks = [nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth)]
        return nn.Sequential(nn.Embedding(vocab, width), *blocks, nn.Linear(width, classes))


def validate_cuts(cuts, num_layers, stages=None):
    """The cuts as a list of ints, or ValueError naming the fix: strictly increasing, within
    1..num_layers-1 (no stage is empty), and `stages` - 1 of them when the count is known."""
    try:
        cuts = [int(c) for c in cuts]
    except (TypeError, ValueError):
        raise ValueError(f"cuts must be a list of layer indices, got {cuts!r}") from None
    bounds = [0, *cuts, num_layers]
    if any(a >= b for a, b in pairwise(bounds)):
        raise ValueError(f"cuts {cuts} of a {num_layers}-layer net leave a stage empty or repeat "
                         f"layers: give strictly increasing indices within 1..{num_layers - 1}")
    if stages is not None and len(cuts) + 1 != stages:
        raise ValueError(f"{len(cuts)} cuts make {len(cuts) + 1} stages for {stages} ranks: give "
                         f"{stages - 1} cuts (e.g. helpers.balanced_cuts(times, {stages}))")
    return cuts


def stage_of(net, cuts, rank, stages=None):
    """Rank `rank`'s stage: an independent copy of the layers between its cuts. `stages` (the
    number of ranks in the pipeline) is checked against the cuts: pass it."""
    cuts = validate_cuts(cuts, len(net), stages)
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
    """On a GPU, wait for the current stream's queued work (the box's kernels, or a receive's
    arrival) before reading the clock: else a box ends before its math and starts before its
    input. Communication streams are not waited for (a send in flight holds nothing up)."""
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()


def validate_pipeline_step(order, X, y, num_microbatches, batch_size, first, last, stage=None):
    """An error naming the fix, before any work, for what pipeline_rank_step cannot run: m and
    the batch size not positive ints (validate_positive_int); X (first rank) and y (last rank)
    without batch_size rows; an empty stage; an order that does not run F, then B (then W, if
    any) once per micro-batch."""
    validate_positive_int(num_microbatches, "num_microbatches")
    validate_positive_int(batch_size, "batch_size")
    for name, t, here in (("X", X, first), ("y", y, last)):
        if here and (t is None or t.shape[0] != batch_size):
            raise ValueError(f"{name} has {None if t is None else t.shape[0]} rows but "
                             f"batch_size is {batch_size}: pass batch_size={name}.shape[0]")
    if stage is not None and isinstance(stage, nn.Sequential) and len(stage) == 0:
        raise ValueError("this rank's stage has no layers: cut so every stage gets one")
    phases = sorted({ph for ph, _ in order})
    want = sorted((ph, j) for ph in phases for j in range(num_microbatches))
    if phases not in (["B", "F"], ["B", "F", "W"]) or sorted(map(tuple, order)) != want:
        raise ValueError(f"the order must run F and B (and W, if any) once for each of the "
                         f"{num_microbatches} micro-batches, got {list(order)}: build it with "
                         "helpers.one_f_one_b_rank_order(p, m, rank) for the same m")
    pos = {tuple(op): i for i, op in enumerate(order)}
    for j in range(num_microbatches):
        chain = [pos[(ph, j)] for ph in ("F", "B", "W") if (ph, j) in pos]
        if chain != sorted(chain):
            raise ValueError(f"micro-batch {j} runs {[ph for ph in 'FBW' if (ph, j) in pos]} "
                             "out of order: F before B before W")


class LinearTape:
    """The zero-bubble split by hand: in forward, every nn.Linear of the stage records its input;
    B asks autograd for the input's gradient and every Linear output's gradient only, and W turns
    those into the weight gradients, dW = dy^T x and db = sum(dy), later, with no graph."""

    def __init__(self, stage):
        self.linears = [mod for mod in stage.modules() if isinstance(mod, nn.Linear)]
        own = {id(p) for mod in self.linears for p in mod.parameters()}
        self.others = [p for p in stage.parameters() if id(p) not in own and p.requires_grad]
        self.taped, self.pending = {}, {}

    def forward(self, stage, h, j):
        seen = []
        hooks = [mod.register_forward_hook(lambda mod, a, out: seen.append((mod, a[0], out)))
                 for mod in self.linears]
        try:
            out = stage(h)
        finally:
            for hook in hooks:
                hook.remove()
        self.taped[j] = seen
        return out

    def backward_input(self, out, grad, h, j):
        """B: the gradients of h and of every Linear's output (and of the other parameters)."""
        seen = self.taped.pop(j)
        wrt = ([h] if h.requires_grad else []) + [o for _, _, o in seen] + self.others
        got = torch.autograd.grad(out, wrt, grad, allow_unused=True)
        if h.requires_grad:
            h.grad, got = got[0], got[1:]
        dys, rest = got[:len(seen)], got[len(seen):]
        for p, g in zip(self.others, rest, strict=True):
            if g is None:
                continue
            p.grad = g if p.grad is None else p.grad + g
        self.pending[j] = [(mod, x.detach(), dy) for (mod, x, _), dy in zip(seen, dys, strict=True)]

    def backward_weight(self, j):
        """W: the Linear weights' gradients from what B left (inputs and output gradients)."""
        for mod, x, dy in self.pending.pop(j):
            if dy is None:                     # a Linear whose output the loss never used
                continue
            x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
            for p, g in ((mod.weight, dy2.T @ x2), (mod.bias, dy2.sum(0))):
                if p is not None and p.requires_grad:
                    p.grad = g if p.grad is None else p.grad + g


def pipeline_rank_step(stage, comm, order, X, y, num_microbatches, batch_size, in_shape,
                       loss_fn=sum_loss, clock=None, box_seconds=None):
    """One training step of this rank's stage, in the given order of ("F"|"B"|"W", micro-batch).

    Rank 0 cuts X into micro-batches; the others receive their input from rank - 1 (shape
    (rows, *in_shape)); the last rank computes loss_fn(out, y_j) / batch_size, so the stages'
    .grad add up to the gradient of the mean loss, as one unsplit step. An order with W boxes
    splits backward (zero bubble): B computes the input gradient, W the weight gradients.
    clock: a helpers.Clock (emulate=True waits out box_seconds(phase, j, rows) after the math).
    Returns dict(loss (last rank, else None), timeline: the Clock's boxes, dicts stage/micro/
    phase/start/end/sent/rows/modelled (host seconds on the rank clock; sent: when the box's output
    was handed to the next rank),
    peak_live: most micro-batches whose saved activations autograd held at once, peak_bytes:
    most bytes of them (LiveActivations)).
    """
    from ..runtime.emulate import Clock
    r, p, m = comm.rank, comm.world, num_microbatches
    first, last = r == 0, r == p - 1
    validate_pipeline_step(order, X, y, m, batch_size, first, last, stage)
    clock = clock or Clock(device=getattr(comm, "device", None))   # waits for its stream on a GPU
    rows = [len(c) for c in torch.arange(batch_size).tensor_split(m)]
    Xs = X.tensor_split(m) if first else None
    ys = y.tensor_split(m) if last else None
    tape = LinearTape(stage) if any(ph == "W" for ph, _ in order) else None
    acts = LiveActivations()
    held, total, n0 = {}, 0.0, len(clock.boxes)
    info = lambda j: dict(stage=r, virtual=r, micro=j, rows=rows[j])
    seconds = (lambda ph, j: box_seconds(ph, j, rows[j])) if box_seconds else (lambda ph, j: None)
    outgoing = None     # the last box's output, sent with the next box's receive (sendrecv)

    def exchange(src=None, shape=None):
        """Post the outgoing send and this box's receive together; the received tensor, its
        arrival on the host clock (on a GPU the receive only makes the stream wait)."""
        nonlocal outgoing
        send = outgoing[:2] if outgoing else None
        got = comm.sendrecv(send, (src, shape) if src is not None else None)
        if outgoing:
            outgoing[2]["sent"] = clock.now()
        outgoing = None
        if got is not None:
            _sync(got)
        return got
    for phase, j in order:
        if phase == "F":
            h = exchange(*((None,) if first else (r - 1, (rows[j], *in_shape))))
            h = Xs[j] if first else h.requires_grad_()
            with clock.box("F", seconds("F", j), phase="F", **info(j)) as box:
                with acts.micro_batch(stage.parameters()):
                    out = tape.forward(stage, h, j) if tape else stage(h)
                    if last:
                        out = loss_fn(out, ys[j]) / batch_size
                _sync(out)
            if last:
                total += float(out.detach())
            else:
                outgoing = (out, r + 1, box)
            held[j] = (h, out)
        elif phase == "B":
            h, out = held.pop(j)
            grad = exchange(*((None,) if last else (r + 1, out.shape)))
            with clock.box("B", seconds("B", j), phase="B", **info(j)) as box:
                if tape:
                    tape.backward_input(out, grad, h, j)
                else:
                    out.backward(grad)
                _sync(out)
            if not first:
                outgoing = (h.grad, r - 1, box)
            del h, out                    # autograd has freed what it saved for j
        else:
            exchange()
            with clock.box("W", seconds("W", j), phase="W", **info(j)):
                tape.backward_weight(j)
    exchange()
    comm.wait()
    if held:
        raise RuntimeError(f"rank {r}: micro-batches {sorted(held)} never ran backward")
    timeline = [dict(b) for b in clock.boxes[n0:]]
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
    thread (as each rank runs), on the rank clock (a GPU's work finished, not only queued).
    The last layer's backward includes the loss."""
    from ..devices import synced_now
    device = X.device
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
                start = synced_now(device)
                out = layer(x)
                out = loss_fn(out, y) if i == len(net) - 1 else out.sum()
                out.backward()
                runs.append(synced_now(device) - start)
            times.append(sorted(runs)[len(runs) // 2])
        return times
    finally:
        torch.set_num_threads(threads)
