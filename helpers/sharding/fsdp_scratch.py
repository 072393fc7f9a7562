"""Part V: ZeRO-3 / FSDP from scratch. Each layer's parameters live as one flat shard per rank.

Just before a layer's forward its full weights are all-gathered; right after, they are freed (the
tensors autograd would keep for backward are replaced by a note saying where they were); backward
gathers them again and reduce-scatters their gradient, so each rank keeps only its shard of
parameters, gradients and optimizer state.
"""
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from .zero import all_gather_flat, flat_shard, reduce_scatter_flat

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
        return unit.gather()

    @staticmethod
    def backward(ctx, grad_full):
        ctx.unit.reduce_scatter_grad(grad_full)
        return None, None


class FSDPUnit:
    """One layer (a module) and the flat shard of its parameters on this rank."""

    def __init__(self, owner, module, names):
        self.owner, self.module, self.names = owner, module, names
        params = [module.get_parameter(n) for n in names]
        self.shapes = [p.shape for p in params]
        self.shard = nn.Parameter(flat_shard(params, owner.rank, owner.world))
        for n in names:   # the module keeps plain attributes, set only while they are gathered
            *path, leaf = n.split(".")
            sub = module.get_submodule(".".join(path))
            del sub._parameters[leaf]
            setattr(sub, leaf, None)
        self.full = self.regathered = self.work = None

    def gather(self):
        shard = self.shard.detach()
        if self.owner.compute_dtype is not None:
            shard = shard.to(self.owner.compute_dtype)   # gathered and computed in low precision
        full, _ = all_gather_flat(shard, self.owner.world)
        self.owner.track(full)
        return full

    def set_views(self, full):
        offset = 0
        for n, shape in zip(self.names, self.shapes):
            _set_attr(self.module, n, full[offset:offset + shape.numel()].view(shape))
            offset += shape.numel()

    def pre_forward(self, module, args):
        self.full = GatherParams.apply(self.shard, self)
        self.set_views(self.full)
        self.hooks = saved_tensors_hooks(self.pack, self.unpack)
        self.hooks.__enter__()
        dtype = self.owner.compute_dtype
        if dtype is not None:
            args = tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a
                         for a in args)
        return args

    def post_forward(self, module, args, output):
        self.hooks.__exit__(None, None, None)
        for n in self.names:   # free the gathered weights: only the shard stays
            _set_attr(self.module, n, None)
        self.full = None
        return output

    def pack(self, t):
        """A tensor autograd saves: if it is (a view of) the gathered weights, keep a note."""
        if self.full is not None and t.untyped_storage().data_ptr() == \
                self.full.untyped_storage().data_ptr():
            return ("gathered", t.shape, t.stride(), t.storage_offset())
        return t

    def unpack(self, packed):
        if isinstance(packed, tuple) and packed and packed[0] == "gathered":
            if self.regathered is None:   # first use in backward: all-gather again
                self.regathered = self.gather()
            return self.regathered.as_strided(*packed[1:])
        return packed

    def reduce_scatter_grad(self, grad_full):
        self.regathered = None   # backward of this layer is done: free the weights again
        grad = grad_full.float().contiguous()   # master gradients are fp32
        out = grad.new_empty(self.shard.numel())
        self.work = (reduce_scatter_flat(out, grad), out)


class FSDPFromScratch(nn.Module):
    """Fully sharded data parallelism: `parameters()` yields only this rank's flat shards (one
    per layer), so an optimizer built on them holds 1/world of the state.

    After `loss.backward()` call `finish_gradient_synchronization()`, then `optimizer.step()`.
    `compute_dtype` (torch.bfloat16 or torch.float16) casts the gathered weights and the inputs of
    every layer; the shards and their gradients stay float32. Parameters shared between layers
    (tied weights) are not supported: put the layers that share them in one unit.
    """

    def __init__(self, module, compute_dtype=None, units=None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("FSDPFromScratch needs a process group: call helpers.setup() or "
                               "dist.init_process_group(...) first")
        self.rank, self.world, self.compute_dtype = dist.get_rank(), dist.get_world_size(), \
            compute_dtype
        self.live_bytes = self.peak_live_bytes = 0   # gathered (full) weights alive right now
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)
        own = units is None   # default: every module holding parameters of its own is a layer
        if own:
            units = [m for m in module.modules() if any(True for _ in m.parameters(recurse=False))]
        owners = {}
        for u in units:
            for n, p in u.named_parameters(recurse=not own):
                if id(p) in owners:
                    raise ValueError("a parameter is shared by two units (tied weights): use "
                                     "TinyLM(tied=False) or pass units= that keep them together")
                owners[id(p)] = u
        self.module = module
        self.units = []
        for u in units:
            unit = FSDPUnit(self, u, [n for n, _ in u.named_parameters(recurse=not own)])
            self.units.append(unit)
            u.register_forward_pre_hook(unit.pre_forward)
            u.register_forward_hook(unit.post_forward)
        where = {id(m): name for name, m in module.named_modules()}
        self.unit_prefix = {id(u): where[id(u.module)] + "." if where[id(u.module)] else ""
                            for u in self.units}
        self.flat_params = nn.ParameterList([u.shard for u in self.units])

    def track(self, full):
        """Count the bytes of a gathered weight buffer until it is freed."""
        n = full.numel() * full.element_size()
        self.live_bytes += n
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        weakref.finalize(full, self._freed, n)

    def _freed(self, n):
        self.live_bytes -= n

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        if self.compute_dtype is not None and torch.is_tensor(out) and out.is_floating_point():
            out = out.float()
        return out

    def finish_gradient_synchronization(self):
        """Wait for the reduce-scatters: each shard's .grad is then its averaged gradient."""
        for unit in self.units:
            if unit.work is None:   # a layer this step did not use
                unit.shard.grad = torch.zeros_like(unit.shard)
                continue
            work, out = unit.work
            work.wait()
            unit.shard.grad = out.div_(self.world)
            unit.work = None

    @torch.no_grad()
    def gather_full_params(self):
        """{name: full fp32 tensor}, named like the wrapped module's parameters (all ranks call)."""
        full = {}
        for unit in self.units:
            flat, _ = all_gather_flat(unit.shard.detach(), self.world)
            offset, prefix = 0, self.unit_prefix[id(unit)]
            for n, shape in zip(unit.names, unit.shapes):
                full[prefix + n] = flat[offset:offset + shape.numel()].view(shape).clone()
                offset += shape.numel()
        return full
