"""Part V: flat shards, what ZeRO-2 and FSDP from scratch both build on. A list of tensors
becomes one vector, zero-padded so that it cuts into `world` equal slices; the slices travel by
all-gather and reduce-scatter, and clipping sums their squared norms over the ranks. FSDP's
units (`unit_parameters`) say which parameters share one flat shard.

Collectives go through `dist.<name>` looked up at call time, so a counting wrapper
(`helpers.count_traffic`) sees every byte sent.
"""
import torch
import torch.distributed as dist
from torch import nn

from ..data_parallel.allreduce import flatten
from ..runtime.agree import agree
from ..words import plural

__all__ = ["flat_shard", "padded_flat", "all_gather_flat", "reduce_scatter_flat",
           "clip_sharded_grad_norm_", "validate_flat_dtypes", "validate_groups", "unit_parameters"]


def flat_shard(tensors, rank, world):
    """This rank's slice of the tensors flattened into one vector, zero-padded to a multiple of
    `world` so every rank's slice has the same length."""
    return padded_flat(tensors, world).chunk(world)[rank].clone()


def padded_flat(tensors, world):
    """The tensors flattened into one new vector, zero-padded to a multiple of `world`."""
    flat = flatten([t.detach() for t in tensors])
    return torch.cat([flat, flat.new_zeros(-flat.numel() % world)])


def all_gather_flat(shard, world, async_op=False):
    """All-gather equal-length shards into one flat tensor (rank order); returns (flat, work).
    torch 2.14 renamed all_gather_into_tensor to all_gather_single; use whichever exists."""
    out = shard.new_empty(shard.numel() * world)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return out, gather(out, shard.contiguous(), async_op=async_op)


def reduce_scatter_flat(out, full):
    """Async reduce-scatter (sum) of `full` into `out` (its 1/world); returns the work handle.
    torch 2.14 renamed reduce_scatter_tensor to reduce_scatter_single; use whichever exists."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(out, full, async_op=True)


def clip_sharded_grad_norm_(shards, max_norm):
    """clip_grad_norm_ over gradients sharded across the ranks (each element on one rank): the
    global norm is the square root of the all-reduced sum of every rank's squared norm; every
    rank then scales its shards by the same factor. Returns the global norm."""
    grads = [s.grad for s in shards if s.grad is not None]
    device = grads[0].device if grads else shards[0].device if shards else _collective_device()
    sq = torch.zeros((), dtype=torch.float64, device=device)
    for g in grads:
        sq += g.detach().double().pow(2).sum()
    if dist.is_initialized() and dist.get_world_size() > 1:
        agree("the all-reduce of clip_grad_norm_", fix="clip on every rank, or on none")
        dist.all_reduce(sq)
    norm = sq.sqrt().float()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return norm


def _collective_device():
    """Where a rank that holds no shard (a world bigger than the model) makes the tensor it
    all-reduces: NCCL communicates CUDA tensors only (its current GPU), gloo the CPU's."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def validate_flat_dtypes(params, who):
    """Flat buffers hold one dtype: refuse a mix (torch.cat would cast silently)."""
    dtypes = {p.dtype for p in params}
    if len(dtypes) > 1:
        raise ValueError(f"{who} packs parameters into flat buffers of one dtype, but the model "
                         f"has {sorted(map(str, dtypes))}: cast it to one (e.g. model.float())")
    if dtypes and not next(iter(dtypes)).is_floating_point:
        raise ValueError(f"{who} trains floating-point parameters, got {dtypes.pop()}")


def validate_groups(param_groups, trainable, who):
    """The param groups as given (each a dict with "params"), or one group; every trainable
    parameter in exactly one group, nothing else."""
    if param_groups is None:
        return [dict(params=trainable)]
    ids = {id(p) for p in trainable}
    seen = set()
    for g in param_groups:
        if not isinstance(g, dict) or "params" not in g:
            raise TypeError(f"{who}: param_groups must be a list of dicts with \"params\" "
                            "(as torch optimizers take)")
        for p in g["params"]:
            if id(p) not in ids:
                raise ValueError(f"{who}: a parameter of param_groups is not a trainable "
                                 "parameter of the module (frozen, or of another model)")
            if id(p) in seen:
                raise ValueError(f"{who}: a parameter is in two param groups")
            seen.add(id(p))
    if seen != ids:
        left = len(ids - seen)
        raise ValueError(f"{who}: {plural(left, 'trainable parameter')} "
                         f"{'is' if left == 1 else 'are'} in no param group: put every "
                         "trainable parameter in one group")
    return [dict(g, params=list(g["params"])) for g in param_groups]


def unit_parameters(module, units):
    """[(unit module, names of the trainable parameters it shards)], checked: units of the
    model, none twice, none without parameters; every trainable parameter in exactly one."""
    inside = {id(m) for m in module.modules()}
    if units is None:   # every module holding trainable parameters of its own
        units = [m for m in module.modules()
                 if any(p.requires_grad for p in m.parameters(recurse=False))]
        own = True
    else:
        units, own = list(units), False
        for i, u in enumerate(units):
            if not isinstance(u, nn.Module) or id(u) not in inside:
                raise ValueError(f"units[{i}] ({type(u).__name__}) is not a module of the "
                                 "model: pass the model's own modules (e.g. model[0])")
            if any(u is v for v in units[:i]):
                raise ValueError(f"units[{i}] ({type(u).__name__}) is given twice")
        units = [m for m in module.modules() if any(m is u for u in units)]   # parents first
    unit_of = {}   # parameter -> the innermost unit holding it
    for u in units:   # modules() lists a parent before its children: later wins = innermost
        for n, p in u.named_parameters(recurse=not own):
            if not p.requires_grad:
                continue
            holder = unit_of.get(id(p))
            if holder is not None and not any(m is u for m in holder[0].modules()):
                raise ValueError("a parameter is shared by two units (tied weights): use "
                                 "TinyLM(tied=False) or pass units= with one unit holding both "
                                 "layers that share it")
            unit_of[id(p)] = (u, n)
    _tied_outside(module, unit_of)
    names = {id(u): [] for u in units}
    for u, n in unit_of.values():
        names[id(u)].append(n)
    for u in units:
        if not names[id(u)] and not own:
            raise ValueError(f"unit {type(u).__name__} holds no trainable parameter of its own "
                             "(all are frozen or in inner units): leave it out of units=")
    left = [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in unit_of]
    if left:
        raise ValueError(f"trainable parameters {left} are in no unit: they would train "
                         "unsynchronised. Add a unit holding them (the model itself as the "
                         "outermost unit takes every parameter not in an inner one), or "
                         "freeze them")
    order = {id(u): [n for n, _ in u.named_parameters(recurse=not own)] for u in units}
    return [(u, sorted(names[id(u)], key=order[id(u)].index)) for u in units if names[id(u)]]


def _tied_outside(module, unit_of):
    """Refuse a tied weight registered in a module outside the unit that shards it (units
    [*blocks, embed] with head.weight = embed.weight): that module would keep the whole
    parameter, never gathered from the shard nor synchronised."""
    every = list(module.named_parameters(remove_duplicate=False))
    for name, p in every:
        if not p.requires_grad or id(p) not in unit_of:
            continue
        unit = unit_of[id(p)][0]
        holder = name.rpartition(".")[0]
        if any(module.get_submodule(holder) is m for m in unit.modules()):
            continue
        names = " and ".join(n for n, q in every if q is p)
        where = next(n for n, m in module.named_modules() if m is unit) or "the model"
        raise ValueError(f"{names} are one tied weight, sharded by the unit {where} "
                         f"({type(unit).__name__}), but {holder or 'the model'} holds it "
                         "outside that unit: it would keep the whole parameter, never gathered "
                         "nor synchronised. Pass units= with one unit holding every module that "
                         "shares it (their common parent, e.g. the model), or untie the weights "
                         "(TinyLM(tied=False))")
