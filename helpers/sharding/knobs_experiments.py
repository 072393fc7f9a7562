"""Part V's experiments on what production sharding adds, each a launch target fn(rank, world,
cfg) checked against one process: gradient accumulation with ZeRO-2 (a reduce-scatter per
micro-batch, or no_sync), clipping by the global norm over shards, FSDP's reshard_after_forward
and prefetching (by hand and with FSDP2's API), ZeRO in mixed precision (bytes per parameter),
and the cases each wrapper refuses, with their messages. Results: results.py's dataclasses.
"""
import contextlib

import torch
from torch import nn

from ..compare import max_diff, rel_diff
from ..costs import sharding_costs
from ..models import unwrap
from ..one_process import flat_cross_entropy, local_batch, params_of, train_one_process
from ..runtime.launch import take
from ..runtime.traffic import count_traffic
from ..tiny_models import make_batches, make_model
from .experiments import train_step
from .flat import all_gather_flat
from .fsdp_scratch import FSDPFromScratch
from .memory import PeakBytes
from .mixed import MixedPrecisionZero
from .results import (
    AccumulationMode,
    AccumulationRun,
    ClipNorms,
    ClipRun,
    KnobRun,
    KnobSetting,
    MixedZeroRun,
)
from .torch_api import fsdp2_layers, full_params
from .zero import ShardedOptimizer, Zero2

__all__ = ["zero2_accumulation", "clip_over_shards", "fsdp_knobs", "mixed_precision_zero",
           "refusals"]


def zero2_accumulation(rank, world, cfg):
    """Zero2 with `micro` micro-batches per step, both ways torch offers: a reduce-scatter after
    every backward ("every": ZeRO-2's memory), or no_sync for all but the last ("no_sync": full
    gradients kept, reduced once); each against one process, with the bytes sent per step and
    the cost model's all-reduce of plain data parallelism (DDP with no_sync) for scale."""
    device, micro, num_steps, batch_size, sizes = \
        take(cfg, "device", micro=8, num_steps=2, batch_size=8, sizes=None)
    batches = make_batches("mlp", num_steps * micro, batch_size)
    ref = train_one_process("mlp", batches, device, num_steps, "adamw_decay", sizes=sizes,
                            groups=False, micro=micro)
    out = {}
    for mode in ("every", "no_sync"):
        model = Zero2(make_model("mlp", **(sizes or {})).to(device), torch.optim.AdamW, lr=1e-3,
                      weight_decay=0.1)
        with count_traffic() as log:
            for s in range(num_steps):
                for m, batch in enumerate(batches[s * micro:(s + 1) * micro]):
                    X, y = local_batch(batch, rank, world, device)
                    quiet = mode == "no_sync" and m < micro - 1
                    with model.no_sync() if quiet else contextlib.nullcontext():
                        (flat_cross_entropy(model(X), y) / micro).backward()
                model.finish_gradient_synchronization()
                model.step()
                model.zero_grad()
        out[mode] = AccumulationMode(diff=max_diff(params_of(unwrap(model)), ref),
                                     sent=log.wire_bytes() / num_steps, calls=log.ops())
    n = sum(p.numel() for p in unwrap(model).parameters())
    return AccumulationRun(every=out["every"], no_sync=out["no_sync"],
                           dp_sent=sharding_costs(n, world, "dp")["sent_bytes"], micro=micro)


def clip_over_shards(rank, world, cfg):
    """clip_grad_norm_ with sharded gradients: what torch's clip_grad_norm_ on this rank's
    shards returns (its local norm), against the wrappers' clip by the global norm and one
    process; and the trained weights of each against one process."""
    device, max_norm, num_steps, batch_size, sizes = \
        take(cfg, "device", max_norm=0.5, num_steps=3, batch_size=8, sizes=None)
    batches = make_batches("mlp", num_steps, batch_size)
    ref_norms = []
    ref = train_one_process("mlp", batches, device, num_steps, "adamw_decay", sizes=sizes,
                            groups=False, clip=max_norm, norms=ref_norms)
    out = {}
    for kind in ("zero2", "fsdp"):
        net = make_model("mlp", **(sizes or {})).to(device)
        if kind == "zero2":
            model = Zero2(net, torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
            opt, shards = model, lambda model=model: [piece for _, piece, *_ in model.pieces]
        else:
            model = FSDPFromScratch(net)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
            shards = model.parameters
        local, norms = [], []
        for batch in batches:
            X, y = local_batch(batch, rank, world, device)
            flat_cross_entropy(model(X), y).backward()
            model.finish_gradient_synchronization()
            grads = [p.grad for p in shards() if p.grad is not None]
            local.append(float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads]))))
            norms.append(float(model.clip_grad_norm_(max_norm)))
            opt.step()
            opt.zero_grad()
        final = model.gather_full_params() if kind == "fsdp" else params_of(unwrap(model))
        out[kind] = ClipNorms(local_norms=tuple(local), norms=tuple(norms),
                              diff=max_diff(final, ref))
    return ClipRun(one_process_norms=tuple(ref_norms), **out)


def fsdp_knobs(rank, world, cfg):
    """FSDP's knobs, by hand (FSDPFromScratch) and in FSDP2: reshard_after_forward (True: ZeRO-3,
    all-gather again for backward; False: keep the weights, ZeRO-2's traffic) and prefetching.
    Each: the difference to one process, all-gathers per step, bytes sent; by hand also the peak
    of gathered weights and the step's timeline (gather issued, waited, unit computing).
    Returns {KnobSetting(impl, reshard, prefetch): KnobRun}."""
    device, num_steps, batch_size, sizes = \
        take(cfg, "device", num_steps=2, batch_size=8, sizes=None)
    batches = make_batches("mlp", num_steps, batch_size)
    ref = train_one_process("mlp", batches, device, num_steps, sizes=sizes, groups=False)
    out = {}
    for impl, reshard, prefetch in [("scratch", True, False), ("scratch", False, False),
                                    ("scratch", True, True), ("fsdp2", True, False),
                                    ("fsdp2", False, False), ("fsdp2", True, True)]:
        if impl == "scratch":
            model = FSDPFromScratch(make_model("mlp", **(sizes or {})).to(device),
                                    reshard_after_forward=reshard, prefetch=prefetch)
        else:
            model = fsdp2_layers(world, device, reshard, prefetch, sizes)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        with count_traffic() as log, PeakBytes().skip(list(model.parameters())) as peak:
            for batch in batches:
                train_step(model, opt, batch, rank, world, device, finish=impl == "scratch")
        gathers = sum(v for k, v in log.ops().items() if k.startswith("all_gather"))
        full = model.gather_full_params() if impl == "scratch" else full_params(model)
        by_hand = dict(peak_gathered=model.peak_live_bytes,
                       events=tuple(model.events)) if impl == "scratch" else {}
        out[KnobSetting(impl, reshard, prefetch)] = KnobRun(
            diff=max_diff(full, ref), gathers=gathers / num_steps,
            sent=log.wire_bytes() / num_steps, transient_peak=peak.peak, **by_hand)
    return out


def mixed_precision_zero(rank, world, cfg):
    """MixedPrecisionZero (bf16 weights and gradients, fp32 master shards) against one process
    in the same mixed precision, and against float32 training; the bytes this rank holds per
    parameter, by kind, after backward (the ZeRO paper's 2 + 2 + 12/k), and the step's peak."""
    device, num_steps, batch_size, sizes = \
        take(cfg, "device", num_steps=4, batch_size=8, sizes=None)
    batches = make_batches("mlp", num_steps, batch_size)
    low = torch.bfloat16
    ref, fp32 = (train_one_process("mlp", batches, device, num_steps, "adamw_decay", dtype, sizes,
                                   groups=False) for dtype in (low, None))
    net = make_model("mlp", **(sizes or {})).to(device).to(low)
    opt = MixedPrecisionZero(net, lr=1e-3, weight_decay=0.1)
    n = sum(p.numel() for p in net.parameters())
    for X, y in batches:
        X, y = local_batch((X, y), rank, world, device)
        with PeakBytes().skip(opt.params + [opt.master]) as peak:
            flat_cross_entropy(net(X.to(low)), y).backward()
            held = opt.held_bytes()
            opt.step()
            opt.zero_grad()
    flat, _ = all_gather_flat(opt.master.detach(), world)   # the float32 master weights
    master, offset = {}, 0
    for name, p in net.named_parameters():
        master[name] = flat[offset:offset + p.numel()].view(p.shape).to("cpu", copy=True)
        offset += p.numel()
    start = params_of(make_model("mlp", **(sizes or {})))
    return MixedZeroRun(per_param={k: v / n for k, v in held.items()}, n_params=n,
                        transient_peak=peak.peak, diff=max_diff(master, ref),
                        rel_diff=rel_diff(master, ref, start),
                        rel_precision_gap=rel_diff(fp32, ref, start))


def refusals(rank, world, cfg):
    """What each wrapper refuses, with its message (raised before any work). Every model on
    the rank's device, as a real run would have it (a refusal must not be a device error)."""
    (device,) = take(cfg, "device")
    out = {}

    def mlp():
        return make_model("mlp").to(device)

    def attempt(name, build):
        try:
            build()
            out[name] = None
        except (ValueError, TypeError, RuntimeError) as e:
            out[name] = f"{type(e).__name__}: {e}"
    attempt("fsdp: tied weights, default units",
            lambda: FSDPFromScratch(make_model("tied", d_model=16, n_layers=1,
                                               n_heads=2).to(device)))
    net = mlp()
    attempt("fsdp: units that leave parameters out", lambda: FSDPFromScratch(net, units=[net[0]]))
    attempt("fsdp: a unit not in the model",
            lambda: FSDPFromScratch(mlp(), units=[nn.Linear(3, 3, device=device)]))
    net = mlp()
    attempt("fsdp: a unit given twice", lambda: FSDPFromScratch(net, units=[net[0], net[0], net]))
    net = mlp()
    attempt("fsdp: a unit without trainable parameters",
            lambda: FSDPFromScratch(net, units=[net[1], net]))   # net[1] is a ReLU
    attempt("fsdp: int8 compute", lambda: FSDPFromScratch(mlp(), compute_dtype=torch.int8))
    z = Zero2(mlp(), torch.optim.AdamW, lr=1e-3)
    X, y = local_batch(make_batches("mlp", 1, 8)[0], rank, world, device)
    flat_cross_entropy(z(X), y).backward()
    attempt("zero2: step() before finish", z.step)
    z.finish_gradient_synchronization()
    opt = ShardedOptimizer(mlp().parameters(), torch.optim.AdamW, lr=1e-3)
    attempt("zero1: state_dict() before consolidate_state_dict()", opt.state_dict)
    # supported, not refused: a float64 model trains in float64 (shards and gradients too)
    model = FSDPFromScratch(mlp().double())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = mlp().double()
    ref_sgd = torch.optim.SGD(ref.parameters(), lr=0.1)
    X, y = make_batches("mlp", 1, 8)[0]
    flat_cross_entropy(ref(X.to(device, torch.float64)), y.to(device)).backward()
    ref_sgd.step()
    Xr, yr = local_batch((X.double(), y), rank, world, device)
    flat_cross_entropy(model(Xr), yr).backward()
    model.finish_gradient_synchronization()
    sgd.step()
    diff = max_diff(model.gather_full_params(), params_of(ref))
    out["fsdp: a float64 model"] = f"accepted: trains in float64, {diff:.1e} from one process"
    return out
