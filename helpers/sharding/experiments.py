"""Part V's sharding experiments across processes, each a launch target fn(rank, world, cfg)
(helpers.launch, or several in one launch with helpers.run_ranks). Each compares the sharded run
with one process trained on the combined batch (computed on every rank, from the same seeds)
and returns numbers, never booleans, in a frozen dataclass of results.py: ZeRO-1 and ZeRO-2
against torch's ZeroRedundancyOptimizer and one process, FSDP by hand and FSDP2, a sharded
checkpoint saved on one world size and loaded on another, and the memory each stage holds per
rank.
"""
import torch

from ..compare import max_diff, rel_diff
from ..data_parallel.scratch import DDPFromScratch
from ..models import unwrap
from ..one_process import (
    adamw_groups,
    flat_cross_entropy,
    local_batch,
    params_of,
    plain_optimizer,
    train_one_process,
)
from ..runtime.files import atomic_save
from ..runtime.launch import take
from ..runtime.traffic import count_traffic
from ..tiny_models import make_batches, make_model
from .fsdp_scratch import FSDPFromScratch
from .memory import PeakBytes
from .results import (
    DcpRun,
    Fsdp2Run,
    FsdpRun,
    OptimizerRun,
    StageMemory,
    Zero1CheckpointRun,
    Zero1Run,
    Zero2Run,
)
from .torch_api import fsdp2_model, full_params
from .zero import ShardedOptimizer, Zero2, optimizer_state_bytes

__all__ = ["zero1_vs_one_process", "zero2_vs_one_process", "fsdp_scratch_vs_one_process",
           "fsdp2_vs_one_process", "dcp_save_sharded", "dcp_load_resharded", "memory_per_stage",
           "zero1_checkpoint", "full_optimizer_state", "train_step", "held_bytes"]


def zero1_vs_one_process(rank, world, cfg):
    """ShardedOptimizer(AdamW or SGD with momentum, two param groups) and torch's
    ZeroRedundancyOptimizer against the unsharded optimizer; and the state each rank holds."""
    device, num_steps, batch_size, sizes, optim = \
        take(cfg, "device", num_steps=5, batch_size=8, sizes=None, optim="adamw")
    from torch.distributed.optim import ZeroRedundancyOptimizer
    batches = make_batches("mlp", num_steps, batch_size)
    ref = train_one_process("mlp", batches, device, num_steps, sizes=sizes, optim=optim + "_groups")
    cls = torch.optim.AdamW if optim == "adamw" else torch.optim.SGD
    res, trained = {}, {}
    for impl in ("scratch", "torch"):
        model = DDPFromScratch(make_model("mlp", **(sizes or {})).to(device))
        groups, kw = adamw_groups(unwrap(model))
        if optim == "sgd":
            kw = dict(lr=0.05, momentum=0.9)
        if impl == "scratch":
            opt = ShardedOptimizer(groups, cls, **kw)
        else:
            opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=cls,
                                          weight_decay=groups[0]["weight_decay"], **kw)
            opt.add_param_group(groups[1])
        for batch in batches:
            train_step(model, opt, batch, rank, world, device, finish=True)
        state = optimizer_state_bytes(opt.local) if impl == "scratch" and opt.local else \
            optimizer_state_bytes(opt.optim) if impl == "torch" else 0
        res[impl] = OptimizerRun(diff=max_diff(params_of(unwrap(model)), ref), state_bytes=state)
        trained[impl] = params_of(unwrap(model))
    return Zero1Run(scratch=res["scratch"], torch=res["torch"],
                    scratch_vs_torch=max_diff(trained["scratch"], trained["torch"]),
                    param_bytes=sum(p.numel() * 4 for p in unwrap(model).parameters()),
                    largest=max(p.numel() for p in unwrap(model).parameters()))


def zero2_vs_one_process(rank, world, cfg):
    """Zero2 (AdamW, weight decay on every parameter) against one process."""
    device, num_steps, batch_size, bucket_mb, sizes = \
        take(cfg, "device", num_steps=5, batch_size=8, bucket_mb=None, sizes=None)
    batches = make_batches("mlp", num_steps, batch_size)
    ref_model = make_model("mlp", **(sizes or {})).to(device)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-3, weight_decay=0.1)
    for X, y in batches:
        flat_cross_entropy(ref_model(X.to(device)), y.to(device)).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    model = Zero2(make_model("mlp", **(sizes or {})).to(device), torch.optim.AdamW,
                  bucket_mb=bucket_mb, lr=1e-3, weight_decay=0.1)
    for batch in batches:
        X, y = local_batch(batch, rank, world, device)
        flat_cross_entropy(model(X), y).backward()
        model.finish_gradient_synchronization()
        grad_bytes = held_bytes(model.shard_grads) + sum(   # Zero2 keeps only its shard
            p.grad.numel() * 4 for p in unwrap(model).parameters() if p.grad is not None)
        model.step()
        model.zero_grad()
    return Zero2Run(diff=max_diff(params_of(unwrap(model)), params_of(ref_model)),
                    grad_bytes=grad_bytes, state_bytes=optimizer_state_bytes(model.optimizer))


def fsdp_scratch_vs_one_process(rank, world, cfg):
    """FSDPFromScratch against one process (fp32, or low precision against a one-process run
    with the same low-precision compute); also the fp32 run, to size the precision's own effect."""
    device, kind, compute_dtype, num_steps, batch_size, sizes, optim = \
        take(cfg, "device", kind="lm", compute_dtype=None, num_steps=4, batch_size=8, sizes=None,
             optim="adamw")
    dtype = getattr(torch, compute_dtype) if compute_dtype else None
    batches = make_batches(kind, num_steps, batch_size)
    model = FSDPFromScratch(make_model(kind, seed=rank, **(sizes or {})).to(device),
                            compute_dtype=dtype)
    opt = plain_optimizer(model.parameters(), optim)
    losses = []
    for batch in batches:
        X, y = local_batch(batch, rank, world, device)
        loss = flat_cross_entropy(model(X), y)
        loss.backward()
        model.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    full = model.gather_full_params()
    ref = train_one_process(kind, batches, device, num_steps, optim, dtype, sizes, groups=False)
    start = params_of(make_model(kind, **(sizes or {})))
    gaps = {}
    if dtype is not None:
        fp32 = train_one_process(kind, batches, device, num_steps, optim, None, sizes, groups=False)
        gaps = dict(precision_gap=max_diff(fp32, ref), rel_precision_gap=rel_diff(fp32, ref, start))
    return FsdpRun(diff=max_diff(full, ref), rel_diff=rel_diff(full, ref, start),
                   shard_bytes=sum(p.numel() * 4 for p in model.parameters()),
                   full_bytes=sum(t.numel() * 4 for t in full.values()),
                   state_bytes=optimizer_state_bytes(opt),
                   peak_gathered_bytes=model.peak_live_bytes, losses=tuple(losses), **gaps)


def fsdp2_vs_one_process(rank, world, cfg):
    """fully_shard per layer against one process and against FSDPFromScratch (same dtype)."""
    device, kind, compute_dtype, num_steps, batch_size, sizes = \
        take(cfg, "device", kind="mlp", compute_dtype=None, num_steps=4, batch_size=8, sizes=None)
    dtype = getattr(torch, compute_dtype) if compute_dtype else None
    batches = make_batches(kind, num_steps, batch_size)
    runs = {}
    for impl in ("fsdp2", "scratch"):
        if impl == "fsdp2":
            model = fsdp2_model(kind, world, device, dtype, sizes=sizes)
        else:
            model = FSDPFromScratch(make_model(kind, **(sizes or {})).to(device),
                                    compute_dtype=dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        with count_traffic() as log:
            for batch in batches:
                train_step(model, opt, batch, rank, world, device, finish=impl == "scratch")
        if impl == "fsdp2":
            local_bytes = sum(p.to_local().numel() * 4 for p in model.parameters())
            runs[impl] = full_params(model)
        else:
            runs[impl] = model.gather_full_params()
        runs[impl + "_sent"] = log.wire_bytes() / num_steps
    ref = train_one_process(kind, batches, device, num_steps, compute_dtype=dtype, sizes=sizes,
                            groups=False)
    return Fsdp2Run(diff=max_diff(runs["fsdp2"], ref),
                    diff_scratch=max_diff(runs["fsdp2"], runs["scratch"]),
                    local_bytes=local_bytes, full_bytes=sum(t.numel() * 4 for t in ref.values()),
                    sent_fsdp2=runs["fsdp2_sent"], sent_scratch=runs["scratch_sent"])


def dcp_save_sharded(rank, world, cfg):
    """Train a fully_shard model and its AdamW a little; save both with
    torch.distributed.checkpoint (each rank writes only its shards); then train one step more.
    Returns the full parameters and optimizer state at the save, and after that step."""
    device, path, kind, num_steps, batch_size, sizes = \
        take(cfg, "device", "path", kind="mlp", num_steps=2, batch_size=12, sizes=None)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model = fsdp2_model(kind, world, device, sizes=sizes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = make_batches(kind, num_steps + 1, batch_size)
    for batch in batches[:num_steps]:
        train_step(model, opt, batch, rank, world, device)
    model_sd, optim_sd = get_state_dict(model, opt)      # DTensor shards, named by parameter
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    saved = dict(full=full_params(model), optim=full_optimizer_state(model, opt),
                 local_bytes=sum(p.to_local().numel() * 4 for p in model.parameters()))
    train_step(model, opt, batches[num_steps], rank, world, device)
    return DcpRun(**saved, after=full_params(model))


def dcp_load_resharded(rank, world, cfg):
    """A fresh fully_shard model and AdamW on `world` ranks (any number) load the checkpoint,
    model and optimizer state, and train the step the saving run trained after saving."""
    device, path, kind, num_steps, batch_size, sizes = \
        take(cfg, "device", "path", kind="mlp", num_steps=2, batch_size=12, sizes=None)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model = fsdp2_model(kind, world, device, seed=123, sizes=sizes)   # other init: load must win
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model_sd, optim_sd = get_state_dict(model, opt)      # this world's shards, to load into
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)                  # each rank reads the slices it needs
    set_state_dict(model, opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    loaded = dict(full=full_params(model), optim=full_optimizer_state(model, opt),
                  local_bytes=sum(p.to_local().numel() * 4 for p in model.parameters()))
    batch = make_batches(kind, num_steps + 1, batch_size)[num_steps]
    train_step(model, opt, batch, rank, world, device)
    return DcpRun(**loaded, after=full_params(model))


def train_step(model, opt, batch, rank, world, device, finish=False):
    """One step on this rank's slice of `batch`. `finish`: a wrapper built by hand, which
    reduces the gradients in finish_gradient_synchronization() (torch's wrappers in backward)."""
    X, y = local_batch(batch, rank, world, device)
    flat_cross_entropy(model(X), y).backward()
    if finish:
        model.finish_gradient_synchronization()
    opt.step()
    opt.zero_grad()


def full_optimizer_state(model, opt):
    """{parameter name + "." + state key: full tensor} of a fully_shard model's optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    sd = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    return {f"{n}.{k}": (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu()
            for n, st in sd["state"].items() for k, v in st.items() if torch.is_tensor(v)}


def zero1_checkpoint(rank, world, cfg):
    """ShardedOptimizer (AdamW) saved mid-run the way torch's ZeroRedundancyOptimizer is (the
    shards consolidated on rank 0 into the unsharded optimizer's state dict), loaded into a fresh
    one and into plain AdamW on one process; each run on, against the uninterrupted run."""
    device, path, num_steps, batch_size = \
        take(cfg, "device", "path", num_steps=4, batch_size=8)
    import torch.distributed as dist
    batches = make_batches("mlp", num_steps, batch_size)
    half = num_steps // 2

    def run(model, opt, part):
        for batch in part:
            train_step(model, opt, batch, rank, world, device, finish=True)
    model = DDPFromScratch(make_model("mlp").to(device))
    opt = ShardedOptimizer(unwrap(model).parameters(), torch.optim.AdamW, lr=1e-3)
    run(model, opt, batches[:half])
    opt.consolidate_state_dict(to=0)
    if rank == 0:
        weights = {k: v.cpu() for k, v in unwrap(model).state_dict().items()}   # any rank
        atomic_save(dict(model=weights, optim=opt.state_dict()), path)        # can load it
    dist.barrier()
    run(model, opt, batches[half:])
    sd = torch.load(path, map_location="cpu", weights_only=False)   # rank 0 saved it
    fresh = DDPFromScratch(make_model("mlp", seed=9).to(device))
    unwrap(fresh).load_state_dict(sd["model"])
    opt2 = ShardedOptimizer(unwrap(fresh).parameters(), torch.optim.AdamW, lr=1e-3)
    opt2.load_state_dict(sd["optim"])
    entries = len(opt2.local.state) if opt2.local else 0
    run(fresh, opt2, batches[half:])
    plain = make_model("mlp").to(device)   # the consolidated state dict is plain AdamW's
    plain.load_state_dict(sd["model"])
    popt = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    popt.load_state_dict(sd["optim"])
    for X, y in batches[half:]:
        flat_cross_entropy(plain(X.to(device)), y.to(device)).backward()
        popt.step()
        popt.zero_grad()
    return Zero1CheckpointRun(
        resumed_diff=max_diff(params_of(unwrap(fresh)), params_of(unwrap(model))),
        plain_diff=max_diff(params_of(plain), params_of(unwrap(model))), entries_after_load=entries,
        owned=sum(1 for p in opt.all_params if opt.owner[id(p)] == rank),
        saved_entries=len(sd["optim"]["state"]))


def held_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def memory_per_stage(rank, world, cfg):
    """Per stage: bytes of parameters, gradients and optimizer state this rank holds (gradients
    after finish, before the step), the bytes it sent during the step, and the PEAK during the
    step (forward, backward, finish, step), measured: parameters and optimizer state plus the
    most bytes of storages created during the step alive at once (activations, gradients,
    gathered weights, communication buffers; PeakBytes); on a GPU also
    torch.cuda.max_memory_allocated."""
    device, sizes, stages, batch_size = \
        take(cfg, "device", sizes=None, stages=("dp", "zero1", "zero2", "zero3"), batch_size=16)
    X, y = local_batch(make_batches("mlp", 1, batch_size, **(sizes or {}))[0],
                       rank, world, device)
    out = {}
    for stage in stages:
        net = make_model("mlp", **(sizes or {})).to(device)
        n_params = sum(p.numel() for p in net.parameters())
        if stage in ("dp", "zero1"):
            model = DDPFromScratch(net)
            opt = (torch.optim.AdamW(net.parameters(), lr=1e-3) if stage == "dp" else
                   ShardedOptimizer(net.parameters(), torch.optim.AdamW, lr=1e-3))
        elif stage == "zero2":
            model = Zero2(net, torch.optim.AdamW, lr=1e-3)
            opt = model
        else:
            model = FSDPFromScratch(net)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        local_opt = opt.local if stage == "zero1" else opt.optimizer if stage == "zero2" else opt
        held = list(model.parameters()) + list(net.parameters())
        for _ in range(2):   # the first step creates the optimizer state
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
            state = [v for s in (local_opt.state.values() if local_opt else ())
                     for v in s.values() if torch.is_tensor(v)]
            with count_traffic() as log, PeakBytes().skip(held + state) as peak:
                flat_cross_entropy(model(X), y).backward()
                model.finish_gradient_synchronization()
                if stage in ("zero2", "zero3"):
                    grads = held_bytes(p.grad for p in model.parameters()) if stage == "zero3" \
                        else held_bytes(model.shard_grads)
                else:
                    grads = held_bytes(p.grad for p in net.parameters())
                opt.step()
                opt.zero_grad()
            cuda = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        params = (held_bytes(model.parameters()) if stage == "zero3"
                  else held_bytes(net.parameters()))
        optim = optimizer_state_bytes(local_opt) if local_opt else 0
        out[stage] = StageMemory(n_params=n_params, params_bytes=params, grads_bytes=grads,
                                 optim_bytes=optim, sent_bytes=log.wire_bytes(),
                                 calls=log.ops(), transient_peak=peak.peak,
                                 peak_bytes=params + optim + peak.peak, cuda_peak=cuda)
    return out
