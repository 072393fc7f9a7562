"""Part V: ZeRO from scratch. Stage 1 shards the optimizer state (`ShardedOptimizer`), stage 2
the gradients too (`Zero2`): each rank keeps and updates about 1/world of them.

Collectives go through `dist.<name>` looked up at call time, so a counting wrapper
(`helpers.count_traffic`) sees every byte these classes send.
"""
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from ..data_parallel.scratch import make_buckets
from ..runtime.agree import SAME_MODEL, agree, fingerprint
from ..validate import validate_positive_int
from .flat import (
    all_gather_flat,
    clip_sharded_grad_norm_,
    padded_flat,
    reduce_scatter_flat,
    validate_flat_dtypes,
    validate_groups,
)

__all__ = ["partition_by_size", "ShardedOptimizer", "Zero2", "optimizer_state_bytes"]


def partition_by_size(sizes, world):
    """The rank that owns each of the tensors of `sizes` (numbers of elements): largest first to the
    least loaded rank, so the loads differ by at most the largest tensor. Same on every rank."""
    validate_positive_int(world, "world")
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
    parameters so every rank holds the same weights again. Checkpoints as torch's
    ZeroRedundancyOptimizer: `consolidate_state_dict(to=0)` on every rank, then `state_dict()` on
    rank 0 is the unsharded optimizer's; `load_state_dict` (any rank) takes such a full state
    dict and keeps its own share. Per rank: `local_state_dict()` / `load_local_state_dict()`.
    """

    def __init__(self, params, optimizer_cls, **defaults):
        if not dist.is_initialized():
            raise RuntimeError("ShardedOptimizer needs a process group: call helpers.setup() or "
                               "dist.init_process_group(...) first")
        super().__init__(params, defaults)
        # every setting of the inner optimizer (AdamW's betas, eps, ...) in our groups too, so
        # a consolidated state dict is the unsharded optimizer's, loadable by optimizer_cls
        full = optimizer_cls([torch.zeros(1, requires_grad=True)], **defaults).defaults
        self.defaults = {**full, **self.defaults}
        for g in self.param_groups:
            for k, v in full.items():
                g.setdefault(k, v)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.all_params = [p for g in self.param_groups for p in g["params"]]
        agree(fingerprint("a ShardedOptimizer", self.all_params), fix=SAME_MODEL)
        with torch.no_grad():   # every rank starts from rank 0's weights, as DDP does
            for p in self.all_params:
                dist.broadcast(p, src=0)
        owners = partition_by_size([p.numel() for p in self.all_params], self.world)
        self.owner = {id(p): r for p, r in zip(self.all_params, owners, strict=True)}
        self._index = {id(p): i for i, p in enumerate(self.all_params)}   # the unsharded index
        local = [{**g, "params": [p for p in g["params"] if self.owner[id(p)] == self.rank]}
                 for g in self.param_groups]
        self._local_index = [i for i, g in enumerate(local) if g["params"]]
        local = [local[i] for i in self._local_index]
        self._global = [self._index[id(p)] for g in local for p in g["params"]]
        self.local = optimizer_cls(local, **defaults) if local else None
        self.state = self.local.state if local else {}
        self._consolidated = None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_groups()
        if self.local is not None:
            self.local.step()
        works = [dist.broadcast(p, src=self.owner[id(p)], async_op=True) for p in self.all_params]
        for w in works:
            w.wait()
        return loss

    def _sync_groups(self):
        """The inner groups take the outer ones' settings (a scheduler changes the outer lr)."""
        local_groups = self.local.param_groups if self.local else ()   # None: no group here
        for i, g in zip(self._local_index, local_groups, strict=True):
            g.update({k: v for k, v in self.param_groups[i].items() if k != "params"})

    # ---- checkpoints ------------------------------------------------------------------------
    def local_state_dict(self):
        """This rank's share of the state, keyed by the unsharded parameter index."""
        inner = self.local.state_dict()["state"] if self.local else {}
        return dict(world=self.world, rank=self.rank,
                    state={self._global[k]: v for k, v in inner.items()})

    def load_local_state_dict(self, sd):
        """Load what local_state_dict() returned on this rank (same world size)."""
        if sd.get("world") != self.world or sd.get("rank") != self.rank:
            raise ValueError(f"a local state dict of rank {sd.get('rank')} of "
                             f"{sd.get('world')} cannot load on rank {self.rank} of {self.world}:"
                             " save a consolidated one (consolidate_state_dict, state_dict) "
                             "to resume on another number of ranks")
        self._load_local(sd["state"])

    def consolidate_state_dict(self, to=0):
        """Collect every rank's share on rank `to` (every rank calls it: a collective), as CPU
        copies: a pickled GPU tensor would unpickle onto the GPU it came from, another rank's
        (torch's ZeroRedundancyOptimizer keeps its shares on the device instead)."""
        mine = {k: {n: v.detach().cpu() if torch.is_tensor(v) else v for n, v in st.items()}
                for k, st in self.local_state_dict()["state"].items()}
        if self.world == 1:
            parts = [mine]
        else:
            parts = [None] * self.world if self.rank == to else None
            dist.gather_object(mine, parts, dst=to)
        self._consolidated = None
        if self.rank == to:
            state = {k: v for part in parts for k, v in part.items()}
            groups, start = [], 0
            for g in self.param_groups:
                n = len(g["params"])
                groups.append({**{k: v for k, v in g.items() if k != "params"},
                               "params": list(range(start, start + n))})
                start += n
            self._consolidated = dict(state=dict(sorted(state.items())), param_groups=groups)

    def state_dict(self):
        """The unsharded optimizer's state dict (on the rank consolidate_state_dict sent to)."""
        if self._consolidated is None:
            raise RuntimeError("each rank holds only its share of the optimizer state: call "
                               "consolidate_state_dict(to=0) on every rank first, then "
                               "state_dict() on rank 0 (or local_state_dict() per rank)")
        return self._consolidated

    def load_state_dict(self, state_dict):
        """Load a full (unsharded) state dict: this rank keeps its own parameters' state."""
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the state dict's param groups do not match this optimizer's: "
                             "build it over the same parameters, in the same groups")
        ids = [i for g in groups for i in g["params"]]
        for g, saved in zip(self.param_groups, groups, strict=True):
            g.update({k: v for k, v in saved.items() if k != "params"})
        self._sync_groups()
        state = state_dict["state"]
        self._load_local({i: state[ids[i]] for i in range(len(ids)) if ids[i] in state})

    def _load_local(self, state):
        if self.local is None:
            return
        inner = self.local.state_dict()
        inner["state"] = {k: {n: v.clone() if torch.is_tensor(v) else v   # not the caller's
                              for n, v in state[g].items()}                # tensors: stepping
                          for k, g in enumerate(self._global) if g in state}  # changes them
        self.local.load_state_dict(inner)
        self.state = self.local.state


class Zero2(nn.Module):
    """ZeRO-2: data parallelism in which each rank keeps only its shard of the gradients and of
    the optimizer state.

    Each bucket's parameters are views of one flat buffer cut into `world` equal slices; this
    rank owns one. Gradients are reduce-scattered bucket by bucket as backward produces them (the
    full gradient of a bucket is freed at once); the optimizer steps, in place, the pieces of
    this rank's slice that belong to each parameter (so each keeps its param group, and one that
    got no gradient on any rank is skipped, as torch skips it), and an all-gather puts the
    updated parameters back on every rank.
    Usage: `loss.backward(); model.finish_gradient_synchronization(); model.step()`.
    Gradient accumulation: several backward() calls before finish sum their gradients (each
    reduce-scatters: ZeRO-2's memory), or inside `with model.no_sync():` the full gradients
    accumulate locally and the first backward outside it reduces them once (DDP's traffic).
    """

    wraps_module = True       # helpers.unwrap reaches the model as self.module

    def __init__(self, module, optimizer_cls, bucket_mb=None, param_groups=None, **optim_kwargs):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("Zero2 needs a process group: call helpers.setup() or "
                               "dist.init_process_group(...) first")
        self.module = module
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        trainable = [p for p in module.parameters() if p.requires_grad]
        validate_flat_dtypes(trainable, "Zero2")
        groups = validate_groups(param_groups, trainable, "Zero2")
        agree(fingerprint("a Zero2", module, bucket_mb), fix=SAME_MODEL)
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)
        self.buckets = make_buckets(module.parameters(), bucket_mb)
        self.params = [p for b in self.buckets for p in b]
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        # each bucket's parameters become views of one flat buffer; this rank's shard is a slice
        # of it, and each parameter's part of the slice a piece the optimizer steps in place
        self.flats, self.shards, self.pieces = [], [], []
        for i, bucket in enumerate(self.buckets):
            flat = padded_flat(bucket, self.world)
            n = flat.numel() // self.world
            lo, offset = self.rank * n, 0
            for p in bucket:
                p.data = flat[offset:offset + p.numel()].view_as(p)
                a, b = max(offset, lo), min(offset + p.numel(), lo + n)
                if a < b:
                    self.pieces.append((p, nn.Parameter(flat[a:b]), i, a - lo, b - lo))
                offset += p.numel()
            self.flats.append(flat)
            self.shards.append(flat[lo:lo + n])
        group_of = {id(p): k for k, g in enumerate(groups) for p in g["params"]}
        self.optimizer = optimizer_cls(
            [{**{k: v for k, v in g.items() if k != "params"},
              "params": [piece for p, piece, *_ in self.pieces if group_of[id(p)] == k]}
             for k, g in enumerate(groups)], **optim_kwargs)
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)
        self.shard_grads = [None] * len(self.buckets)
        self._sync, self._used, self._steps = True, set(), 0
        self._pending = {i: [] for i in range(len(self.buckets))}
        self._reset_backward()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # ---- backward: reduce-scatter each bucket once per backward, in bucket order ------------
    def _reset_backward(self):
        self._got, self._next, self._queued = [0] * len(self.buckets), 0, False

    def _grad_ready(self, param):
        if not self._queued:   # once per backward: finish it when autograd is done
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._queued = True
        self._used.add(id(param))
        self._got[self._bucket_of[id(param)]] += 1
        # launch in bucket order only, so every rank pairs the same reduce-scatters
        while self._sync and self._next < len(self.buckets) and \
                self._got[self._next] == len(self.buckets[self._next]):
            self._launch(self._next)
            self._next += 1

    def _end_of_backward(self):
        if self._sync:   # buckets with parameters this backward did not reach
            for i in range(self._next, len(self.buckets)):
                self._launch(i)
        self._reset_backward()

    def _launch(self, i):
        bucket = self.buckets[i]
        full = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in bucket])
        full = torch.cat([full, full.new_zeros(-full.numel() % self.world)])
        for p in bucket:
            p.grad = None   # the full gradient is not kept: only this rank's shard of it
        out = full.new_empty(full.numel() // self.world)
        self._pending[i].append((reduce_scatter_flat(out, full), out))

    def set_requires_gradient_sync(self, requires):
        """False: backward keeps full gradients locally (accumulated) instead of reducing them
        (FSDP2's name for DDP's no_sync)."""
        self._sync = bool(requires)

    @contextmanager
    def no_sync(self):
        """Accumulate full gradients locally; the next backward outside reduces them once."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def finish_gradient_synchronization(self):
        """Wait for the reduce-scatters; each parameter's piece then holds its averaged gradient
        (None where no rank produced one)."""
        agree(f"finish after step() {self._steps}, {[len(w) for w in self._pending.values()]}"
              " reduce-scatters per bucket", fix="run the same backwards on every rank")
        if not any(self._pending.values()):   # e.g. every backward ran under no_sync
            for i in range(len(self.buckets)):
                self._launch(i)
        used = torch.tensor([float(id(p) in self._used) for p in self.params],
                            device=self.flats[0].device)
        if self.world > 1:
            dist.all_reduce(used)
        used = {id(p) for p, u in zip(self.params, used, strict=True) if u > 0}
        for i, works in self._pending.items():
            total = None
            for work, out in works:
                work.wait()
                total = out if total is None else total.add_(out)
            self.shard_grads[i] = total.div_(self.world)
        for p, piece, i, a, b in self.pieces:
            piece.grad = self.shard_grads[i][a:b] if id(p) in used else None
        self._pending = {i: [] for i in range(len(self.buckets))}
        self._used = set()

    def clip_grad_norm_(self, max_norm):
        """Clip by the norm of the whole (averaged) gradient: the squared norms of every rank's
        pieces, summed by an all-reduce; returns that norm (as torch.nn.utils.clip_grad_norm_)."""
        return clip_sharded_grad_norm_([piece for _, piece, *_ in self.pieces], max_norm)

    @torch.no_grad()
    def step(self):
        """Step this rank's shards, then all-gather them into every rank's full parameters."""
        if any(self._pending.values()) or any(p.grad is not None for p in self.params):
            raise RuntimeError("gradients are still being reduced: call "
                               "finish_gradient_synchronization() after the last backward, "
                               "before step()")
        self._steps += 1   # a step() some ranks skip: refused at the next finish
        self.optimizer.step()
        for flat, shard in zip(self.flats, self.shards, strict=True):
            gathered, _ = all_gather_flat(shard.clone(), self.world)
            flat.copy_(gathered)

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self.shard_grads = [None] * len(self.buckets)
        for p in self.params:
            p.grad = None
