"""Part VI: the same pipeline with torch.distributed.pipelining: a PipelineStage per stage, a
schedule object, step() on every rank. Each box (forward_one_chunk, backward_one_chunk,
backward_weight_one_chunk) is timed, or emulated, by a helpers.Clock, and the activations autograd
saves are measured as in the hand-built pipeline.

torch's schedules cut the batch with torch.tensor_split into equal micro-batches and infer
static shapes from the first: a batch that m does not divide fails on the last rank while the
others block until the timeout. `validate_pipelining` refuses it (and the rest) before any work.
"""
import inspect

import torch

from ..validate import validate_positive_int
from .results import PipeliningRun
from .scratch import LiveActivations, stage_of, sum_loss, validate_cuts

__all__ = ["pipelining_available", "validate_pipelining", "make_schedule", "pipelining_step",
           "pipelining_runs", "LOOPED_SCHEDULES"]

LOOPED_SCHEDULES = ("ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
                    "ScheduleInterleavedZeroBubble")


def pipelining_available(name):
    """True when torch.distributed.pipelining has the schedule class `name` on this torch."""
    try:
        import torch.distributed.pipelining as pp
    except ImportError:
        return False
    return hasattr(pp, name)


def validate_pipelining(schedule, batch_size, m, world, num_layers, cuts):
    """An error naming the fix, on every rank before any work, for what torch's schedules
    cannot run: m, a positive int, must divide the batch (equal micro-batches), the schedule must
    exist, and the cuts must give one stage per rank (two per rank, looped r, r + world, when
    interleaved)."""
    if not pipelining_available(schedule):
        raise ValueError(f"torch {torch.__version__} has no torch.distributed.pipelining."
                         f"{schedule}: pick one of its Schedule* classes")
    validate_positive_int(m, "n_microbatches")
    if batch_size % m:
        fits = [k for k in range(1, min(batch_size, 4 * m) + 1) if batch_size % k == 0]
        raise ValueError(f"torch's {schedule} needs equal micro-batches, and {m} micro-batches "
                         f"do not divide a batch of {batch_size}: use a batch size that is a "
                         f"multiple of {m}, or m in {fits[-4:]} (the course's "
                         "pipeline_rank_step runs uneven micro-batches)")
    stages = world * (2 if schedule in LOOPED_SCHEDULES else 1)
    validate_cuts(cuts, num_layers, stages)
    return stages


def make_schedule(stage_modules, stage_ids, num_stages, device, m, loss_fn, schedule):
    """The production code: one PipelineStage per stage this rank holds, and the schedule.
    scale_grads=False because our loss is already divided by the whole batch (the default
    would divide the summed micro-batch gradients by m once more)."""
    from torch.distributed import pipelining as pp
    stages = [pp.PipelineStage(mod, i, num_stages, device)
              for mod, i in zip(stage_modules, stage_ids, strict=True)]
    cls = getattr(pp, schedule)
    kwargs = dict(n_microbatches=m, loss_fn=loss_fn)
    if "scale_grads" in inspect.signature(cls.__init__).parameters:
        kwargs["scale_grads"] = False
    return cls(stages if schedule in LOOPED_SCHEDULES else stages[0], **kwargs), stages


def pipelining_step(sched, rank, first, last, X, y):
    """One step: the rank holding the first stage passes the batch, the one holding the last
    passes the targets and gets one loss per micro-batch back, the others pass nothing."""
    losses = []
    kwargs = dict(target=y, losses=losses) if last else {}
    sched.step(*([X] if first else []), **kwargs)
    return losses if last else None


def _arrived(device):
    """On a GPU, wait until the current stream has what it waits for: torch's schedule waited
    on its receives before calling a box, which on NCCL only makes the stream wait, so without
    this the box would open before its input arrived (and the wait would land inside it)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _timed(stage, clock, memory, seconds, rank, rows):
    """Wrap the stage's three box methods: each runs inside clock.box (real math, then the
    modelled time when the clock emulates), opened once its input is there; forwards record
    what autograd saves."""
    fwd, bwd, wgt = stage.forward_one_chunk, stage.backward_one_chunk, \
        stage.backward_weight_one_chunk
    info = dict(stage=rank, virtual=stage.stage_index, rows=rows)   # stage: the row drawn in
    device = torch.device(stage.device)

    def forward_one_chunk(j, *args, **kwargs):
        _arrived(device)
        with clock.box("F", seconds("F"), micro=j, phase="F", **info):
            with memory.micro_batch(stage.submod.parameters()):
                return fwd(j, *args, **kwargs)

    def backward_one_chunk(j, *args, **kwargs):
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        ph = "B" if full else "I"                 # I: the input gradient only (zero bubble)
        _arrived(device)
        with clock.box(ph, seconds(ph), micro=j, phase="B", full=bool(full), **info):
            return bwd(j, *args, **kwargs)

    def backward_weight_one_chunk(j, *args, **kwargs):
        _arrived(device)
        with clock.box("W", seconds("W"), micro=j, phase="W", **info):
            return wgt(j, *args, **kwargs)
    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def pipelining_runs(net, cuts, rank, world, device, X, y, m, schedule, repeats, clock=None,
                    box_seconds=None) -> PipeliningRun:
    """`repeats` steps of torch.distributed.pipelining's `schedule` (a class name) on stages
    built once. box_seconds(stage, phase, rows) -> modelled seconds (for an emulating clock).
    Returns the first step's loss and this rank's gradients, every step's timeline, and the
    activations autograd held at the peak of the last step (the first step also runs each
    stage once to infer shapes): a results.PipeliningRun."""
    from ..runtime.emulate import Clock
    n = X.shape[0]
    num_stages = validate_pipelining(schedule, n, m, world, len(net), cuts)
    loss_fn = lambda out, t: sum_loss(out, t) / n
    clock, memory = clock or Clock(), LiveActivations()
    ids = list(range(rank, num_stages, world))            # looped placement: r, r + world
    mods = [stage_of(net, cuts, i, num_stages).to(device) for i in ids]
    sched, stages = make_schedule(mods, ids, num_stages, device, m, loss_fn, schedule)
    for st in stages:
        secs = (lambda ph, i=st.stage_index: box_seconds(i, ph, n // m)) if box_seconds \
            else (lambda ph: None)
        _timed(st, clock, memory, secs, rank, n // m)
    first, last = 0 in ids, num_stages - 1 in ids
    timelines, grads, loss = [], {}, None
    for rep in range(repeats):
        for mod in mods:
            mod.zero_grad()
        n0 = len(clock.boxes)
        memory.__init__()
        losses = pipelining_step(sched, rank, first, last, X.to(device), y.to(device))
        timelines.append([dict(b) for b in clock.boxes[n0:]])
        if rep == 0:
            grads = {i: [p.grad.detach().cpu().clone() for p in mod.parameters()]
                     for i, mod in zip(ids, mods, strict=True)}
            loss = float(sum(float(v.detach()) for v in losses)) if last else None
    return PipeliningRun(schedule=schedule, m=m, timelines=timelines, loss=loss, grads=grads,
                         peak_live=memory.peak_live, peak_bytes=memory.peak_bytes,
                         cuts=list(cuts), stages=ids)
