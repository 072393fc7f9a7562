"""Part III: when DDPFromScratch's all-reduces launch and complete, on real ranks, each experiment
a launch target fn(rank, world, cfg): the timeline of a backward pass (gradients ready, launches,
completions), step times with the all-reduces launched from the hooks or after backward, a
torch.profiler trace of both, and the same schedule in emulated durations, whose
shape a busy machine changes only by delaying its sleeps by more than overlap saves.
"""
import time

import torch.distributed as dist
from torch import nn

from ..one_process import flat_cross_entropy, local_batch
from ..runtime.launch import take
from ..timing import turn_order
from ..tiny_models import make_batches, make_model
from .results import (
    EmulatedMode,
    EmulatedRun,
    GradientTimeline,
    OverlapSteps,
    ScratchTrace,
    TraceMode,
)
from .scratch import DDPFromScratch

__all__ = ["gradient_timeline", "overlap_step_times", "ddp_scratch_trace", "emulated_overlap",
           "modelled_step", "timeline_model", "timed_step"]


def timeline_model(device, sizes, bucket_mb, overlap=True):
    """A DDPFromScratch MLP that records its timeline, and one batch for it: (model, batch)."""
    model = DDPFromScratch(make_model("mlp", **(sizes or {})).to(device), bucket_mb=bucket_mb,
                           overlap=overlap)
    batch = make_batches("mlp", 1, 64, **(sizes or {}))[0]
    return model, batch


def timed_step(model, X, y):
    """One synchronised step's backward and finish, timed on the model's clock (CUDA events on
    a GPU: when the GPU got there): (start, backward end, finish end) in host-clock seconds,
    as model.timeline, which it leaves holding the step."""
    loss = flat_cross_entropy(model(X), y)
    t0 = model.clock.stamp()
    loss.backward()
    t1 = model.clock.stamp()
    model.finish_gradient_synchronization()
    t2 = model.clock.stamp()
    deadline = time.monotonic() + 1.0     # a time-out, not a measurement: completion
    while model.completions() < len(model.buckets) and \
            time.monotonic() < deadline:      # callbacks run on gloo's threads: let them land
        time.sleep(0.001)
    t0, t1, t2 = model.clock.seconds([t0, t1, t2])
    model.zero_grad()
    return t0, t1, t2


def gradient_timeline(rank, world, cfg):
    """When each gradient was ready, each bucket's all-reduce launched and completed (seconds
    from the start of loss.backward()), on the last of `repeats` steps (the first ones warm
    up), and when backward and finish returned, and the device (on a GPU the times are the
    GPU's: CUDA events): a results.GradientTimeline. cfg["batch_size"]: this rank's
    examples."""
    device, bucket_mb, sizes, repeats, batch_size = take(
        cfg, "device", bucket_mb=None, sizes=None, repeats=3, batch_size=32)
    model, batch = timeline_model(device, sizes, bucket_mb)
    X, y = local_batch(batch, rank, world, device)
    X, y = X[:batch_size], y[:batch_size]
    for _ in range(repeats):
        dist.barrier()
        t0, t1, t2 = timed_step(model, X, y)
    return GradientTimeline(events=[(t - t0, what, i) for t, what, i in model.timeline],
                            backward_s=t1 - t0, finish_s=t2 - t0,
                            num_buckets=len(model.buckets), device=str(device))


def overlap_step_times(rank, world, cfg):
    """Seconds of backward + finish per step, with the all-reduces launched from the hooks
    (overlap) and all launched in finish (after), on the same model and buckets, timed in
    turns (ABAB..., the order reversed every other round, ranks meeting in a barrier before
    each step) after `warmup` rounds. Returns a results.OverlapSteps: one sample per round of
    each, and how many all-reduces of the last overlapped step completed before backward
    returned."""
    device, bucket_mb, sizes, rounds, warmup, batch_size = take(
        cfg, "device", bucket_mb=None, sizes=None, rounds=7, warmup=2, batch_size=32)
    models = {k: timeline_model(device, sizes, bucket_mb, overlap=k == "overlap")[0]
              for k in ("overlap", "after")}
    batch = timeline_model(device, sizes, bucket_mb)[1]
    X, y = local_batch(batch, rank, world, device)
    X, y = X[:batch_size], y[:batch_size]
    times = {k: [] for k in models}
    done_early = 0
    for r in range(warmup + rounds):
        for k in turn_order(("overlap", "after"), r):
            dist.barrier()
            t0, t1, t2 = timed_step(models[k], X, y)
            if r >= warmup:
                times[k].append(t2 - t0)
            if k == "overlap":
                done_early = sum(1 for t, w, _ in models[k].timeline if w == "done" and t < t1)
    return OverlapSteps(**times, done_before_backward_end=done_early,
                        num_buckets=len(models["overlap"].buckets))


_LANES = {"forward": "forward", "backward": "backward", "finish": "finish"}


def _trace_events(path):
    """(lane, start_ms, dur_ms) of an exported Chrome trace: the record_function regions
    (forward, backward, finish), the all-reduces launched on the training thread ("launch":
    c10d::allreduce_) and those that ran ("all-reduce": gloo's threads, or NCCL's kernels on
    a GPU: helpers.profiling.comm_events)."""
    import json

    from ..profiling import comm_events
    with open(path) as f:
        events = [e for e in json.load(f).get("traceEvents", [])
                  if e.get("ph") == "X" and "dur" in e]
    comm = {id(e) for e in comm_events(events)}
    out = []
    for e in events:
        name = e["name"]
        if e.get("cat") == "gpu_user_annotation":
            continue                   # a region's copy on the GPU: the host's is the region
        lane = _LANES.get(name) or ("launch" if name.startswith("c10d::allreduce") else
                                    "all-reduce" if id(e) in comm else None)
        if lane:
            out.append((lane, float(e["ts"]) / 1e3, float(e["dur"]) / 1e3))
    t0 = min((t for lane, t, _ in out if lane == "forward"), default=0.0)
    return sorted((lane, t - t0, d) for lane, t, d in out)


def _covered(spans):
    """Total length of the union of (start, end) spans."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total


def ddp_scratch_trace(rank, world, cfg):
    """torch.profiler traces of `steps` DDPFromScratch steps (after a warm-up), with the
    all-reduces launched from the hooks ("overlap") and all in finish ("after"); on a GPU with
    CUDA activity too (the all-reduce lane: NCCL's kernels). Returns a results.ScratchTrace:
    per mode the trace's events [(lane, start_ms, dur_ms)] and, summed over the steps, the ms
    some all-reduce was running, the ms of that during backward (work done while
    communication was in flight) and the ms of the steps (forward start to finish end)."""
    import os
    import tempfile

    from torch import profiler

    from ..devices import synchronize
    from ..profiling import quiet_profile
    device, bucket_mb, sizes, steps, batch_size = take(
        cfg, "device", bucket_mb=None, sizes=None, steps=3, batch_size=32)
    out = {}
    for mode in ("overlap", "after"):
        model, batch = timeline_model(device, sizes, bucket_mb, overlap=mode == "overlap")
        X, y = local_batch(batch, rank, world, device)
        X, y = X[:batch_size], y[:batch_size]
        for _ in range(2):
            timed_step(model, X, y)
        dist.barrier()
        with quiet_profile(device.type == "cuda") as prof:
            for _ in range(steps):
                with profiler.record_function("forward"):
                    loss = flat_cross_entropy(model(X), y)
                with profiler.record_function("backward"):
                    loss.backward()
                with profiler.record_function("finish"):
                    model.finish_gradient_synchronization()
                model.zero_grad()
            synchronize(device)        # the last kernels in the trace too
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            prof.export_chrome_trace(path)
            events = _trace_events(path)
        comm = [(t, t + d) for lane, t, d in events if lane == "all-reduce"]
        back = [(t, t + d) for lane, t, d in events if lane == "backward"]
        hidden = _covered([(max(a, s), min(b, e)) for a, b in comm for s, e in back
                           if min(b, e) > max(a, s)])
        ends = [t + d for lane, t, d in events if lane == "finish"]
        starts = [t for lane, t, _ in events if lane == "forward"]
        # launched inside backward: the schedule's shape, whatever the load; hidden_ms is how
        # much of gloo's work got a core before backward ended, which a busy machine can make 0
        inside = sum(1 for lane, t, _ in events if lane == "launch"
                     and any(a <= t <= b for a, b in back))
        out[mode] = TraceMode(events=events, comm_ms=_covered(comm), hidden_ms=hidden,
                              launches_in_backward=inside,
                              step_ms=sum(e - s for s, e in zip(starts, ends, strict=True)),
                              steps=steps)
    return ScratchTrace(**out)


def _layer_flops(net, batch):
    """Modelled backward FLOPs per trainable parameter: 4 * batch * in * out for a Linear's
    weight (the gradients of its input and its weight), nothing for a bias."""
    flops = {}
    for m in net.modules():
        if isinstance(m, nn.Linear):
            flops[id(m.weight)] = 4 * batch * m.in_features * m.out_features
            if m.bias is not None:
                flops[id(m.bias)] = 0
    return flops


def modelled_step(ready, messages, backward, overlap):
    """The step of the emulated schedule with no delay at all, in modelled seconds since
    backward started: bucket i's all-reduce launches once buckets 0..i have their gradients
    (`ready`, per bucket; overlap) or when `backward` ends (not), and takes `messages[i]` on one
    link, after the bucket before it. What a machine that never delays a sleep would give."""
    link, ready_by = 0.0, 0.0
    for r, m in zip(ready, messages, strict=True):
        ready_by = max(ready_by, r)
        link = max(ready_by if overlap else backward, link) + m
    return max(link, backward)


def emulated_overlap(rank, world, cfg):
    """DDP's overlap in emulated durations: the math is real, but each layer's
    backward lasts its modelled time (its FLOPs for `model_batch` examples at the rates of
    helpers.Rates.load(), times `scale`), and each bucket's all-reduce completes when a ring over
    `world` ranks would have sent it (one link, buckets in launch order, 2(k-1) messages of
    alpha + bytes/k / beta). Sleeps cost no CPU, so busy cores keep the schedule's shape
    unless they delay the sleeps by more than its margin. Returns a results.EmulatedRun: per
    mode ("overlap", "after"): step end, backward end and the all-reduce spans
    (modelled seconds since backward started), and `modelled`, the step of the same schedule
    with no delay (modelled_step); `margin_s`, overlap's modelled saving times scale: the real
    seconds by which the machine may delay the overlapped step's sleeps, beyond the other's,
    before overlap stops ending first; and the rates' source. The host clock is read
    once the rank's stream has run what it was given (on a GPU the host only queues it)."""
    from ..devices import sleep_until
    from ..runtime.emulate import Clock, Rates
    device, bucket_mb, sizes, model_batch, scale, steps = take(
        cfg, "device", bucket_mb=None, sizes=None, model_batch=2048, scale=500.0, steps=2)
    rates, now = Rates.load(), Clock(device=device).now
    out = {}
    for mode in ("overlap", "after"):
        net = make_model("mlp", **(sizes or {})).to(device)
        flops = _layer_flops(net, model_batch)
        pace = {}

        def paced(p, pace=pace, flops=flops):   # before the wrapper's hook: the modelled
            pace["t"] += rates.compute(flops[id(p)]) * scale   # compute, then the launch
            pace["at"][id(p)] = pace["t"]
            sleep_until(pace["t"], now)
        for p in net.parameters():
            p.register_post_accumulate_grad_hook(paced)
        model = DDPFromScratch(net, bucket_mb=bucket_mb, overlap=mode == "overlap")
        batch = make_batches("mlp", 1, 32 * world, **(sizes or {}))[0]
        X, y = local_batch(batch, rank, world, device)
        for _ in range(steps):
            dist.barrier()
            loss = flat_cross_entropy(model(X), y)
            t0 = pace["t"] = now()
            pace["at"] = {}
            loss.backward()
            t1 = now()
            launches = sorted((s, i) for s, w, i in model.timeline if w == "launch") \
                if mode == "overlap" else [(t1, i) for i in range(len(model.buckets))]
            link, spans = t0, []
            messages = [2 * (world - 1) * rates.message(
                sum(p.numel() * p.element_size() for p in b) / world) for b in model.buckets]
            ready = [(max(pace["at"].get(id(p), pace["t"]) for p in b) - t0) / scale
                     for b in model.buckets]
            modelled = modelled_step(ready, messages, (pace["t"] - t0) / scale,
                                     mode == "overlap")
            for s, i in launches:
                seconds = messages[i]
                start = max(s, link)
                link = start + seconds * scale
                spans.append(((start - t0) / scale, (link - t0) / scale))
            model.finish_gradient_synchronization()     # the real all-reduces, real values
            end = max(link, t1)                          # then their modelled completion: a
            sleep_until(end, now)    # real all-reduce that a busy machine slows does not move it
            model.zero_grad()
        out[mode] = EmulatedMode(step=(end - t0) / scale, backward=(t1 - t0) / scale,
                                 comm=spans, modelled=modelled)
    return EmulatedRun(**out, margin_s=(out["after"].modelled - out["overlap"].modelled) * scale,
                       source=rates.source, scale=scale, model_batch=model_batch)
