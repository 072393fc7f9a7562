"""Part IV experiments on real ranks, as launch targets fn(rank, world, cfg): a profiler trace of
DDP steps (backward and the all-reduces overlapping it) and DDP's own performance knobs, timed in
turns. The default process group is set up before they run (gloo on a CPU).
"""
import os
import time

import torch

__all__ = ["ddp_trace", "ddp_knobs"]

def ddp_trace(rank, world, cfg):
    """Part IV (profile): torch.profiler over DDP steps of a deep MLP on this rank, the regions
    forward / backward / optimizer marked with record_function; the Chrome trace goes to
    cfg["trace_dir"]/ddp_rank{rank}.json (open it in ui.perfetto.dev or chrome://tracing).
    cfg: trace_dir, width 512, depth 8, batch 64 (per rank), bucket_mb 1.0 (DDP's bucket_cap_mb),
    steps 3 (profiled, after 2 warm-up steps in which DDP also rebuilds its buckets). Returns
    trace (the path) and events (helpers.trace_events of it)."""
    from torch.nn import functional as F
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from .profiling import quiet_native_stderr, trace_events
    from .tiny_models import deep_mlp
    width, steps, warm = cfg.get("width", 512), cfg.get("steps", 3), 2
    torch.manual_seed(0)                       # the same model on every rank
    model = torch.nn.parallel.DistributedDataParallel(
        deep_mlp(d_in=width, width=width, depth=cfg.get("depth", 8)),
        bucket_cap_mb=cfg.get("bucket_mb", 1.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)    # each rank its own examples
    X = torch.randn(cfg.get("batch", 64), width, generator=g)
    y = torch.randint(0, 10, (X.shape[0],), generator=g)
    path = os.path.join(cfg["trace_dir"], f"ddp_rank{rank}.json")
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    with quiet_native_stderr(), profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=warm, active=steps, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(warm + steps):
            with record_function("forward"):
                loss = F.cross_entropy(model(X), y)
            with record_function("backward"):
                loss.backward()                # DDP all-reduces buckets as their grads land
            with record_function("optimizer"):
                opt.step()
                opt.zero_grad()
            prof.step()
    return dict(trace=path, events=trace_events(path))


def ddp_knobs(rank, world, cfg):
    """Part IV (fixes): seconds per DDP step of a deep MLP under DDP's own knobs, in turns
    (every round times each knob for `steps` steps, the order reversed every other round,
    after 3 warm-up steps each). Every knob trains its own copy from the same start on the same
    batches, so `max_diff` (against the default) says which knobs change the arithmetic.
    cfg: width 512, depth 8, batch 64 (per rank), steps 5, rounds 5. Returns step_s {knob:
    [seconds per step, one per round]} and max_diff {knob: max |param - default's param|}."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn import functional as F

    from .tiny_models import deep_mlp
    width, steps = cfg.get("width", 512), cfg.get("steps", 5)
    knobs = {"default (25 MB buckets)": {}, "1 MB buckets": dict(bucket_cap_mb=1),
             "one bucket (no overlap)": dict(bucket_cap_mb=1000),
             "gradient_as_bucket_view": dict(gradient_as_bucket_view=True),
             "static_graph": dict(static_graph=True),
             "bf16 compression hook": dict(hook=default_hooks.bf16_compress_hook)}
    g = torch.Generator().manual_seed(rank)
    X = torch.randn(cfg.get("batch", 64), width, generator=g)
    y = torch.randint(0, 10, (X.shape[0],), generator=g)
    models = {}
    for name, kw in knobs.items():
        kw = dict(kw)
        hook = kw.pop("hook", None)
        torch.manual_seed(0)
        m = torch.nn.parallel.DistributedDataParallel(
            deep_mlp(d_in=width, width=width, depth=cfg.get("depth", 8)), **kw)
        if hook:
            m.register_comm_hook(None, hook)
        models[name] = (m, torch.optim.SGD(m.parameters(), lr=0.01))

    def train(name, n):
        m, opt = models[name]
        for _ in range(n):
            F.cross_entropy(m(X), y).backward()
            opt.step()
            opt.zero_grad()
    for name in knobs:
        train(name, 3)
    samples = {name: [] for name in knobs}
    for r in range(cfg.get("rounds", 5)):
        for name in (list(knobs) if r % 2 == 0 else list(knobs)[::-1]):
            dist.barrier()
            t0 = time.perf_counter()
            train(name, steps)
            dist.barrier()
            samples[name].append((time.perf_counter() - t0) / steps)
    base = list(models["default (25 MB buckets)"][0].parameters())
    diff = {name: max((a - b).abs().max().item() for a, b in zip(base, m.parameters()))
            for name, (m, _) in models.items()}
    return dict(step_s=samples, max_diff=diff)

