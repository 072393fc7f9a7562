"""Checks for the exercises of DDP from scratch (Part III) and Part V (ZeRO, FSDP, FSDP2).

They run in this process, on the CPU. Collectives are instrumented by `FakeWorld`: while it is
active, `torch.distributed` believes it is rank `rank` of `world` ranks, and every collective the
answer calls is recorded (name, bytes, async or not, when) and answered with the other ranks'
data, which the check chooses. So a check sees what an answer sends, not only what it returns.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from ._core import CheckFailed, expect, fresh_generator, randint, run_check

__all__ = ["FakeWorld", "check_bucket_params", "check_overlap_hooks", "check_average_bucket",
           "check_partition", "check_zero1_optimizer", "check_grad_shard", "check_shard_flat",
           "check_gather_layer", "check_zero3_sent_bytes", "check_saved_bytes_of_call",
           "check_checkpointed_forward", "check_choose_checkpoints"]


class _Done:
    """What async_op=True returns: a handle whose wait() is recorded."""

    def __init__(self, world, call):
        self.world, self.call = world, call

    def wait(self):
        self.call["waited"] = True
        return True

    def is_completed(self):
        return True


class FakeWorld:
    """Pretend to be rank `rank` of `world`. `others(name, tensor)` returns the sum of the other
    ranks' contributions (all_reduce, reduce_scatter) or the list of every rank's shard
    (all_gather); by default the others send what this rank sends."""

    NAMES = ("get_world_size", "get_rank", "is_initialized", "all_reduce", "broadcast",
             "reduce_scatter_tensor", "reduce_scatter_single", "all_gather_into_tensor",
             "all_gather_single", "all_gather", "barrier")

    def __init__(self, world, rank=0, others=None):
        self.world, self.rank, self.others = world, rank, others
        self.calls = []

    def _record(self, name, tensor, async_op):
        call = dict(name=name, bytes=tensor.numel() * tensor.element_size(), async_op=async_op,
                    waited=False, index=len(self.calls), tensor_id=id(tensor))
        self.calls.append(call)
        return _Done(self.world, call) if async_op else None

    def count(self, name):
        return sum(1 for c in self.calls if c["name"].startswith(name))

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        other = self.others("all_reduce", tensor) if self.others else tensor * (self.world - 1)
        with torch.no_grad():
            tensor.add_(other)
        return self._record("all_reduce", tensor, async_op)

    def reduce_scatter(self, output, input, op=None, group=None, async_op=False):
        expect(input.numel() == output.numel() * self.world,
               f"reduce_scatter: the input has {input.numel()} elements, the output "
               f"{output.numel()}: the input must be world ({self.world}) times the output")
        total = input + (self.others("reduce_scatter", input) if self.others
                         else input * (self.world - 1))
        with torch.no_grad():
            output.copy_(total.chunk(self.world)[self.rank])
        return self._record("reduce_scatter", input, async_op)

    def all_gather_into(self, output, input, group=None, async_op=False):
        shards = self.others("all_gather", input) if self.others else [input] * self.world
        with torch.no_grad():
            output.copy_(torch.cat([s.reshape(-1) for s in shards]).view_as(output))
        return self._record("all_gather", output, async_op)

    def all_gather_list(self, tensor_list, tensor, group=None, async_op=False):
        shards = self.others("all_gather", tensor) if self.others else [tensor] * self.world
        with torch.no_grad():
            for out, s in zip(tensor_list, shards):
                out.copy_(s.view_as(out))
        return self._record("all_gather", tensor * self.world, async_op)

    def broadcast(self, tensor, src=0, group=None, async_op=False):
        return self._record("broadcast", tensor, async_op)

    def __enter__(self):
        self.saved = {n: getattr(dist, n, None) for n in self.NAMES}
        fake = dict(get_world_size=lambda group=None: self.world,
                    get_rank=lambda group=None: self.rank, is_initialized=lambda: True,
                    all_reduce=self.all_reduce, broadcast=self.broadcast,
                    reduce_scatter_tensor=self.reduce_scatter,
                    reduce_scatter_single=self.reduce_scatter,
                    all_gather_into_tensor=self.all_gather_into,
                    all_gather_single=self.all_gather_into,
                    all_gather=self.all_gather_list, barrier=lambda *a, **k: None)
        for n, f in fake.items():
            setattr(dist, n, f)
        return self

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            if f is None:
                delattr(dist, n)
            else:
                setattr(dist, n, f)


def _random_mlp(g, frozen=False):
    widths = [randint(g, 3, 12) for _ in range(randint(g, 4, 6))]
    seed = randint(g, 0, 10**6)
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    net = nn.Sequential(*layers[:-1])
    if frozen:
        net[2].requires_grad_(False)
    return net, widths


# --- DDP from scratch ---------------------------------------------------------------------------
def _reference_buckets(params, bucket_mb):
    from .. import make_buckets
    return make_buckets(params, bucket_mb)


def check_bucket_params(fn):
    """fn(params, bucket_mb) -> list of lists of parameters, as DDPFromScratch buckets them."""

    def body(fn):
        g = fresh_generator()
        net, _ = _random_mlp(g, frozen=True)
        params = list(net.parameters())
        names = {id(p): n for n, p in net.named_parameters()}
        sizes = sorted(p.numel() * 4 for p in params)
        for bucket_mb in (None, sizes[len(sizes) // 2] / 2**20, 1.0):
            got = fn(params, bucket_mb)
            want = _reference_buckets(params, bucket_mb)
            flat = [p for b in got for p in b]
            call = ("bucket_params(params, "
                    f"{bucket_mb if bucket_mb is None else round(bucket_mb, 6)})")
            expect(all(p.requires_grad for p in flat),
                   f"{call} put a frozen parameter (requires_grad=False) in a bucket: it has no "
                   "gradient to reduce")
            expect(len({id(p) for p in flat}) == len(flat),
                   f"{call} has a parameter twice: a shared (tied) parameter is reduced once")
            expect({id(p) for p in flat} == {id(p) for b in want for p in b},
                   f"{call} leaves out a trainable parameter")
            expect([id(p) for p in flat] == [id(p) for b in want for p in b],
                   f"{call} starts with {names[id(flat[0])]}, expected {names[id(want[0][0])]}: "
                   "backward produces the last layer's gradients first, so buckets fill in "
                   "reverse order")
            expect([len(b) for b in got] == [len(b) for b in want],
                   f"{call} made buckets of {[len(b) for b in got]} parameters, expected "
                   f"{[len(b) for b in want]}: close a bucket as soon as it holds bucket_mb MB")

    return run_check("bucket_params", body, fn)


def check_overlap_hooks(fn):
    """fn(model) registers hooks that all-reduce each gradient asynchronously as soon as it is
    ready and returns finish(), which waits and averages. Checked as rank 0 of a simulated world
    whose other ranks send the same gradients (so the average is this rank's own gradient)."""

    def body(fn):
        g = fresh_generator()
        net, widths = _random_mlp(g, frozen=True)
        world = randint(g, 2, 4)
        X, y = torch.randn(8, widths[0], generator=g), torch.randn(8, widths[-1], generator=g)
        F.mse_loss(net(X), y).backward()
        want = {n: p.grad.clone() for n, p in net.named_parameters() if p.requires_grad}
        net.zero_grad(set_to_none=True)
        trainable = len(want)
        with FakeWorld(world, 0) as w:
            finish = fn(net)
            expect(callable(finish), "overlap_hooks(model) must return a function finish()")
            launched_before_first = []
            net[0].weight.register_post_accumulate_grad_hook(
                lambda p: launched_before_first.append(w.count("all_reduce")))
            F.mse_loss(net(X), y).backward()
            during = w.count("all_reduce")
            finish()
        expect(w.count("all_reduce") > 0, "no all_reduce was called")
        expect(during > 0 and launched_before_first and launched_before_first[0] > 0,
               "no all-reduce was launched during backward: launch it from the gradient hook, so "
               "communication overlaps the rest of backward")
        expect(all(c["async_op"] for c in w.calls if c["name"] == "all_reduce"),
               "all_reduce was called without async_op=True: backward then waits for every "
               "all-reduce instead of overlapping it")
        expect(all(c["waited"] for c in w.calls if c["name"] == "all_reduce"),
               "finish() did not wait() for every all-reduce handle")
        expect(net[2].weight.grad is None, "a frozen parameter got a gradient")
        expect(w.count("all_reduce") == trainable,
               f"{w.count('all_reduce')} all-reduces for {trainable} trainable parameters: "
               "one each (frozen ones have nothing to reduce)")
        for n, p in net.named_parameters():
            if n not in want:
                continue
            expect(p.grad is not None, f"{n} has no gradient after finish()")
            expect(not torch.allclose(p.grad, want[n] * world, atol=1e-6),
                   f"{n}.grad is the sum over the {world} ranks: divide it by the world size")
            expect(torch.allclose(p.grad, want[n], atol=1e-6),
                   f"{n}.grad after finish() is {float(p.grad.norm()):.4g} in norm, expected the "
                   f"average {float(want[n].norm()):.4g}")

    return run_check("overlap_hooks", body, fn)


def check_average_bucket(fn):
    """fn(grads) averages a bucket of gradients over the ranks, in place, with ONE all-reduce of
    a flat buffer. Run as a rank of a simulated world whose other ranks send other gradients."""

    def body(fn):
        g = fresh_generator()
        for _ in range(3):
            world, rank = randint(g, 2, 4), 0
            shapes = [tuple(randint(g, 1, 6) for _ in range(randint(g, 1, 2)))
                      for _ in range(randint(g, 3, 6))]
            grads = [torch.randn(s, generator=g) for s in shapes]
            n = sum(t.numel() for t in grads)
            others = [torch.randn(n, generator=g) for _ in range(world - 1)]
            mine = torch.cat([t.reshape(-1) for t in grads])
            want = (mine + sum(others)) / world

            def from_others(name, tensor):   # the other ranks' buffers, if it is the bucket's
                return sum(others) if tensor.numel() == n else torch.zeros_like(tensor)

            ids = [id(t) for t in grads]
            with FakeWorld(world, rank, from_others) as w:
                fn(grads)
            call = f"average_bucket ({len(shapes)} gradients {shapes}, world {world})"
            expect(w.count("all_reduce") > 0, f"{call} called no all_reduce")
            expect(w.count("all_reduce") == 1,
                   f"{call} made {w.count('all_reduce')} all-reduces, expected one: flatten the "
                   "bucket into one buffer, so it pays the latency of one message")
            sent = w.calls[0]["bytes"]
            expect(sent == 4 * n,
                   f"{call} all-reduced {sent} bytes, expected the whole bucket, {4 * n}")
            expect([id(t) for t in grads] == ids and
                   [tuple(t.shape) for t in grads] == shapes,
                   f"{call} replaced or reshaped the gradient tensors: write into them in place")
            got = torch.cat([t.reshape(-1) for t in grads])
            expect(not torch.equal(got, mine),
                   f"{call} left the gradients unchanged: the flat buffer is a copy, copy its "
                   "averaged slices back into each gradient")
            # (a last rank's shard may be all padding: zeros, where sum and mean agree)
            expect(not (want.abs().max() > 1e-3 and torch.allclose(got, want * world, atol=1e-5)),
                   f"{call} left the sum over the ranks: divide by the world size")
            expect(torch.allclose(got, want, atol=1e-5),
                   f"{call}: the gradients are not the average over the ranks (copy slice i of "
                   "the buffer back into gradient i, in order)")

    return run_check("average_bucket", body, fn)


# --- ZeRO-1 and ZeRO-2 -------------------------------------------------------------------------
def _owners(fn, sizes, world, call):
    got = fn(list(sizes), world)
    if isinstance(got, torch.Tensor):
        got = got.tolist()
    try:
        got = [int(r) for r in got]
    except (TypeError, ValueError):
        raise CheckFailed(f"{call} returned {got!r}, expected a list of ranks")
    expect(len(got) == len(sizes), f"{call} returned {len(got)} owners for {len(sizes)} tensors")
    expect(all(0 <= r < world for r in got), f"{call} returned a rank outside 0..{world - 1}")
    return got


def check_partition(fn):
    """fn(sizes, world) -> the owning rank of each tensor, balanced by size."""

    def body(fn):
        g = fresh_generator()
        cases = [([randint(g, 1, 1000) for _ in range(randint(g, 6, 20))], randint(g, 2, 5))
                 for _ in range(5)]
        cases.append(([1000, 10] * 4, 2))               # round-robin by index: 4000 vs 40
        cases.append(([1000] * 4 + [10] * 4, 2))        # contiguous halves: 4000 vs 40
        cases.append(([5000] + [10] * 9, 4))
        for sizes, world in cases:
            call = f"partition({sizes}, {world})"
            owners = _owners(fn, sizes, world, call)
            load = [sum(s for s, r in zip(sizes, owners) if r == k) for k in range(world)]
            expect(max(load) - min(load) <= max(sizes),
                   f"{call}: ranks hold {load} elements: the loads may differ by at most the "
                   "largest tensor (give each tensor, largest first, to the least loaded rank)")

    return run_check("partition", body, fn)


def check_zero1_optimizer(fn):
    """fn(params, rank, world, lr) -> a torch.optim.AdamW over this rank's share of params only."""

    def body(fn):
        g = fresh_generator()
        world = randint(g, 2, 4)
        big, small = (randint(g, 20, 30), randint(g, 20, 30)), (randint(g, 2, 5),)
        # a big matrix at every world-th place: dealing them out by index is unbalanced
        shapes = [big if i % world == 0 else small for i in range(3 * world + 1)]
        owned = {}
        for rank in range(world):
            params = [nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
            before = [p.detach().clone() for p in params]
            opt = fn(params, rank, world, 1e-2)
            expect(isinstance(opt, torch.optim.Optimizer),
                   f"zero1_optimizer returned {type(opt).__name__}, expected a torch optimizer")
            for p in params:
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
            stepped = [i for i, (p, b) in enumerate(zip(params, before)) if not torch.equal(p, b)]
            state = sum(v.numel() * v.element_size() for st in opt.state.values()
                        for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
            total = 8 * sum(p.numel() for p in params)
            expect(len(stepped) < len(shapes),
                   f"rank {rank} of {world} stepped every parameter and holds {state} bytes of "
                   f"optimizer state, {state / total:.0%} of the unsharded {total}: ZeRO-1 keeps "
                   "about 1/world (build the optimizer over this rank's parameters only)")
            expect(state == 8 * sum(params[i].numel() for i in stepped),
                   f"rank {rank}: the optimizer state does not match the parameters it stepped")
            for i in stepped:
                expect(i not in owned, f"parameter {i} is stepped by ranks {owned.get(i)} and "
                                       f"{rank}: each parameter has exactly one owner")
                owned[i] = rank
        missing = sorted(set(range(len(shapes))) - set(owned))
        expect(not missing, f"no rank steps parameters {missing}")
        sizes = [torch.Size(s).numel() for s in shapes]
        load = [sum(n for i, n in enumerate(sizes) if owned[i] == r) for r in range(world)]
        expect(max(load) - min(load) <= max(sizes),
               f"the ranks own {load} elements (optimizer state {[8 * n for n in load]} bytes): "
               "balance them by size, so each holds about 1/world")

    return run_check("zero1_optimizer", body, fn)


def check_grad_shard(fn):
    """fn(flat_grad) -> this rank's averaged shard of the flat gradient (padded to a multiple
    of the world size), through a reduce-scatter. Run as a rank of a simulated world."""

    def body(fn):
        g = fresh_generator()
        for _ in range(3):
            world, n = randint(g, 2, 4), randint(g, 5, 40)
            rank = randint(g, 0, world - 1)
            mine = torch.randn(n, generator=g)
            others = [torch.randn(n, generator=g) for _ in range(world - 1)]
            pad = -n % world

            def from_others(name, tensor):
                o = sum(torch.cat([t, t.new_zeros(pad)]) if tensor.numel() > n else t
                        for t in others)
                return o

            with FakeWorld(world, rank, from_others) as w:
                got = fn(mine.clone())
            full = torch.cat([sum(others) + mine, torch.zeros(pad)]) / world
            want = full.chunk(world)[rank]
            call = f"grad_shard (rank {rank} of {world}, {n} gradients)"
            expect(w.count("all_reduce") == 0,
                   f"{call} called all_reduce: it sends twice what a reduce-scatter sends and "
                   "leaves the whole gradient on every rank; ZeRO-2 reduce-scatters")
            expect(w.count("reduce_scatter") == 1,
                   f"{call} made {w.count('reduce_scatter')} reduce-scatters, expected one")
            expect(torch.is_tensor(got) and got.shape == want.shape,
                   f"{call} returned shape {tuple(getattr(got, 'shape', ()))}, expected "
                   f"{tuple(want.shape)} (pad to a multiple of the world size, then 1/world)")
            # (a last rank's shard may be all padding: zeros, where sum and mean agree)
            expect(not (want.abs().max() > 1e-3 and torch.allclose(got, want * world, atol=1e-5)),
                   f"{call} returned the sum over the ranks: divide by the world size")
            expect(torch.allclose(got, want, atol=1e-5),
                   f"{call} returned the wrong values: expected this rank's slice of the averaged "
                   "gradient")

    return run_check("grad_shard", body, fn)


# --- FSDP from scratch --------------------------------------------------------------------------
def check_shard_flat(fn):
    """fn(tensors, rank, world) -> this rank's equal-length slice of the flattened, zero-padded
    tensors."""

    def body(fn):
        g = fresh_generator()
        for case in range(5):
            world = randint(g, 2, 5) if case else 2
            shapes = [tuple(randint(g, 1, 5) for _ in range(randint(g, 1, 2)))
                      for _ in range(randint(g, 2, 4))] if case else [(3,), (1, 3)]
            tensors = [torch.randn(s, generator=g) for s in shapes]
            flat = torch.cat([t.reshape(-1) for t in tensors])
            n = flat.numel()
            flat = torch.cat([flat, flat.new_zeros(-n % world)])
            shards = [fn(tensors, r, world) for r in range(world)]
            call = f"shard_flat({shapes}, rank, {world})"
            lengths = [int(s.numel()) for s in shards]
            expect(len(set(lengths)) == 1,
                   f"{call}: the ranks' shards have lengths {lengths}: they must be equal (pad "
                   "the flat vector with zeros to a multiple of world) for all-gather and "
                   "reduce-scatter")
            expect(sum(lengths) == flat.numel(),
                   f"{call}: shards of {lengths} elements for {n} numbers padded to "
                   f"{flat.numel()}: flatten all the tensors into one vector, then pad it once")
            expect(all(s.dim() == 1 for s in shards), f"{call}: each shard must be a flat vector")
            got = torch.cat([s.reshape(-1) for s in shards])
            expect(torch.equal(got, flat),
                   f"{call}: the shards, put together in rank order, are not the flattened "
                   "tensors (each rank holds a contiguous slice of ONE flat vector, not a piece "
                   "of every tensor)")
            expect(all(s.data_ptr() != t.data_ptr() for s in shards for t in tensors),
                   f"{call}: a shard shares memory with a full tensor, so freeing the full "
                   "tensors frees nothing")

    return run_check("shard_flat", body, fn)


def check_gather_layer(fn):
    """fn(shard, shapes) -> the layer's full tensors (in `shapes`), all-gathered from every
    rank's shard. Run as a rank of a simulated world whose other ranks hold the other shards."""

    def body(fn):
        g = fresh_generator()
        for _ in range(3):
            world = randint(g, 2, 4)
            rank = randint(g, 0, world - 1)
            shapes = [tuple(randint(g, 1, 6) for _ in range(randint(g, 1, 2)))
                      for _ in range(randint(g, 1, 3))]
            full = [torch.randn(s, generator=g) for s in shapes]
            flat = torch.cat([t.reshape(-1) for t in full])
            flat = torch.cat([flat, flat.new_zeros(-flat.numel() % world)])
            shards = list(flat.chunk(world))
            with FakeWorld(world, rank, lambda name, t: shards) as w:
                got = fn(shards[rank].clone(), [torch.Size(s) for s in shapes])
            call = f"gather_layer (rank {rank} of {world}, shapes {shapes})"
            expect(w.count("broadcast") == 0,
                   f"{call} used broadcast: each rank holds a different shard, every one is "
                   "needed: all-gather them")
            expect(w.count("all_gather") >= 1, f"{call} did not all-gather the shards")
            got = list(got)
            expect(len(got) == len(shapes), f"{call} returned {len(got)} tensors for "
                                            f"{len(shapes)} shapes")
            for i, (a, b) in enumerate(zip(got, full)):
                expect(tuple(a.shape) == tuple(b.shape),
                       f"{call}: tensor {i} has shape {tuple(a.shape)}, expected {tuple(b.shape)} "
                       "(drop the padding, then split the flat vector in order)")
                expect(torch.equal(a, b), f"{call}: tensor {i} has the wrong values")

    return run_check("gather_layer", body, fn)


def _random_layers(g):
    widths = [randint(g, 3, 17) for _ in range(randint(g, 3, 5))]
    with torch.random.fork_rng(devices=[]):   # leave the notebook's random numbers alone
        torch.manual_seed(randint(g, 0, 10**6))
        layers = [nn.Linear(a, b, bias=bool(randint(g, 0, 1)))
                  for a, b in zip(widths, widths[1:])]
    return layers, widths


def check_zero3_sent_bytes(fn):
    """fn(layers, world) -> bytes one rank sends over a ring in one ZeRO-3 training step: each
    layer's padded flat shard all-gathered in forward and again in backward, its gradient
    reduce-scattered (float32)."""

    def body(fn):
        g = fresh_generator()
        for case in range(6):
            layers, widths = _random_layers(g)
            world = (1, 2)[case] if case < 2 else randint(g, 3, 8)
            counts = [sum(p.numel() for p in m.parameters()) for m in layers]
            shard = sum(-(-c // world) for c in counts)    # padded, per layer
            want = 3 * (world - 1) * shard * 4
            got = fn(layers, world)
            call = f"zero3_sent_bytes(Linear layers {widths}, world {world})"
            expect(isinstance(got, (int, float)) and not isinstance(got, bool),
                   f"{call} returned {got!r}, expected a number of bytes")
            n = sum(counts) * 4

            def near(*values):
                return got != want and any(abs(got - v) < 1e-6 for v in values)

            expect(not near(2 * (world - 1) / world * n, 2 * (world - 1) * shard * 4),
                   f"{call} = {got}: that is what data parallelism's all-reduce sends, 2(k-1)/k "
                   "of the parameter bytes; ZeRO-3 all-gathers the weights twice (forward and "
                   "again in backward) and reduce-scatters the gradient")
            expect(not near(3 * n, 3 * world * shard * 4),
                   f"{call} = {got}: over a ring each rank sends k-1 shards per collective, not "
                   "all k (its own shard is already where it belongs)")
            expect(not near(3 * (world - 1) / world * n),
                   f"{call} = {got}: that forgets the padding: each layer's flat vector is "
                   "padded to a multiple of the world size, so a shard is ceil(numel / world)")
            expect(got == want, f"{call} = {got}, expected {want}")

    return run_check("zero3_sent_bytes", body, fn)


# --- FSDP2 chapter: memory of activations -------------------------------------------------------
def _reference_saved_bytes(f, *inputs):
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    return total[0]


def check_saved_bytes_of_call(fn):
    """fn(f, *inputs) -> bytes of the tensors autograd saves for backward while f(*inputs) runs."""

    def body(fn):
        g = fresh_generator()
        n, d = randint(g, 3, 20), randint(g, 3, 20)
        W = torch.randn(d, d, generator=g, requires_grad=True)
        x = torch.randn(n, d, generator=g, requires_grad=True)
        cases = [("x @ W", lambda x, W: x @ W), ("tanh(x @ W)", lambda x, W: torch.tanh(x @ W)),
                 ("(x @ W).sum() (no tanh)", lambda x, W: (x @ W).sum()),
                 ("x * 2 + 1 (saves nothing)", lambda x, W: x * 2 + 1)]
        for what, f in cases:
            want = _reference_saved_bytes(f, x, W)
            got = fn(f, x, W)
            expect(isinstance(got, (int, float)) and not isinstance(got, bool),
                   f"saved_bytes_of_call returned {got!r}, expected a number of bytes")
            out = f(x, W)
            expect(not (got == out.numel() * out.element_size() and got != want),
                   f"for {what} with x {tuple(x.shape)}, W {tuple(W.shape)}: {got} bytes is the "
                   "size of the output, not what autograd saves for backward")
            expect(got == want, f"for {what} with x {tuple(x.shape)}, W {tuple(W.shape)}: "
                                f"{got} bytes, expected {want} (count every tensor the pack hook "
                                "of saved_tensors_hooks receives)")

    return run_check("saved_bytes_of_call", body, fn)


def check_checkpointed_forward(fn):
    """fn(blocks, x) -> the output of the blocks applied in turn, each under activation
    checkpointing (torch.utils.checkpoint.checkpoint, use_reentrant=False)."""

    def body(fn):
        g = fresh_generator()
        d, n, depth = randint(g, 8, 24), randint(g, 4, 12), randint(g, 3, 5)
        torch.manual_seed(randint(g, 0, 10**6))
        blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.Tanh(), nn.Linear(4 * d, d))
                               for _ in range(depth))
        calls = [0]
        for b in blocks:
            b.register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
        x = torch.randn(n, d, generator=g, requires_grad=True)
        plain = x
        for b in blocks:
            plain = b(plain)
        plain_saved = _reference_saved_bytes(lambda x: _seq(blocks, x), x)
        plain.sum().backward()
        want = {k: p.grad.clone() for k, p in blocks.named_parameters()}
        blocks.zero_grad(set_to_none=True)
        calls[0] = 0
        saved = _reference_saved_bytes(lambda x: fn(blocks, x), x)
        out = fn(blocks, x)
        expect(torch.is_tensor(out) and out.requires_grad,
               "the output of checkpointed_forward has no gradient: the checkpointed blocks must "
               "stay in the graph (no torch.no_grad or detach)")
        expect(torch.is_tensor(out) and out.shape == plain.shape and torch.allclose(out, plain,
                                                                                   atol=1e-5),
               "checkpointed_forward returned a different output than applying the blocks")
        calls[0] = 0
        out.sum().backward()
        expect(all(p.grad is not None for p in blocks.parameters()),
               "after backward some parameters have no gradient: the checkpointed blocks must "
               "stay in the graph (no torch.no_grad or detach)")
        for k, p in blocks.named_parameters():
            expect(torch.allclose(p.grad, want[k], atol=1e-5), f"the gradient of {k} differs")
        expect(saved < plain_saved / 2,
               f"autograd saved {saved} bytes, {saved / plain_saved:.0%} of the {plain_saved} "
               "without checkpointing: checkpoint each block, so only its input is kept")
        expect(calls[0] >= depth,
               f"backward ran {calls[0]} block forwards: checkpointing recomputes each block's "
               "forward during backward")

    return run_check("checkpointed_forward", body, fn)


def _seq(blocks, x):
    for b in blocks:
        x = b(x)
    return x


def _blocks_with_saved(g, spec=None, d=None, n=None):
    """Blocks (Linear, `tanhs` Tanh, Linear) whose saved bytes do not follow their parameter
    counts: each Tanh saves its output but has no parameter. spec: [(hidden, tanhs), ...]."""
    d, n = d or randint(g, 4, 10), n or randint(g, 4, 12)
    spec = spec or [(d * randint(g, 1, 4), randint(g, 1, 5)) for _ in range(randint(g, 4, 6))]
    with torch.random.fork_rng(devices=[]):   # leave the notebook's random numbers alone
        torch.manual_seed(randint(g, 0, 10**6))
        blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, h), *[nn.Tanh() for _ in range(r)],
                                             nn.Linear(h, d)) for h, r in spec)
    x = torch.randn(n, d, generator=g, requires_grad=True)
    from torch.utils.checkpoint import checkpoint
    saved, gain, h = [], [], x
    for b in blocks:   # a checkpointed block still keeps its input
        saved.append(_reference_saved_bytes(b, h))
        gain.append(saved[-1] - _reference_saved_bytes(
            lambda h: checkpoint(b, h, use_reentrant=False), h))
        h = b(h)
    return blocks, x, saved, gain


def check_choose_checkpoints(fn):
    """fn(blocks, x, budget) -> the indices of the fewest blocks to checkpoint so that autograd
    saves at most `budget` bytes in a forward of the blocks in turn. Checked by running that
    forward with the chosen blocks checkpointed, under saved_tensors_hooks."""
    from torch.utils.checkpoint import checkpoint

    def body(fn):
        g = fresh_generator()
        for case in range(5):
            if case < 2:   # the blocks with the most parameters are not the ones that save most
                blocks, x, saved, gain = _blocks_with_saved(
                    g, [(32, 1), (16, 5), (16, 5), (32, 1)], d=8, n=64)
                # case 1: one block would do if checkpointing freed all it saves (not its input)
                budget = sum(saved) - (gain[1] + gain[2] if case == 0 else saved[1])
            else:
                blocks, x, saved, gain = _blocks_with_saved(g)
                budget = int(sum(saved) * (0.25 + 0.4 * torch.rand(1, generator=g).item()))
            total = sum(saved)
            got = fn(blocks, x, budget)
            call = f"choose_checkpoints({len(blocks)} blocks, budget {budget} of {total} bytes)"
            try:
                chosen = sorted({int(i) for i in got})
            except (TypeError, ValueError):
                raise CheckFailed(f"{call} returned {got!r}, expected a list of block indices")
            expect(all(0 <= i < len(blocks) for i in chosen),
                   f"{call} returned an index outside 0..{len(blocks) - 1}")

            def run(x):
                for i, b in enumerate(blocks):
                    x = checkpoint(b, x, use_reentrant=False) if i in chosen else b(x)
                return x

            measured = _reference_saved_bytes(run, x)
            expect(measured <= budget,
                   f"{call}: with blocks {chosen} checkpointed autograd saves {measured} bytes, "
                   "over the budget (measure with saved_tensors_hooks what each block saves, "
                   "plainly and checkpointed: a checkpointed block still keeps its input)")
            left, fewest = total, 0
            for s in sorted(gain, reverse=True):
                if left <= budget:
                    break
                left, fewest = left - s, fewest + 1
            expect(len(chosen) == fewest,
                   f"{call}: checkpointed {len(chosen)} blocks {chosen}, {fewest} suffice: each "
                   "checkpoint costs a recompute, so checkpoint first the blocks whose "
                   "checkpointing frees the most bytes (measured, not guessed from parameters "
                   "or position)")

    return run_check("choose_checkpoints", body, fn)
