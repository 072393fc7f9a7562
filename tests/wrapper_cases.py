"""The cases of the wrappers' property test (tests/test_wrappers_property.py), and how each wrapper
trains one: a case is a plain dict (it travels to the ranks), a model built from it, its data, the
one-process run every wrapper must equal (those three: tests/wrapper_nets.py), and per wrapper a
class saying how to build it, run a micro-batch, step, save, load, read the full parameters, and
what it refuses.

A case:
    seed, d_in, width, d_out        a stem Linear(d_in, width), blocks of width x width, a head
    blocks                          kinds, in order: "plain", "frozen" (requires_grad False),
                                    "reused" (called twice in one forward), "tied" (two layers
                                    sharing one weight), "unused" (never called)
    world, batch                    ranks; rows per rank per micro-batch
    accum, num_steps                micro-batches per step (backward each), optimizer steps
    optim, groups                   "sgd", "momentum" or "adamw"; groups: weight decay on
                                    matrices only (two param groups) instead of one group
    resume_at                       None, or the step before which every rank saves, builds a
                                    fresh model (another init) and loads
Ranks other than 0 build their model from another seed: each wrapper must start from rank 0's
weights (broadcast), as the one-process run does.

Adding a wrapper: a class with the methods of `Wrapper`, registered in WRAPPERS under its name;
the property test runs every registered name on every drawn case.
"""
import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn
from wrapper_nets import (
    TiedPair,
    build_net,
    case_data,
    loss_of,
    make_optimizer,
    one_process,
    optimizer_cls,
    param_groups,
)

import helpers
from helpers.one_process import params_of

__all__ = ["WRAPPERS", "Wrapper", "build_net", "case_data", "one_process", "train_case"]


# ---- one wrapper on one case -------------------------------------------------------------------
class Wrapper:
    """How the property test drives one wrapper. Override what differs."""

    tol = 2e-5          # max |difference| to one process allowed (float32 rounding)

    def adapt(self, case):
        """The case as this wrapper runs it (e.g. one param group where it supports only one)."""
        return case

    def refuses(self, case):
        """None, or a regular expression the wrapper's refusal (at build) must match."""
        return None

    def skip(self, case):
        """None, or why this (torch) counterpart cannot run the case: it is then not compared."""
        return None

    def build(self, case, net):
        raise NotImplementedError

    def micro(self, obj, X, y, case):
        loss_of(obj["model"](X), y, case["accum"]).backward()

    def step(self, obj):
        obj["opt"].step()
        obj["opt"].zero_grad()

    def save(self, obj, path, rank):
        raise NotImplementedError(f"{type(self).__name__} cannot save yet")

    def load(self, obj, path, rank):
        raise NotImplementedError(f"{type(self).__name__} cannot load yet")

    def params(self, obj):
        """{name: full tensor} named like PropNet's parameters (all ranks call)."""
        return params_of(obj["net"])


class Refused(RuntimeError):
    """The wrapper refused the case when it was built (before any work)."""


def train_case(rank, world, cfg):
    """Launch target: train cfg["case"] with WRAPPERS[cfg["wrapper"]]; the full parameters."""
    case, wrapper, folder = cfg["case"], WRAPPERS[cfg["wrapper"]], cfg["dir"]
    case = wrapper.adapt(case)
    X, y = case_data(case)
    rows = slice(rank * case["batch"], (rank + 1) * case["batch"])

    def build(seed):
        try:
            return wrapper.build(case, build_net(case, seed))
        except (ValueError, TypeError, RuntimeError, NotImplementedError) as e:
            raise Refused(f"refused at build: {type(e).__name__}: {e}") from e
    obj = build(case["seed"] + 1000 * rank)
    for s in range(case["num_steps"]):
        if s == case["resume_at"]:
            path = os.path.join(folder, f"ckpt-{cfg['wrapper']}")
            wrapper.save(obj, path, rank)
            dist.barrier()
            obj = build(case["seed"] + 7 + 1000 * rank)   # another init: the load must win
            wrapper.load(obj, path, rank)
        for m in range(case["accum"]):
            wrapper.micro(obj, X[s, m, rows], y[s, m, rows], case)
        wrapper.step(obj)
    return wrapper.params(obj)


def broadcast_module(net):
    with torch.no_grad():
        for t in [*net.parameters(), *net.buffers()]:
            dist.broadcast(t, src=0)


def average_gradients(params):
    """Data parallelism's gradient average, done plainly (the harness's, not under test): a
    parameter no rank used keeps grad None, as in one process."""
    params = list(params)
    used = torch.tensor([float(p.grad is not None) for p in params])
    dist.all_reduce(used)
    for p, u in zip(params, used):
        if u == 0:
            continue
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(g)
        p.grad = g / dist.get_world_size()


# ---- the wrappers ------------------------------------------------------------------------------
class Zero1Scratch(Wrapper):
    """helpers.ShardedOptimizer over plainly averaged gradients; checkpoint consolidated on
    rank 0 (state_dict after consolidate_state_dict), loaded by every rank."""

    def build(self, case, net):
        broadcast_module(net)   # data parallelism's start (DDP's job, not ZeRO-1's)
        cls, kw = optimizer_cls(case)
        opt = helpers.ShardedOptimizer(param_groups(case, net.named_parameters()), cls, **kw)
        return dict(net=net, model=net, opt=opt)

    def step(self, obj):
        average_gradients(p for p in obj["net"].parameters() if p.requires_grad)
        obj["opt"].step()
        obj["opt"].zero_grad()

    def save(self, obj, path, rank):
        obj["opt"].consolidate_state_dict(to=0)
        if rank == 0:
            torch.save(dict(model=obj["net"].state_dict(), opt=obj["opt"].state_dict()), path)

    def load(self, obj, path, rank):
        sd = torch.load(path, weights_only=False)
        obj["net"].load_state_dict(sd["model"])
        obj["opt"].load_state_dict(sd["opt"])


class Zero1Torch(Zero1Scratch):
    """torch's ZeroRedundancyOptimizer, the same way."""

    def build(self, case, net):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        broadcast_module(net)
        cls, kw = optimizer_cls(case)
        groups = param_groups(case, net.named_parameters())
        first = {k: v for k, v in groups[0].items() if k != "params"}
        opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=cls, **{**kw, **first})
        for g in groups[1:]:
            opt.add_param_group(g)
        return dict(net=net, model=net, opt=opt)


class Zero2Scratch(Wrapper):
    """helpers.Zero2 (its own param groups); checkpoint per rank (module and optimizer)."""

    def build(self, case, net):
        cls, kw = optimizer_cls(case)
        model = helpers.Zero2(net, cls, param_groups=param_groups(case, net.named_parameters()),
                              **kw)
        return dict(net=net, model=model, opt=model)

    def step(self, obj):
        obj["model"].finish_gradient_synchronization()
        obj["model"].step()
        obj["model"].zero_grad()

    def save(self, obj, path, rank):
        torch.save(dict(model=obj["model"].state_dict(),
                        opt=obj["model"].optimizer.state_dict()), f"{path}.{rank}")

    def load(self, obj, path, rank):
        sd = torch.load(f"{path}.{rank}", weights_only=False)
        obj["model"].load_state_dict(sd["model"])
        obj["model"].optimizer.load_state_dict(sd["opt"])


def fsdp_units(net):
    """The units FSDP wraps: each trainable layer, a tied pair as one unit (it shares a
    weight), frozen layers in none (they stay whole)."""
    pairs = [m for m in net.modules() if isinstance(m, TiedPair)]
    inner = {id(m) for p in pairs for m in p.modules()}
    return pairs + [m for m in net.modules() if isinstance(m, nn.Linear) and id(m) not in inner
                    and any(q.requires_grad for q in m.parameters())]


class FSDPScratch(Wrapper):
    """helpers.FSDPFromScratch with those units; checkpoint per rank (shards and optimizer)."""

    def adapt(self, case):   # flat shards per unit: one param group
        return dict(case, groups=False)

    def build(self, case, net):
        model = helpers.FSDPFromScratch(net, units=fsdp_units(net))
        opt = make_optimizer(case, model.named_parameters())
        return dict(net=net, model=model, opt=opt)

    def step(self, obj):
        obj["model"].finish_gradient_synchronization()
        obj["opt"].step()
        obj["opt"].zero_grad()

    def save(self, obj, path, rank):
        torch.save(dict(model=obj["model"].state_dict(), opt=obj["opt"].state_dict()),
                   f"{path}.{rank}")

    def load(self, obj, path, rank):
        sd = torch.load(f"{path}.{rank}", weights_only=False)
        obj["model"].load_state_dict(sd["model"])
        obj["opt"].load_state_dict(sd["opt"])

    def params(self, obj):
        full = obj["model"].gather_full_params()
        full.update({n: p.detach().clone() for n, p in obj["net"].named_parameters()})
        return full


class FSDP2Torch(Wrapper):
    """torch's fully_shard on the same units, then the root; checkpoint with
    torch.distributed.checkpoint (get_state_dict / set_state_dict)."""

    reshard = True
    adapt = FSDPScratch.adapt   # compared with FSDPFromScratch's runs: one param group

    def skip(self, case):
        if "unused" in case["blocks"] and case["resume_at"] is not None:
            # a parameter that never had a gradient has no optimizer state when saved, but
            # get_state_dict creates one for it when loading: dcp.load then fails with
            # "Missing key in checkpoint state_dict: opt.state.<name>.step" (torch 2.14)
            return "dcp.load of a parameter that never had a gradient"
        return None

    def build(self, case, net):
        from torch.distributed.device_mesh import init_device_mesh
        fully_shard, _ = helpers.fsdp2_api()
        broadcast_module(net)   # fully_shard does not: each rank keeps its own init otherwise
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for u in fsdp_units(net):
            fully_shard(u, mesh=mesh, reshard_after_forward=self.reshard)
        fully_shard(net, mesh=mesh, reshard_after_forward=self.reshard)
        return dict(net=net, model=net, opt=make_optimizer(case, net.named_parameters()))

    def save(self, obj, path, rank):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        model_sd, opt_sd = get_state_dict(obj["net"], obj["opt"])
        dcp.save(dict(model=model_sd, opt=opt_sd), checkpoint_id=path)

    def load(self, obj, path, rank):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        model_sd, opt_sd = get_state_dict(obj["net"], obj["opt"])
        state = dict(model=model_sd, opt=opt_sd)
        dcp.load(state, checkpoint_id=path)
        set_state_dict(obj["net"], obj["opt"], model_state_dict=state["model"],
                       optim_state_dict=state["opt"])

    def params(self, obj):
        return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                for n, p in obj["net"].named_parameters()}


class Zero2Torch(FSDP2Torch):
    """ZeRO-2 in torch: fully_shard with reshard_after_forward=False (gathered once per step)."""

    reshard = False

    def adapt(self, case):
        return case


class DDPScratch(Wrapper):
    """helpers.DDPFromScratch (buckets of a few parameters, launched in order); accumulation
    with no_sync() for all but the last micro-batch; checkpoint on rank 0, loaded by every
    rank (every replica holds the same weights and optimizer state)."""

    bucket_mb = 1e-4

    def build(self, case, net):
        model = helpers.DDPFromScratch(net, bucket_mb=self.bucket_mb)
        return dict(net=net, model=model, opt=make_optimizer(case, net.named_parameters()), m=0)

    def micro(self, obj, X, y, case):
        obj["m"] += 1
        last = obj["m"] == case["accum"]
        with contextlib.nullcontext() if last else obj["model"].no_sync():
            loss_of(obj["model"](X), y, case["accum"]).backward()

    def finish(self, obj):
        obj["model"].finish_gradient_synchronization()

    def step(self, obj):
        self.finish(obj)
        obj["opt"].step()
        obj["opt"].zero_grad()
        obj["m"] = 0

    def save(self, obj, path, rank):
        if rank == 0:
            torch.save(dict(model=obj["net"].state_dict(), opt=obj["opt"].state_dict()), path)

    def load(self, obj, path, rank):
        sd = torch.load(path, weights_only=False)
        obj["net"].load_state_dict(sd["model"])
        obj["opt"].load_state_dict(sd["opt"])


class DDPTorch(DDPScratch):
    """torch's DistributedDataParallel, the same way (find_unused_parameters where a block is
    never used)."""

    def build(self, case, net):
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(net, find_unused_parameters="unused" in case["blocks"])
        return dict(net=net, model=model, opt=make_optimizer(case, net.named_parameters()), m=0)

    def finish(self, obj):
        pass    # torch's DDP finishes inside the last backward


WRAPPERS = {
    "zero1": Zero1Scratch(),
    "zero1:torch": Zero1Torch(),
    "zero2": Zero2Scratch(),
    "zero2:torch": Zero2Torch(),
    "fsdp": FSDPScratch(),
    "fsdp:torch": FSDP2Torch(),
    "ddp": DDPScratch(),
    "ddp:torch": DDPTorch(),
}
