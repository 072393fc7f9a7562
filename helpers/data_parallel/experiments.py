"""Part III's data-parallel experiments across processes, each a launch target
fn(rank, world, cfg): DDPFromScratch and torch's DDP against one process, when gradients are
ready and all-reduced, BatchNorm per device against synchronised BatchNorm, uneven inputs with
and without Join. Each compares with one process on the combined batch and returns numbers.
Part IV's: a profiler trace of DDP steps (ddp_trace) and DDP's own knobs timed in turns
(ddp_knobs).
"""
import os
import time

import torch
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ..data import load_tensors
from ..models import unwrap
from ..compare import max_diff
from ..one_process import flat_cross_entropy, local_batch, make_optimizer, params_of, \
    train_one_process
from ..runtime.launch import take
from ..runtime.progress import report_progress
from ..runtime.traffic import count_traffic
from ..tiny_models import make_batches, make_model
from .scratch import DDPFromScratch
from .torch_api import bn_net, bn_stats, convert_sync_batchnorm, evaluate_exact, global_batches, \
    train_bn_steps

__all__ = ["ddp_vs_one_process", "gradient_timeline", "bn_vs_syncbn", "uneven_inputs_join",
           "ddp_trace", "ddp_knobs"]


def ddp_vs_one_process(rank, world, cfg):
    """DDPFromScratch and torch's DDP against one process, for each (model kind, bucket_mb)."""
    device, cases, num_steps, batch_size = take(cfg, "device", "cases", num_steps=3, batch_size=8)
    out = []
    for kind, bucket_mb in cases:
        batches = make_batches(kind, num_steps, batch_size)
        ref = train_one_process(kind, batches, device, num_steps, optim="sgd")
        diffs = {}
        for impl in ("scratch", "torch"):
            # different init per rank: broadcast fixes it
            net = make_model(kind, seed=rank).to(device)
            if impl == "scratch":
                model = DDPFromScratch(net, bucket_mb=bucket_mb)
            else:
                model = nn.parallel.DistributedDataParallel(
                    net, bucket_cap_mb=bucket_mb if bucket_mb is not None else 25)
            opt = make_optimizer(model.module, "sgd")
            for batch in batches:
                X, y = local_batch(batch, rank, world, device)
                with count_traffic() as log:
                    flat_cross_entropy(model(X), y).backward()
                    if impl == "scratch":
                        model.finish_gradient_synchronization()
                opt.step()
                opt.zero_grad()
            diffs[impl] = max_diff(params_of(model.module), ref)
            if impl == "scratch":
                diffs["calls"] = log.calls["all_reduce"]   # all-reduces in the last step
                diffs["num_buckets"] = len(model.buckets)
                diffs["sizes"] = [len(b) for b in model.buckets]
        out.append(dict(kind=kind, bucket_mb=bucket_mb, **diffs,
                        num_trainable=sum(1 for p in net.parameters() if p.requires_grad)))
    return out


def gradient_timeline(rank, world, cfg):
    """When each gradient is ready and each all-reduce is launched, relative to backward's start
    and end (seconds); the last of `repeats` steps (the first ones warm up)."""
    device, bucket_mb, sizes, repeats = take(cfg, "device", bucket_mb=None, sizes=None, repeats=3)
    model = DDPFromScratch(make_model("mlp", **(sizes or {})).to(device), bucket_mb=bucket_mb)
    batch = make_batches("mlp", 1, 64, d_in=(sizes or {}).get("d_in", 32))[0]
    X, y = local_batch(batch, rank, world, device)
    for _ in range(repeats):
        loss = flat_cross_entropy(model(X), y)
        t0 = time.perf_counter()
        loss.backward()
        t1 = time.perf_counter()
        model.finish_gradient_synchronization()
        t2 = time.perf_counter()
        model.zero_grad()
    return dict(events=[(t - t0, what, i) for t, what, i in model.timeline],
                backward_s=t1 - t0, finish_s=t2 - t0, num_buckets=len(model.buckets))


def bn_vs_syncbn(rank, world, cfg):
    """Train bn_net under DDP with per-device BatchNorm, then with synchronised BatchNorm, from
    the same start on the same global batches (cfg: subset, batch_size, num_steps, lr, seed,
    channels). Returns per variant: BN running statistics, weights, test accuracy."""
    device, subset, batch_size, num_steps, lr, seed, channels = take(
        cfg, "device", "subset", "batch_size", "num_steps", "lr", "seed", channels=16)
    X, y = load_tensors(True, subset)
    X_test, y_test = load_tensors(False, subset)
    batches = global_batches(len(y), batch_size, num_steps, seed)
    results = {}
    for i, variant in enumerate(("bn", "syncbn")):
        report_progress(i + 1, 2, "BatchNorm variant")
        torch.manual_seed(seed)
        net = bn_net(channels).to(device)
        if variant == "syncbn":
            net = convert_sync_batchnorm(net, device)
        model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
        train_bn_steps(model, X, y, batches, lr, device, rank, world)
        correct, total = evaluate_exact(model, X_test, y_test, device)
        results[variant] = dict(
            stats=bn_stats(model), acc=correct / total, total=total,
            state={k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()})
    return results


def uneven_inputs_join(rank, world, cfg):
    """Uneven inputs: rank r trains on 3 + 2r batches. Under `Join`, a rank that runs out of data
    shadows the others' gradient all-reduces (with zeros) until all are done, so nobody waits
    forever. Launch it with backend="gloo" (a lesson about collectives, not speed). Returns
    {steps, weight, finished}."""
    (use_join,) = take(cfg, use_join=True)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps, g = 3 + 2 * rank, torch.Generator().manual_seed(rank)
    finished = True
    try:
        with Join([model], enable=use_join):
            for _ in range(steps):
                loss = model(torch.randn(8, 4, generator=g)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    except RuntimeError:   # without Join: the rank with more batches times out waiting
        finished = False
    return dict(steps=steps, finished=finished, weight=model.module.weight.detach().clone())


def ddp_trace(rank, world, cfg):
    """Part IV (profile): torch.profiler over DDP steps of a deep MLP on this rank, the regions
    forward / backward / optimizer marked with record_function; the Chrome trace goes to
    cfg["trace_dir"]/ddp_rank{rank}.json (open it in ui.perfetto.dev or chrome://tracing).
    cfg: trace_dir, width 512, depth 8, batch 64 (per rank), bucket_mb 1.0 (DDP's bucket_cap_mb),
    steps 3 (profiled, after 2 warm-up steps in which DDP also rebuilds its buckets). Returns
    trace (the path) and events (helpers.trace_events of it)."""
    from torch.nn import functional as F
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from ..profiling import quiet_native_stderr, trace_events
    from ..tiny_models import deep_mlp
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

    from ..tiny_models import deep_mlp
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

