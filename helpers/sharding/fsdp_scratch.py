"""Part V: ZeRO-3 / FSDP from scratch. Each layer's parameters live as one flat shard per rank.

Just before a layer's forward its full weights are all-gathered; right after, they are freed (the
tensors autograd would keep for backward are replaced by a note saying where they were); backward
gathers them again and reduce-scatters their gradient, so each rank keeps only its shard of
parameters, gradients and optimizer state. Freed means freed at once, as torch's FSDP does it
(the storage resized to 0), not whenever the last Python reference goes: a backend's worker
thread may still hold the gathered tensor after the all-gather returned.
"""
import collections
import zlib
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils._pytree import tree_leaves

from ..devices import synced_now
from ..runtime.agree import SAME_MODEL, agree, fingerprint
from .flat import (
    all_gather_flat,
    clip_sharded_grad_norm_,
    flat_shard,
    reduce_scatter_flat,
    unit_parameters,
    validate_flat_dtypes,
)

# what a rank about to run another collective than its peers is told (torch's FSDP needs it too)
SAME_UNITS = ("every rank must run every FSDP unit, in the same order, in forward and in "
              "backward: run a unit that only some ranks need (a branch on the data) on every "
              "rank, e.g. with its output multiplied by 0 where it is not wanted; and call "
              "finish_gradient_synchronization and gather_full_params on every rank (ag k: the "
              "all-gather of unit k, rs k: the reduce-scatter of its gradient)")

__all__ = ["FSDPFromScratch", "GatherParams", "FSDPUnit"]


def _set_attr(module, dotted, value):
    *path, name = dotted.split(".")
    for p in path:
        module = getattr(module, p)
    setattr(module, name, value)


class GatherParams(torch.autograd.Function):
    """shard -> the layer's full flat weights; backward hands their gradient to the unit, which
    reduce-scatters it (the shard's gradient arrives in finish_gradient_synchronization)."""

    @staticmethod
    def forward(ctx, shard, unit):
        ctx.unit = unit
        return unit.gather(why="forward")

    @staticmethod
    def backward(ctx, grad_full):
        ctx.unit.reduce_scatter_grad(grad_full)
        return None, None


class FSDPUnit:
    """One layer (a module) and the flat shard of its trainable parameters on this rank."""

    def __init__(self, owner, module, names):
        self.owner, self.module, self.names = owner, module, names
        params = [module.get_parameter(n) for n in names]
        self.shapes = [p.shape for p in params]
        # a weight tied inside the unit is registered under several names: set them all
        aliases = {}
        for n, p in module.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(n)
        self.aliases = [aliases[id(p)] for p in params]
        self.shard = nn.Parameter(flat_shard(params, owner.rank, owner.world))
        for n in (a for names_of in self.aliases for a in names_of):
            *path, leaf = n.split(".")   # the module keeps plain attributes, set only while
            sub = module.get_submodule(".".join(path))   # they are gathered
            del sub._parameters[leaf]
            setattr(sub, leaf, None)
        self.full = self.regathered = self.prefetched = None
        self.works, self.unsharded_grad, self.saved = [], None, False

    def gather(self, async_op=False, why="forward"):
        if self.prefetched is not None:   # started earlier by another unit: wait for it
            (full, work), self.prefetched = self.prefetched, None
            self.owner.log("wait", self)
            work.wait()
            return full
        self.owner.agree_on("all-gather", self, why)
        shard = self.shard.detach()
        if self.owner.compute_dtype is not None:
            shard = shard.to(self.owner.compute_dtype)   # gathered and computed in low precision
        self.owner.log("gather", self)
        full, work = all_gather_flat(shard, self.owner.world, async_op=async_op)
        self.owner.track(full)
        if async_op:
            self.prefetched = (full, work)
        return full

    def set_views(self, full):
        offset = 0
        for names, shape in zip(self.aliases, self.shapes, strict=True):
            view = None if full is None else full[offset:offset + shape.numel()].view(shape)
            for n in names:
                _set_attr(self.module, n, view)
            offset += shape.numel()

    def pre_forward(self, module, args, kwargs):
        self.owner.forward_order(self)
        self.full = GatherParams.apply(self.shard, self)
        self.set_views(self.full)
        self.owner.log("compute", self)
        self.saved = False
        self.hooks = saved_tensors_hooks(self.pack, self.unpack)
        self.hooks.__enter__()
        self.owner.prefetch_after(self, backward=False)
        dtype = self.owner.compute_dtype
        if dtype is not None:
            def cast(a):
                return a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a
            args = tuple(cast(a) for a in args)
            kwargs = {k: cast(v) for k, v in kwargs.items()}
        return args, kwargs

    def post_forward(self, module, args, output):
        self.hooks.__exit__(None, None, None)
        self.set_views(None)
        full, self.full = self.full, None
        ptr = full.untyped_storage().data_ptr()
        if any(torch.is_tensor(o) and o.untyped_storage().data_ptr() == ptr
               for o in tree_leaves(output)):
            name = self.owner.unit_prefix[id(self)].rstrip(".") or "the model"
            raise ValueError(f"FSDP unit '{name}' returned a view of its gathered weights, "
                             "which are freed after its forward: return a copy (.clone()), or "
                             "make the module that uses the output part of the unit")
        if self.owner.reshard_after_forward or not self.saved or self.regathered is not None:
            self.owner.free(full)   # only the shard stays (also when autograd saved none of them)
        else:   # kept for backward (no second all-gather) by the unit: autograd holds notes
            self.regathered = full.detach()
        return output

    def pack(self, t):
        """A tensor autograd saves: if it is (a view of) the gathered weights, keep a note."""
        if self.full is not None and t.untyped_storage().data_ptr() == \
                self.full.untyped_storage().data_ptr():
            self.saved = True
            return ("gathered", t.shape, t.stride(), t.storage_offset())
        return t

    def unpack(self, packed):
        if isinstance(packed, tuple) and packed and packed[0] == "gathered":
            if self.regathered is None:   # first use in backward: all-gather again
                self.regathered = self.gather(why="backward")
                self.owner.prefetch_after(self, backward=True)
            return self.regathered.as_strided(*packed[1:])
        return packed

    def reduce_scatter_grad(self, grad_full):
        self.owner.free(self.regathered)   # backward of this layer is done: free the weights
        self.regathered = None
        grad = grad_full.to(self.shard.dtype)   # master gradients in the shards' dtype
        if self.unsharded_grad is not None:   # accumulated under no_sync
            grad = grad + self.unsharded_grad
            self.unsharded_grad = None
        if not self.owner.sync:
            self.unsharded_grad = grad
            return
        self.owner.agree_on("reduce-scatter", self, "backward")
        out = grad.new_empty(self.shard.numel())
        self.works.append((reduce_scatter_flat(out, grad.contiguous()), out))


class FSDPFromScratch(nn.Module):
    """Fully sharded data parallelism: `parameters()` yields this rank's flat shards (one per
    unit) and the frozen parameters (whole on every rank: they have no gradient or optimizer
    state), so an optimizer built on them holds 1/world of the state.

    After `loss.backward()` call `finish_gradient_synchronization()`, then `optimizer.step()`.
    Units: by default every module holding trainable parameters of its own; `units=` modules of
    the model (a unit inside another takes its own parameters, the outer one the rest, as with
    FSDP2); every trainable parameter must be in one, and a parameter shared by two (tied
    weights) must be in a unit holding both. `compute_dtype` (torch.bfloat16 or torch.float16)
    casts the gathered weights and the inputs of every unit; shards and their gradients keep the
    model's dtype. Gradient accumulation: several backward() calls before finish sum (one
    reduce-scatter each); under `no_sync()` full gradients accumulate and are reduced once.
    `reshard_after_forward=False` keeps the gathered weights from forward to backward (no second
    all-gather: ZeRO-2's traffic, more memory); `prefetch=True` starts the next unit's all-gather
    before the current unit computes (in forward, and in backward for the unit before).
    """

    wraps_module = True       # helpers.unwrap reaches the model as self.module

    def __init__(self, module, compute_dtype=None, units=None, reshard_after_forward=True,
                 prefetch=False):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("FSDPFromScratch needs a process group: call helpers.setup() or "
                               "dist.init_process_group(...) first")
        if compute_dtype is not None and not (isinstance(compute_dtype, torch.dtype)
                                              and compute_dtype.is_floating_point):
            raise ValueError(f"compute_dtype must be a floating dtype (torch.bfloat16, "
                             f"torch.float16) or None, got {compute_dtype!r}")
        self.rank, self.world, self.compute_dtype = dist.get_rank(), dist.get_world_size(), \
            compute_dtype
        self.reshard_after_forward, self.prefetch = bool(reshard_after_forward), bool(prefetch)
        self.live_bytes = self.peak_live_bytes = 0   # gathered (full) weights alive right now
        self._log, self.sync, self._order, self._recording = [], True, [], True
        self._checked = False                  # the first step is checked collective by collective
        self._ran = self._new_record()         # the collectives since the last finish
        groups = unit_parameters(module, units)
        for u, names in groups:
            validate_flat_dtypes([u.get_parameter(n) for n in names], "FSDPFromScratch")
        where = {id(m): name for name, m in module.named_modules()}
        agree(fingerprint(f"an FSDPFromScratch in {len(groups)} units", module,
                          [(where[id(u)], names) for u, names in groups],
                          compute_dtype, self.reshard_after_forward, self.prefetch),
              fix=SAME_MODEL + ", with the same units and settings")
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)
        self.module = module
        self.units = []
        for u, names in groups:
            unit = FSDPUnit(self, u, names)
            self.units.append(unit)
            u.register_forward_pre_hook(unit.pre_forward, with_kwargs=True)
            u.register_forward_hook(unit.post_forward)
        self.unit_prefix = {id(u): where[id(u.module)] + "." if where[id(u.module)] else ""
                            for u in self.units}
        self.flat_params = nn.ParameterList([u.shard for u in self.units])

    # ---- bookkeeping: memory, order, events ----------------------------------------------------
    def track(self, full):
        """Count the bytes of a gathered weight buffer until free(full)."""
        self.live_bytes += full.untyped_storage().nbytes()
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)

    def free(self, full):
        """Free a gathered buffer now, as torch's FSDP frees it at reshard (its storage resized
        to 0, whoever still holds the tensor), and uncount its bytes."""
        if full is not None and full.untyped_storage().nbytes():
            self.live_bytes -= full.untyped_storage().nbytes()
            full.untyped_storage().resize_(0)

    def agree_on(self, op, unit, why, always=False):
        """Every rank is about to run the same collective for the same unit: checked before
        each one in the first step and `always` (store messages, not collectives:
        runtime.agree), else refused naming each rank's; later steps agree at finish on the
        collectives they ran (a mix-up of two units of one size is refused there, before any
        gradient is used; units of other sizes: gloo aborts the rank, saying so)."""
        i = self.units.index(unit)
        token = f"{'ag' if op == 'all-gather' else 'rs'}{i}"
        self._ran["last"].append(token)
        self._ran["n"] += 1
        self._ran["crc"] = zlib.crc32(token.encode() + b" ", self._ran["crc"])
        if always or not self._checked:
            name = self.unit_prefix[id(unit)].rstrip(".") or "the model"
            agree(f"the {op} of unit {i} ('{name}', {unit.shard.numel()} elements a rank) in "
                  f"{why}", fix=SAME_UNITS)

    @staticmethod
    def _new_record():
        """What finish agrees on: how many collectives, the last of them, a checksum of all."""
        return dict(n=0, last=collections.deque(maxlen=40), crc=0)

    def log(self, what, unit):
        """Note (when, "gather" | "wait" | "compute", unit index) in this step's timeline: on a
        GPU a CUDA event in the current stream (the host only queues the work: its clock would
        say when it was queued), else the host clock."""
        device = unit.shard.device
        if device.type == "cuda":
            when = torch.cuda.Event(enable_timing=True)
            when.record()
        else:
            when = synced_now(device)
        self._log.append((when, what, self.units.index(unit)))

    @property
    def events(self):
        """The step's timeline: [(seconds, what, unit index)], seconds on the host clock, or on
        a GPU from the step's first event."""
        stamps = [t for t, _, _ in self._log if not isinstance(t, float)]
        if stamps:
            stamps[-1].synchronize()
        return [(t if isinstance(t, float) else stamps[0].elapsed_time(t) / 1e3, what, i)
                for t, what, i in self._log]

    def forward_order(self, unit):
        if self._recording and unit not in self._order:
            self._order.append(unit)

    def prefetch_after(self, unit, backward):
        """Start the all-gather of the unit that runs next (forward order, or reversed)."""
        if not self.prefetch or unit not in self._order:
            return
        i = self._order.index(unit) + (-1 if backward else 1)
        if 0 <= i < len(self._order):
            nxt = self._order[i]
            if nxt.prefetched is None and (not backward or nxt.regathered is None):
                nxt.gather(async_op=True, why="backward" if backward else "forward")

    def drop_prefetched(self):
        """Free the weights no backward will use (they would be from before the next optimizer
        step): all-gathers started for a unit that did not run, weights kept (not resharding)
        for a backward that did not come."""
        for unit in self.units:
            if unit.prefetched is not None:
                unit.prefetched[1].wait()
                self.free(unit.prefetched[0])
                unit.prefetched = None
            self.free(unit.regathered)
            unit.regathered = None

    def forward(self, *args, **kwargs):
        self.drop_prefetched()
        self._log = []
        out = self.module(*args, **kwargs)
        self._recording = False   # the first forward fixed the order prefetching follows
        if self.compute_dtype is not None and torch.is_tensor(out) and out.is_floating_point():
            out = out.float()
        return out

    # ---- gradients ---------------------------------------------------------------------------
    def set_requires_gradient_sync(self, requires):
        """False: backward keeps each unit's full gradient (accumulated) instead of reducing it
        (FSDP2's name); the first backward with True reduces the sum once."""
        self.sync = bool(requires)

    @contextmanager
    def no_sync(self):
        old, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = old

    def finish_gradient_synchronization(self):
        """Wait for the reduce-scatters: each shard's .grad is then its averaged gradient (the
        sum over every backward since the last finish; None for a unit no backward used)."""
        ran, self._ran = self._ran, self._new_record()
        agree(f"finish_gradient_synchronization after {ran['n']} collectives ("
              f"{'...' if ran['n'] > len(ran['last']) else ''}{' '.join(ran['last'])}; "
              f"checksum {ran['crc']:08x})", fix=SAME_UNITS)
        self.drop_prefetched()
        for unit in self.units:
            if unit.unsharded_grad is not None:   # only no_sync backwards ran: reduce now
                grad, unit.unsharded_grad = unit.unsharded_grad, None
                self.agree_on("reduce-scatter", unit, "finish (after no_sync)")
                out = grad.new_empty(unit.shard.numel())
                unit.works.append((reduce_scatter_flat(out, grad.contiguous()), out))
        for unit in self.units:
            if not unit.works:   # a unit this step did not use: no gradient (not a zero one,
                unit.shard.grad = None   # which AdamW would decay)
                continue
            total = None
            for work, out in unit.works:
                work.wait()
                total = out if total is None else total.add_(out)
            unit.shard.grad = total.div_(self.world)
            unit.works = []
        self._checked = True

    def clip_grad_norm_(self, max_norm):
        """Clip by the norm of the whole gradient (every rank's shards; padding holds zeros);
        returns it, as torch.nn.utils.clip_grad_norm_ does on one process."""
        return clip_sharded_grad_norm_([u.shard for u in self.units], max_norm)

    # ---- full parameters (consolidated) --------------------------------------------------------
    @torch.no_grad()
    def gather_full_params(self):
        """{name: full tensor on the CPU}, named like the wrapped module's trainable parameters
        (all ranks call), as helpers.params_of gives them: what runs are compared by."""
        full = {}
        for unit in self.units:
            self.agree_on("all-gather", unit, "gather_full_params", always=True)
            flat, _ = all_gather_flat(unit.shard.detach(), self.world)
            offset, prefix = 0, self.unit_prefix[id(unit)]
            for n, shape in zip(unit.names, unit.shapes, strict=True):
                piece = flat[offset:offset + shape.numel()].view(shape)
                full[prefix + n] = piece.to("cpu", copy=True)
                offset += shape.numel()
        return full

    @torch.no_grad()
    def load_full_params(self, full):
        """Load {name: full tensor} (as gather_full_params gives): each rank keeps its slice."""
        for unit in self.units:
            prefix = self.unit_prefix[id(unit)]
            missing = [prefix + n for n in unit.names if prefix + n not in full]
            if missing:
                raise KeyError(f"load_full_params: {missing} missing")
            unit.shard.copy_(flat_shard([full[prefix + n] for n in unit.names], self.rank,
                                        self.world))
