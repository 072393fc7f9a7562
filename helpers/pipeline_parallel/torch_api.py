"""Part VI: the same pipeline with torch.distributed.pipelining (PipelineStage and its schedule
classes), each stage timed and its live activations measured as in the hand-built one.
"""
import inspect
import time

import torch
from torch import nn

from .scratch import LiveActivations, cuts_by, stage_of, sum_loss

__all__ = ["pipelining_available", "pipelining_runs"]


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


def pipelining_runs(net, cuts, rank, world, device, X, y, m, schedule, repeats):
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


