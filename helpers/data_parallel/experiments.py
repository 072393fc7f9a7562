"""Part III's experiments with torch's own data parallelism across processes, each a launch
target fn(rank, world, cfg): BatchNorm per device against synchronised BatchNorm, uneven inputs
with and without Join. (DDPFromScratch's are in scratch_experiments.py.)
Part IV's: a profiler trace of DDP steps (ddp_trace) and DDP's own knobs timed in turns
(ddp_knobs).
"""
import os
import tempfile

import torch
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ..compare import max_diff
from ..data import load_tensors
from ..devices import DeviceClock, synced_now, synchronize
from ..models import unwrap
from ..runtime.launch import take
from ..runtime.progress import report_progress
from ..timing import turn_order
from .results import BnRun, DdpTrace, JoinRun, KnobsRun
from .torch_api import (
    bn_net,
    bn_stats,
    convert_sync_batchnorm,
    evaluate_exact,
    global_batches,
    no_forward_buffer_sync,
    train_bn_steps,
)

__all__ = ["bn_vs_syncbn", "bn_grads_same_weights", "uneven_inputs_join", "ddp_trace",
           "ddp_knobs"]


def bn_vs_syncbn(rank: int, world: int, cfg: dict) -> dict[str, BnRun]:
    """Train bn_net under DDP with per-device BatchNorm, then with synchronised BatchNorm, from
    the same start on the same global batches (cfg: subset, batch_size, num_steps, lr, seed,
    channels). Returns per variant ("bn", "syncbn") a results.BnRun: BN running statistics,
    weights, test accuracy."""
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
        results[variant] = BnRun(
            stats=bn_stats(model), acc=correct / total, total=total,
            state={k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()})
    return results


def _flat_grad(model):
    return torch.cat([p.grad.reshape(-1) for p in unwrap(model).parameters()]).cpu()


def bn_grads_same_weights(rank, world, cfg):
    """The comparison on the same weights: for each state in cfg["states"] (bn_net state dicts
    along one training run) and its global batch (cfg["batches"], indices), the gradient DDP
    leaves (averaged over the ranks) with per-device BatchNorm and with synchronised BatchNorm,
    each from that same state. Returns {"bn": [flat grad, ...], "syncbn": [...]}."""
    device, subset, states, batches, channels = take(cfg, "device", "subset", "states",
                                                     "batches", channels=16)
    X, y = load_tensors(True, subset)
    out = {}
    for variant in ("bn", "syncbn"):
        net = bn_net(channels).to(device)
        if variant == "syncbn":
            net = convert_sync_batchnorm(net, device)
        model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None,
                    **no_forward_buffer_sync())   # every rank loads the same states below
        grads = []
        for state, idx in zip(states, batches, strict=True):
            unwrap(model).load_state_dict(state)
            model.train()
            idx = idx.tensor_split(world)[rank]
            model.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(X[idx].to(device)), y[idx].to(device)).backward()
            grads.append(_flat_grad(model))
        out[variant] = grads
    return out


def uneven_inputs_join(rank: int, world: int, cfg: dict) -> JoinRun:
    """Uneven inputs: rank r trains on 3 + 2r batches. Under `Join`, a rank that runs out of data
    shadows the others' gradient all-reduces (with zeros) until all are done, so nobody waits
    forever. Launch it with backend="gloo" (a lesson about collectives, not speed). Returns a
    results.JoinRun (steps, finished, weight)."""
    device, use_join = take(cfg, "device", use_join=True)
    torch.manual_seed(0)
    model = _ddp(nn.Linear(4, 1).to(device), device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps, g = 3 + 2 * rank, torch.Generator().manual_seed(rank)
    finished = True
    try:
        with Join([model], enable=use_join):
            for _ in range(steps):
                loss = model(torch.randn(8, 4, generator=g).to(device)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    except RuntimeError:   # without Join: the rank with more batches times out waiting
        finished = False
    return JoinRun(steps=steps, finished=finished, weight=unwrap(model).weight.detach().cpu())


def ddp_trace(rank: int, world: int, cfg: dict) -> DdpTrace:
    """Part IV (profile): torch.profiler over DDP steps of a deep MLP on this rank, the regions
    forward / backward / optimizer marked with record_function; the Chrome trace goes to
    cfg["trace_dir"]/ddp_rank{rank}.json (open it in ui.perfetto.dev or chrome://tracing).
    cfg: trace_dir, width 512, depth 8, batch 64 (per rank), bucket_mb 1.0 (DDP's bucket_cap_mb),
    steps 3 (profiled, after 2 warm-up steps in which DDP also rebuilds its buckets). On a GPU
    the profiler records CUDA activity too: the kernels, and NCCL's all-reduce kernels, which
    trace_events reads as the all-reduce lane (the host's nccl:all_reduce is only the launch).
    Returns a results.DdpTrace: trace (the path), events (helpers.trace_events of it), device,
    backend and the profiler's activities (their names)."""
    import torch.distributed as dist

    from ..tiny_models import deep_mlp
    device, trace_dir, width, depth, batch, bucket_mb, steps = take(
        cfg, "device", "trace_dir", width=512, depth=8, batch=64, bucket_mb=1.0, steps=3)
    torch.manual_seed(0)                       # the same model on every rank
    model = _ddp(deep_mlp(d_in=width, width=width, depth=depth).to(device),
                 device, bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X, y = _examples(rank, batch, width, device)
    path = os.path.join(trace_dir, f"ddp_rank{rank}.json")
    events, activities = _profiled_steps(model, opt, X, y, device, path, warm=2, steps=steps)
    return DdpTrace(trace=path, events=events, device=str(device),
                    backend=dist.get_backend(), activities=activities)


def _profiled_steps(model, opt, X, y, device, path, warm, steps):
    """torch.profiler over `warm` + `steps` DDP steps, the regions forward / backward /
    optimizer marked with record_function; the Chrome trace of the last `steps` goes to `path`.
    Returns helpers.trace_events of it and the profiler's activities (their names)."""
    from torch.nn import functional as F
    from torch.profiler import record_function, schedule

    from ..profiling import quiet_profile, trace_events
    cuda = device.type == "cuda"
    with quiet_profile(cuda, schedule=schedule(wait=0, warmup=warm, active=steps, repeat=1),
                       on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for k in range(warm + steps):
            with record_function("forward"):
                loss = F.cross_entropy(model(X), y)
            with record_function("backward"):
                loss.backward()                # DDP all-reduces buckets as their grads land
            with record_function("optimizer"):
                opt.step()
                opt.zero_grad()
            if k == warm + steps - 1:
                synchronize(device)            # the last kernels in the trace too
            prof.step()
    return trace_events(path), ["CPU", "CUDA"] if cuda else ["CPU"]


def _ddp(net, device, **kw):
    """torch's DDP of a model on `device` (its GPU named, as DDP wants on CUDA)."""
    return DDP(net, device_ids=[device.index] if device.type == "cuda" else None, **kw)


def _examples(rank, batch, width, device):
    """This rank's own examples (seeded by rank), on its device."""
    g = torch.Generator().manual_seed(rank)
    X = torch.randn(batch, width, generator=g)
    return X.to(device), torch.randint(0, 10, (batch,), generator=g).to(device)


# the knobs whose steps ddp_knobs also traces: no overlap, the default, small buckets
TRACED_KNOBS = ("one bucket (no overlap)", "default (25 MiB buckets)", "1 MiB buckets")


def ddp_knobs(rank: int, world: int, cfg: dict) -> KnobsRun:
    """Part IV (fixes): seconds per DDP step of a deep MLP under DDP's own knobs, in turns
    (every round times each knob for `steps` steps, the order reversed every other round,
    after 3 warm-up steps each). Every knob trains its own copy from the same start on the same
    batches, so `max_diff` (against the default) says which knobs change the arithmetic.
    cfg: width 512, depth 8, batch 64 (per rank), steps 5, rounds 5. Returns a results.KnobsRun:
    step_s {knob:
    [seconds per step, one per round]}, exposed_s {knob: [seconds per step that backward()
    went on after its last gradient was accumulated: the all-reduce not hidden behind autograd
    work, which DDP's backward waits for]}, max_diff {knob: max |param - default's|} and traced
    {knob of TRACED_KNOBS: helpers.exposed_ms of a profiler trace of `trace_steps` more steps
    (ms over them, `steps` their count), as the profile chapter splits its trace}. On a GPU both
    ends of that wait are CUDA events (the host only queues the work)."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn import functional as F

    from ..profiling import exposed_ms
    from ..tiny_models import deep_mlp
    device, width, depth, batch, steps, rounds, trace_steps = take(
        cfg, "device", width=512, depth=8, batch=64, steps=5, rounds=5, trace_steps=3)
    clock = DeviceClock(device)
    knobs = {"default (25 MiB buckets)": {}, "1 MiB buckets": dict(bucket_cap_mb=1),
             "one bucket (no overlap)": dict(bucket_cap_mb=1000),
             "gradient_as_bucket_view": dict(gradient_as_bucket_view=True),
             "static_graph": dict(static_graph=True),
             "bf16 compression hook": dict(hook=default_hooks.bf16_compress_hook)}
    X, y = _examples(rank, batch, width, device)
    models = {}
    for name, kw in knobs.items():
        kw = dict(kw)
        hook = kw.pop("hook", None)
        torch.manual_seed(0)
        m = _ddp(deep_mlp(d_in=width, width=width, depth=depth).to(device), device, **kw)
        if hook:
            m.register_comm_hook(None, hook)
        models[name] = (m, torch.optim.SGD(m.parameters(), lr=0.01))

    last_grad = [None]  # when the last gradient of the current backward was accumulated
    for m, _ in models.values():
        for p in m.parameters():
            p.register_post_accumulate_grad_hook(
                lambda _: last_grad.__setitem__(0, clock.stamp()))

    def train(name, n):
        """n steps; per step (last gradient, backward returned) on the device's clock."""
        m, opt = models[name]
        ends = []
        for _ in range(n):
            loss = F.cross_entropy(m(X), y)
            loss.backward()          # DDP: returns after the reducer waited for every bucket
            ends.append((last_grad[0], clock.stamp()))
            opt.step()
            opt.zero_grad()
        return ends

    def waited(ends):
        """The seconds backward() went on after its last gradient, summed over the steps."""
        t = clock.seconds([s for pair in ends for s in pair])
        return sum(b - a for a, b in zip(t[::2], t[1::2], strict=True))
    for name in knobs:
        train(name, 3)
    samples = {name: [] for name in knobs}
    exposed = {name: [] for name in knobs}
    for r in range(rounds):
        for name in turn_order(knobs, r):
            dist.barrier()
            t0 = synced_now(device)
            ends = train(name, steps)
            synchronize(device)
            dist.barrier()
            samples[name].append((synced_now(device) - t0) / steps)
            exposed[name].append(waited(ends) / steps)
    base = list(models["default (25 MiB buckets)"][0].parameters())
    diff = {name: max_diff(base, list(m.parameters())) for name, (m, _) in models.items()}
    # after the diff (these steps train on): the profile chapter's trace of a few steps of the
    # bucket knobs, split by helpers.exposed_ms at the end of backward's compute (none where
    # trace_steps is 0)
    traced = {}
    with tempfile.TemporaryDirectory(prefix=f"ddp-knobs-{rank}-") as trace_dir:
        for i, name in enumerate(TRACED_KNOBS if trace_steps else ()):
            m, opt = models[name]
            events, _ = _profiled_steps(m, opt, X, y, device,
                                        os.path.join(trace_dir, f"{i}.json"),
                                        warm=1, steps=trace_steps)
            traced[name] = dict(exposed_ms(events),
                                steps=sum(e["name"] == "backward" for e in events))
    return KnobsRun(step_s=samples, exposed_s=exposed, max_diff=diff, traced=traced)
