"""Checks for the exercises of Part V's FSDP-from-scratch chapter (book/part5/fsdp_scratch.ipynb).

Shards are judged by their values, lengths and memory; gathers and clipping by what a World of
thread ranks saw travel (every collective, its bytes); units by building helpers.FSDPFromScratch
with them and training a step against one process.
"""
import math
from itertools import pairwise

import torch
from torch import nn
from torch.nn import functional as F

from .. import FSDPFromScratch
from ._core import (
    CheckFailed,
    World,
    as_number,
    check,
    expect,
    fresh_generator,
    near,
    randint,
    rounding_note,
    shown,
    tensor_close,
    tensor_equal,
)
from ._core.buffers import expect_dtype

__all__ = ["check_shard_flat", "check_gather_layer", "check_zero3_sent_bytes",
           "check_clip_sharded", "check_fsdp_units"]


@check("shard_flat", references=["flat_shard", "padded_flat"], observes=[
    "the shards returned for every rank of fresh tensors and world sizes (one case in "
    "bfloat16, kept as bfloat16): equal lengths, rank order giving the flattened zero-padded "
    "vector, no memory shared with the inputs, each shard's storage exactly its own size "
    "(not a view of the padded vector)"])
def check_shard_flat(fn):
    """fn(tensors, rank, world) -> this rank's equal-length slice of the flattened, zero-padded
    tensors (a new tensor)."""
    g = fresh_generator()
    for case in range(5):
        world = randint(g, 2, 5) if case else 2
        shapes = [tuple(randint(g, 1, 5) for _ in range(randint(g, 1, 2)))
                  for _ in range(randint(g, 2, 4))] if case else [(3,), (1, 3)]
        if case == 1 and not sum(math.prod(s) for s in shapes) % world:
            shapes.append((1,))             # case 0 needs no padding, case 1 surely does
        # case 1 (padded) in bfloat16: a pad made with torch.zeros' float32 default promotes it
        dtype = torch.bfloat16 if case == 1 else torch.float32
        tensors = [torch.randn(s, generator=g).to(dtype) for s in shapes]
        flat = torch.cat([t.reshape(-1) for t in tensors])
        n = flat.numel()
        flat = torch.cat([flat, flat.new_zeros(-n % world)])
        shards = [fn(tensors, r, world) for r in range(world)]
        call = f"shard_flat({shapes}, rank, {world}" + (", bfloat16)" if case == 1 else ")")
        expect(all(torch.is_tensor(s) for s in shards), f"{call} must return tensors")
        for r, s in enumerate(shards):
            expect_dtype(s, dtype, f"{call}: rank {r}'s shard")
        lengths = [int(s.numel()) for s in shards]
        expect(len(set(lengths)) == 1,
               f"{call}: the ranks' shards have lengths {lengths}: they must be equal (pad the "
               "flat vector with zeros to a multiple of world) for all-gather and reduce-scatter")
        expect(sum(lengths) == flat.numel(),
               f"{call}: shards of {lengths} elements for {n} numbers padded to {flat.numel()}: "
               "flatten all the tensors into one vector, then pad it once")
        expect(all(s.dim() == 1 for s in shards), f"{call}: each shard must be a flat vector")
        got = torch.cat([s.reshape(-1) for s in shards])
        expect(tensor_equal(got, flat),
               f"{call}: the shards, put together in rank order, are not the flattened tensors "
               "(each rank holds a contiguous slice of ONE flat vector, not a piece of every "
               "tensor)")
        expect(all(s.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
                   for s in shards for t in tensors),
               f"{call}: a shard shares memory with a full tensor, so freeing the full tensors "
               "frees nothing")
        held = [(s.untyped_storage().nbytes(), s.numel() * s.element_size()) for s in shards]
        expect(all(a == b for a, b in held),
               f"{call}: a shard is a view of a bigger buffer ({max(held)[0]} bytes held for a "
               f"{max(held)[1]}-byte shard): each rank would keep the whole padded vector "
               "alive; return a copy of its own slice (`.clone()`)")


@check("gather_layer", references=["all_gather_flat"], observes=[
    "every collective each rank of a fresh world of thread ranks calls and its bytes: exactly "
    "one all-gather of the shard",
    "the tensors returned, against the layer's full tensors, in the shard's dtype (one case in "
    "bfloat16, as a compute dtype gathers)"])
def check_gather_layer(fn):
    """fn(shard, shapes) -> the layer's full tensors (one per shape), all-gathered from every
    rank's shard with one all-gather, the padding dropped. Run on every rank of a world."""
    g = fresh_generator()
    half = randint(g, 0, 2)     # forced, in a fresh case: a bfloat16 shard (FSDP's compute dtype)
    for case in range(3):
        dtype = torch.bfloat16 if case == half else torch.float32
        world = randint(g, 2, 4)
        shapes = [torch.Size(randint(g, 1, 6) for _ in range(randint(g, 1, 2)))
                  for _ in range(randint(g, 1, 3))]
        numel = sum(s.numel() for s in shapes)
        if case < 2 and bool(numel % world) != (case == 0):     # case 0 padded, case 1 not
            shapes.append(torch.Size([1 if case == 0 else world - numel % world]))
            numel = sum(s.numel() for s in shapes)
        flat = torch.cat([torch.randn(numel, generator=g), torch.zeros(-numel % world)]).to(dtype)
        shards = list(flat.chunk(world))
        w = World(world, record_ops=True, allow={"all_gather"}, why={
            "broadcast": "a rank that used broadcast sends its shard to each rank in turn: "
                         "all-gather them, once"})
        outs = w.run(lambda comm, shards=shards, shapes=shapes: fn(shards[comm.rank].clone(),
                                                                  list(shapes)))
        full = [t.reshape(s) for t, s in            # the layer's tensors, after the answer ran
                zip(flat[:numel].split([s.numel() for s in shapes]), shapes, strict=True)]
        call = (f"gather_layer ({world} ranks, {str(dtype)[6:]} shapes "
                f"{[tuple(s) for s in shapes]})")
        for r in range(world):
            gathers = w.sent("all_gather", rank=r)
            expect(gathers, f"{call}: rank {r} did not all-gather the shards")
            sizes = [t.payload for t in w.traffic(messages=gathers).records]
            nbytes = shards[r].numel() * dtype.itemsize
            expect(sizes == [nbytes], f"{call}: rank {r} ran {len(gathers)} all-gathers of "
                   f"{sizes} bytes: one all-gather of its {nbytes}-byte shard brings every rank's")
            got = list(outs[r])
            expect(len(got) == len(shapes),
                   f"{call}: rank {r} returned {len(got)} tensors for {len(shapes)} shapes")
            for i, (a, b) in enumerate(zip(got, full, strict=True)):
                expect(tuple(a.shape) == tuple(b.shape),
                       f"{call}: tensor {i} has shape {tuple(a.shape)}, expected "
                       f"{tuple(b.shape)} (drop the padding, then split the flat vector in order)")
                expect_dtype(a, dtype, f"{call}: rank {r}'s tensor {i}")
                expect(tensor_equal(a, b), f"{call}: tensor {i} has the wrong values")
                w.expect_from_messages(r, a, f"tensor {i}", world)


def _random_layers(g):
    widths = [randint(g, 3, 17) for _ in range(randint(g, 3, 5))]
    with torch.random.fork_rng(devices=[]):   # leave the notebook's random numbers alone
        torch.manual_seed(randint(g, 0, 10**6))
        layers = [nn.Linear(a, b, bias=bool(randint(g, 0, 1)))
                  for a, b in pairwise(widths)]
    return layers, widths


@check("zero3_sent_bytes", references=["sharding_costs", "data_parallel_costs"], observes=[
    "the number returned (any real type) for fresh random layers and world sizes 1 to 8, "
    "against 3 (k-1) padded shards per layer (layers drawn so that padding each layer, each "
    "parameter and the total differ)"])
def check_zero3_sent_bytes(fn):
    """fn(layers, world) -> bytes one rank sends over a ring in one ZeRO-3 training step: each
    layer's padded flat shard all-gathered in forward and again in backward, its gradient
    reduce-scattered (float32)."""
    g = fresh_generator()
    for case in range(6):
        world = (1, 2)[case] if case < 2 else randint(g, 3, 8)
        for _ in range(200):     # world > 1: padding each layer, each parameter, the total
            layers, widths = _random_layers(g)          # and not padding give four sums
            counts = [sum(p.numel() for p in m.parameters()) for m in layers]
            per_param = sum(-(-p.numel() // world) for m in layers for p in m.parameters())
            per_layer = sum(-(-c // world) for c in counts)
            if world == 1 or (sum(counts) % world and per_layer != -(-sum(counts) // world)
                              and per_param != per_layer):
                break
        call = f"zero3_sent_bytes(Linear layers {widths}, world {world})"
        got, dtype = as_number(fn(layers, world), call, with_dtype=True)
        shard = sum(-(-c // world) for c in counts)    # padded, per layer
        want = 3 * (world - 1) * shard * 4
        n = sum(counts) * 4

        def close(v, got=got, dtype=dtype):     # a float32 count: to float32's rounding
            return abs(got - v) < 1e-6 or near(got, v, dtype, 16)

        def near_any(*values, got=got, want=want):
            return not close(want) and any(close(v) for v in values)

        expect(not near_any(2 * (world - 1) / world * n, 2 * (world - 1) * shard * 4),
               f"{call} = {got:g}: that is what data parallelism's all-reduce sends, 2(k-1)/k of "
               "the parameter bytes; ZeRO-3 all-gathers the weights twice (forward and again in "
               "backward) and reduce-scatters the gradient")
        expect(not near_any(3 * n, 3 * world * shard * 4),
               f"{call} = {got:g}: over a ring each rank sends k-1 shards per collective, not all "
               "k (its own shard is already where it belongs)")
        expect(not near_any(3 * (world - 1) / world * n),
               f"{call} = {got:g}: that forgets the padding: each layer's flat vector is padded "
               "to a multiple of the world size, so a shard is ceil(numel / world)")
        expect(not near_any(3 * (world - 1) * -(-sum(counts) // world) * 4),
               f"{call} = {got:g}: that pads the total; fully_shard pads each layer's flat "
               "vector on its own (its own all-gather), so a step sends the sum over the layers "
               "of ceil(numel / world)")
        expect(not near_any(3 * (world - 1) * per_param * 4),
               f"{call} = {got:g}: that pads each parameter; fully_shard flattens a layer's "
               "parameters into one vector and pads that, so a step sends the sum over the "
               "layers of ceil(numel / world)")
        expect(close(want), f"{call} = {shown(got, want)[0]}, expected {want}"
                            f"{rounding_note(got, want, dtype)}")


@check("clip_sharded", references=["clip_sharded_grad_norm_", "FSDPFromScratch.clip_grad_norm_",
                                   "Zero2.clip_grad_norm_"], observes=[
    "the norm each rank of a fresh world returns and the gradients it leaves, against the "
    "norm of the whole gradient (every rank's shards) and torch's clipping rule",
    "every collective and its bytes: a few numbers all-reduced, not the gradients gathered",
    "where the clipped gradients' values came from: the all-reduce's result (a max_norm drawn "
    "at a random ratio of the norm, so a factor guessed or recomputed locally fails)"])
def check_clip_sharded(fn):
    """fn(shards, max_norm) -> clip the gradients of this rank's `shards` (tensors with .grad;
    every element of the model on exactly one rank) by the norm of the WHOLE gradient, as
    torch.nn.utils.clip_grad_norm_ would on one process; return that norm."""
    g = fresh_generator()
    bare = randint(g, 0, 2)     # forced, in a fresh case: a rank that owns no shard (a world
    for case in range(3):       # bigger than the parameters: its list is empty), of 3 or more
        world = randint(g, 3 if case == bare else 2, 4)     # (two ranks hold the gradient)
        sizes = [[randint(g, 20, 60) for _ in range(randint(g, 1, 3))] for _ in range(world)]
        if case == bare:
            sizes[randint(g, 0, world - 1)] = []
        scale = [2.0 ** randint(g, -3, 3) for _ in range(world)]   # uneven: local norms differ
        drawn = [[torch.randn(n, generator=g) * scale[r] for n in sizes[r]] for r in range(world)]
        # the whole gradient scaled to a norm chosen first (the draws' expected one), so that
        # max_norm is set before the answer runs and the norm measured after it
        norm = math.sqrt(sum(n * scale[r] ** 2 for r in range(world) for n in sizes[r]))
        to = norm / torch.cat([t for ts in drawn for t in ts]).norm()
        grads = [[t * to for t in ts] for ts in drawn]
        # a ratio drawn each time: a factor guessed, or a norm recomputed from max_norm, fails;
        # the last case needs no clipping
        ratio = 0.2 + 0.6 * float(torch.rand((), generator=g)) if case < 2 else 2.0
        max_norm = norm * ratio
        shards = [[nn.Parameter(torch.zeros(n)) for n in sizes[r]] for r in range(world)]
        for r in range(world):
            for p, gr in zip(shards[r], grads[r], strict=True):
                p.grad = gr.clone()
        # each rank all-reduces: the ranks share the norm through the comm (a thread started
        # before the check that carries it is refused: guard.py)
        w = World(world, record_ops=True, allow={"all_reduce"}, why=dict.fromkeys(
            ("all_gather", "broadcast", "send"), "all-reduce one number (the sum of squares), "
            "not the gradients"))
        norms = w.run(lambda comm, shards=shards, max_norm=max_norm: fn(shards[comm.rank],
                                                                    max_norm))
        total = float(torch.cat([t for ts in grads for t in ts]).norm())   # after the answer
        coef = min(1.0, max_norm / (total + 1e-6))
        call = f"clip_sharded ({world} ranks, max_norm {max_norm:.3g})"
        grad_bytes = [4 * sum(s) for s in sizes]
        for r in range(world):
            sent = w.traffic(r).payload_bytes()
            expect(sent < min(b for b in grad_bytes if b) / 2,
                   f"{call}: rank {r} sent {sent} bytes for {grad_bytes[r]} bytes of gradient: "
                   "all-reduce one number (the sum of squares), not the gradients")
            got = as_number(norms[r], call)
            local = float(torch.cat(grads[r]).norm()) if grads[r] else 0.0
            expect(not (abs(got - local) <= 1e-4 * local and abs(local - total) > 1e-4 * total),
                   f"{call}: rank {r} returned {got:.4g}, the norm of its own shards: each rank "
                   f"holds part of the gradient, the whole one has norm {total:.4g} (sum the "
                   "squared norms over the ranks with an all-reduce, then take the root)")
            expect(abs(got - total) <= 1e-4 * total,
                   f"{call}: rank {r} returned {got:.4g}, the norm of the whole gradient is "
                   f"{total:.4g}")
            expect(w.sent("all_reduce", rank=r),
                   f"{call}: rank {r} never called all_reduce: each rank holds only its own "
                   "shards, so the squared norms must be summed over the ranks by an all-reduce")
            for p, gr in zip(shards[r], grads[r], strict=True):
                expect(tensor_close(p.grad, gr * coef, rtol=1e-4, atol=1e-6),
                       f"{call}: rank {r}'s gradients are not scaled by max_norm / (norm + 1e-6)"
                       f" = {coef:.4g} (capped at 1), the factor torch's clip_grad_norm_ uses")
            if coef < 1 and shards[r]:     # the factor must come from the all-reduce's result
                w.expect_from_messages(r, [p.grad for p in shards[r]], "clipped gradients",
                                       world)


class TiedLM(nn.Module):
    """Embedding, blocks, and a head that shares the embedding's weight."""

    def __init__(self, vocab, d, depth):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.Tanh())
                                    for _ in range(depth))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)


@check("fsdp_units", references=[], observes=[
    "helpers.FSDPFromScratch built with the units returned, on every rank of a fresh world, "
    "on a model whose head shares the embedding's weight: accepted, one unit per block",
    "one training step with those units against one process"])
def check_fsdp_units(fn):
    """fn(model) -> the units= for helpers.FSDPFromScratch(model) of a TiedLM: each block its
    own unit, and the tied embedding and head together (FSDP2's way: the blocks, then the model
    itself, whose unit takes what no inner unit holds)."""
    g = fresh_generator()
    world, vocab, d, depth = randint(g, 2, 3), randint(g, 5, 9), randint(g, 3, 6), randint(g, 2, 4)
    seed = randint(g, 0, 10**6)
    x = torch.randint(0, vocab, (world * 2, randint(g, 2, 4)), generator=g)

    def build():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return TiedLM(vocab, d, depth)
    nets = [build() for _ in range(world)]
    units = [fn(net) for net in nets]

    def rank(comm):
        try:
            model = FSDPFromScratch(nets[comm.rank], units=units[comm.rank])
        except (ValueError, TypeError) as e:
            raise CheckFailed(f"FSDPFromScratch refused your units: {e}") from None
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        xs = x[comm.rank * 2:(comm.rank + 1) * 2]
        F.cross_entropy(model(xs[:, :-1]).reshape(-1, vocab), xs[:, 1:].reshape(-1)).backward()
        model.finish_gradient_synchronization()
        opt.step()
        return len(model.units), model.gather_full_params()
    out = World(world).run(rank)
    ref = build()                            # the reference after the answer ran
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    F.cross_entropy(ref(x[:, :-1]).reshape(-1, vocab), x[:, 1:].reshape(-1)).backward()
    opt.step()
    call = f"fsdp_units (a TiedLM with {depth} blocks)"
    count, full = out[0]
    expect(count >= depth + 1,
           f"{call}: {count} unit(s): the whole model is gathered at once, so no rank ever holds "
           "less than all the weights; give each block a unit of its own")
    for n, p in ref.named_parameters():
        expect(n in full and tensor_close(full[n], p.detach(), atol=1e-5),
               f"{call}: after one step {n} differs from one process")
