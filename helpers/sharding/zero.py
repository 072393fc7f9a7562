"""Part V: ZeRO from scratch. Stage 1 shards the optimizer state (`ShardedOptimizer`), stage 2
the gradients too (`Zero2`): each rank keeps and updates about 1/world of them.

Collectives go through `dist.<name>` looked up at call time, so a counting wrapper
(`helpers.count_traffic`) sees every byte these classes send.
"""
import torch
import torch.distributed as dist
from torch import nn

from ..data_parallel.scratch import make_buckets

__all__ = ["partition_by_size", "ShardedOptimizer", "Zero2", "flat_shard", "all_gather_flat",
           "optimizer_state_bytes", "padded_flat", "reduce_scatter_flat"]


def partition_by_size(sizes, world):
    """The rank that owns each of the tensors of `sizes` (numbers of elements): largest first to the
    least loaded rank, so the loads differ by at most the largest tensor. Same on every rank."""
    load, owner = [0] * world, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += sizes[i]
    return owner


def optimizer_state_bytes(optimizer):
    """Bytes of the tensors an optimizer holds as state (Adam: exp_avg and exp_avg_sq; step
    counters too, which are tiny)."""
    return sum(v.numel() * v.element_size() for s in optimizer.state.values()
               for v in s.values() if torch.is_tensor(v))


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: any torch optimizer, with its state for only this rank's share of the parameters.

    Every rank keeps full parameters and (averaged) full gradients, as in plain data parallelism;
    `step()` updates the parameters this rank owns, then each owner broadcasts its updated
    parameters so every rank holds the same weights again.
    """

    def __init__(self, params, optimizer_cls, **defaults):
        super().__init__(params, defaults)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.all_params = [p for g in self.param_groups for p in g["params"]]
        owners = partition_by_size([p.numel() for p in self.all_params], self.world)
        self.owner = {id(p): r for p, r in zip(self.all_params, owners)}
        local = [{**g, "params": [p for p in g["params"] if self.owner[id(p)] == self.rank]}
                 for g in self.param_groups]
        self._local_index = [i for i, g in enumerate(local) if g["params"]]
        local = [local[i] for i in self._local_index]
        self.local = optimizer_cls(local, **defaults) if local else None
        self.state = self.local.state if local else {}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.local is not None:
            for i, g in zip(self._local_index, self.local.param_groups):
                g.update({k: v for k, v in self.param_groups[i].items() if k != "params"})
            self.local.step()
        works = [dist.broadcast(p, src=self.owner[id(p)], async_op=True) for p in self.all_params]
        for w in works:
            w.wait()
        return loss


def flat_shard(tensors, rank, world):
    """This rank's slice of the tensors flattened into one vector, zero-padded to a multiple of
    `world` so every rank's slice has the same length."""
    return padded_flat(tensors, world).chunk(world)[rank].clone()


def padded_flat(tensors, world):
    """The tensors flattened into one new vector, zero-padded to a multiple of `world`."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
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


class Zero2(nn.Module):
    """ZeRO-2: data parallelism in which each rank keeps only its shard of the gradients and of
    the optimizer state.

    Gradients are reduce-scattered bucket by bucket as backward produces them (the full gradient of
    a bucket is freed at once); this rank's optimizer steps its flat shard of each bucket's
    parameters, and an all-gather puts the updated parameters back on every rank.
    Usage: `loss.backward(); model.finish_gradient_synchronization(); model.step()`.
    """

    def __init__(self, module, optimizer_cls, bucket_mb=None, **optim_kwargs):
        super().__init__()
        self.module = module
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)
        self.buckets = make_buckets(module.parameters(), bucket_mb)
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        # each bucket's parameters become views of one flat buffer; this rank's shard is a slice
        # of it, stepped in place, so no copy of the parameters is kept
        self.flats, self.shards = [], []
        for bucket in self.buckets:
            flat = padded_flat(bucket, self.world)
            offset = 0
            for p in bucket:
                p.data = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            self.flats.append(flat)
            self.shards.append(nn.Parameter(flat.chunk(self.world)[self.rank]))
        self.optimizer = optimizer_cls(self.shards, **optim_kwargs)
        for p in (p for b in self.buckets for p in b):
            p.register_post_accumulate_grad_hook(self._grad_ready)
        self._ready, self._pending = [0] * len(self.buckets), {}

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _grad_ready(self, param):
        i = self._bucket_of[id(param)]
        self._ready[i] += 1
        if self._ready[i] == len(self.buckets[i]):
            self._launch(i)

    def _launch(self, i):
        bucket = self.buckets[i]
        full = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in bucket])
        full = torch.cat([full, full.new_zeros(-full.numel() % self.world)])
        for p in bucket:
            p.grad = None   # the full gradient is not kept: only this rank's shard of it
        out = full.new_empty(full.numel() // self.world)
        self._pending[i] = (reduce_scatter_flat(out, full), out)

    def finish_gradient_synchronization(self):
        """Wait for the reduce-scatters; each shard's .grad is then its averaged gradient."""
        for i in range(len(self.buckets)):
            if i not in self._pending:
                self._launch(i)
        for i, (work, out) in self._pending.items():
            work.wait()
            self.shards[i].grad = out.div_(self.world)
        self._ready, self._pending = [0] * len(self.buckets), {}

    @torch.no_grad()
    def step(self):
        """Step this rank's shards, then all-gather them into every rank's full parameters."""
        self.optimizer.step()
        for flat, shard in zip(self.flats, self.shards):
            gathered, _ = all_gather_flat(shard.detach().clone(), self.world)
            flat.copy_(gathered)

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)
