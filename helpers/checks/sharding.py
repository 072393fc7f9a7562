"""Checks for the exercises of DDP from scratch (Part III); Part V's are in zero.py,
fsdp_scratch.py and fsdp2.py.

They run in this process, on the CPU. Collectives are instrumented by `FakeWorld`: while it is
active, `torch.distributed` believes it is rank `rank` of `world` ranks, and every collective the
answer calls is recorded (name, bytes, async or not, when) and answered with the other ranks'
data, which the check chooses. So a check sees what an answer sends, not only what it returns.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from ._core import expect, fresh_generator, randint, run_check

__all__ = ["FakeWorld", "check_bucket_params", "check_overlap_hooks", "check_average_bucket"]


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
