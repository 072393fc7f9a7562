"""Checks for the exercises of DDP from scratch (Part III).

Communication runs on the harness's World: ranks are threads, `torch.distributed` is the World
while they run, and every collective is recorded (which storage it was handed, its bytes, when it
was launched and when it was waited for) next to the check's own marks ("backward returned").
So a check sees what an answer sent and when, never what it reports.
"""
from itertools import pairwise

import torch
from torch import nn
from torch.nn import functional as F

from .. import DDPFromScratch
from ._core import (
    CheckFailed,
    World,
    check,
    expect,
    fresh_generator,
    randint,
    storage_key,
    tensor_close,
    tensor_equal,
)
from ._core.gradients import grads_left
from ._core.handed import in_place, kept_aside
from ._core.held import Steps, added_attributes
from ._core.inputs import expect_unchanged, kept
from ._core.kept_hooks import recording

__all__ = ["check_bucket_params", "check_overlap_hooks", "check_average_bucket",
           "check_scratch_accumulate"]


def _random_mlp(g, frozen=False, seed=None):
    widths = [randint(g, 3, 12) for _ in range(randint(g, 4, 6))]
    torch.manual_seed(randint(g, 0, 10**6) if seed is None else seed)
    layers = []
    for a, b in pairwise(widths):
        layers += [nn.Linear(a, b), nn.Tanh()]
    net = nn.Sequential(*layers[:-1])
    if frozen:
        net[2].requires_grad_(False)
    return net, widths


def _buckets(params, bucket_mb):
    """The buckets DDPFromScratch makes (reverse order, closed at bucket_mb, frozen left out,
    shared once), written here so that the course's make_buckets can stay blocked."""
    seen, out, current, size = set(), [], [], 0
    limit = None if bucket_mb is None else bucket_mb * 2**20
    for p in reversed(list(params)):
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        current.append(p)
        size += p.numel() * p.element_size()
        if limit is None or size >= limit:
            out.append(current)
            current, size = [], 0
    return out + ([current] if current else [])


@check("bucket_params", references=["make_buckets"], observes=[
    "the buckets returned (lists of the very parameter objects) for a random MLP with a frozen "
    "layer, a bfloat16 last layer and a parameter listed twice, at nine bucket sizes (two of "
    "them 1.5 times the first parameter's bytes, two exactly the total "
    "of the first few parameters, one for each order the one listed twice may take: there a "
    "bucket closed only above bucket_mb shows; two between that total in MiB and in MB: "
    "there a size in MB, not MiB, shows): order, membership, sizes"])
def check_bucket_params(fn):
    """fn(params, bucket_mb) -> list of lists of parameters, as DDPFromScratch buckets them."""
    g = fresh_generator()
    net, _ = _random_mlp(g, frozen=True)
    net[-1].to(torch.bfloat16)       # the first bucket's: a size as numel * 4 shows
    params = list(net.parameters())
    params.insert(randint(g, 0, len(params)), params[-1])          # listed twice (tied)
    names = {id(p): n for n, p in net.named_parameters()}
    sizes = sorted(p.numel() * p.element_size() for p in net.parameters())
    # a parameter listed twice: either occurrence may count. torch keeps the first
    # (parameters() dedupes) and DDP reverses that list; keeping the last is the other way
    first = [p for i, p in enumerate(params) if all(q is not p for q in params[:i])]
    exact = []          # forced: a running total equal to bucket_mb, in either order
    for listed in (params, first):
        order = [b[0] for b in _buckets(listed, None)]
        k = randint(g, 1, len(order) - 1)           # a bucket of k, where > would take k + 1
        total = sum(p.numel() * p.element_size() for p in order[:k])
        # and one between total / 2**20 and total / 10**6: a bucket of k in MB, more in MiB
        exact += [total / 2**20, total * (1 / 2**20 + 1 / 10**6) / 2]
        # and 1.5 times the first (bfloat16) parameter's bytes: closed after it if sized as 4
        exact.append(1.5 * order[0].numel() * order[0].element_size() / 2**20)
    for bucket_mb in (None, sizes[len(sizes) // 2] / 2**20, 1.0, *exact):
        got = fn(list(params), bucket_mb)
        want = _buckets(params, bucket_mb)
        torch_order = _buckets(first, bucket_mb)
        if isinstance(got, (list, tuple)) and [id(p) for b in got for p in b] == [
                id(p) for b in torch_order for p in b]:
            want = torch_order
        call = f"bucket_params(params, {bucket_mb if bucket_mb is None else round(bucket_mb, 6)})"
        expect(isinstance(got, (list, tuple)) and all(isinstance(b, (list, tuple)) for b in got),
               f"{call} returned {type(got).__name__}, expected a list of lists of parameters")
        flat = [p for b in got for p in b]
        expect(all(isinstance(p, torch.Tensor) for p in flat),
               f"{call}: a bucket holds something other than the parameters themselves")
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
               f"{[len(b) for b in want]}: close a bucket as soon as it holds at least "
               "bucket_mb MiB")


def _rank_data(g, widths, world, rows=6):
    return [(torch.randn(rows, widths[0], generator=g), torch.randn(rows, widths[-1], generator=g))
            for _ in range(world)]


def _average_grads(make, data):
    """The gradients DDP must leave: the mean over the ranks of each rank's own gradient."""
    per_rank = []
    for X, y in data:
        net = make()
        F.mse_loss(net(X), y).backward()
        per_rank.append({n: p.grad.clone() for n, p in net.named_parameters()
                         if p.grad is not None})
    return {n: sum(r[n] for r in per_rank) / len(per_rank) for n in per_rank[0]}


@check("overlap_hooks", keeps_hooks=True, observes=[
    "on a World of 2-4 thread ranks with different data each, where all_reduce is the only call "
    "allowed, over three steps (other data; zero_grad between, setting the gradients to None, "
    "then zeroing the same tensors: what finish() leaves behind, pending handles or hooks, "
    "meets the next step): every all_reduce call (the storage it was handed, async or not, "
    "when it was launched and waited for) against the check's own marks "
    "when each gradient became ready and when loss.backward() returned: each all-reduce "
    "launched before the next gradient was ready",
    "the gradients after each step's finish() against the mean of the ranks' own gradients",
    "what finish() and the hooks still hold after each finish(): an earlier step's handles, "
    "futures or gradients"])
def check_overlap_hooks(fn):
    """fn(model) registers hooks that all-reduce each gradient asynchronously as soon as it is
    ready and returns finish(), which waits and averages; run by every rank of a World for three
    steps (a training loop's zero_grad between), since hooks and handles outlive a step."""
    g = fresh_generator()
    world, seed = randint(g, 2, 4), randint(g, 0, 10**6)
    _, widths = _random_mlp(g, frozen=True, seed=seed)
    steps = [_rank_data(g, widths, world) for _ in range(3)]

    def make():
        torch.manual_seed(seed)
        layers = []
        for a, b in pairwise(widths):
            layers += [nn.Linear(a, b), nn.Tanh()]
        net = nn.Sequential(*layers[:-1])
        net[2].requires_grad_(False)
        return net
    w = World(world, allow={"all_reduce"}, record_ops=True)
    # per rank and step: the storage of each gradient once ready, (seq, name) as each became so
    grads_at_hook = [[dict() for _ in steps] for _ in range(world)]
    ready = [[[] for _ in steps] for _ in range(world)]
    now = [0] * world                        # the step each rank is in
    nets = [make() for _ in range(world)]   # here: thread ranks would share torch's seed

    def _ready(rank, n, p):
        grads_at_hook[rank][now[rank]][n] = storage_key(p.grad)
        ready[rank][now[rank]].append((w.mark(f"{n} ready"), n))

    def rank_fn(comm):
        net, out = nets[comm.rank], []
        with recording() as hooks, added_attributes() as added:   # held.py walks from them too
            finish = fn(net)
            expect(callable(finish), "overlap_hooks(model) must return a function finish()")
            held = Steps(lambda: [finish, *hooks(), net, *net.parameters(), *added()])
            for n, p in net.named_parameters():   # which storage holds each gradient, once ready
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(lambda p, n=n: _ready(comm.rank, n, p))
            for step, data in enumerate(steps):
                now[comm.rank] = step
                begin = w.mark(f"step {step + 1} begins")
                net.zero_grad(set_to_none=step < 2)  # step 3 reuses step 2's .grad, zeroed
                X, y = data[comm.rank]
                F.mse_loss(net(X), y).backward()
                mark = w.mark("backward returned")
                finish()
                out.append((begin, mark, {n: p.grad.clone() if p.grad is not None else None
                                          for n, p in net.named_parameters()},
                            held.stale([p.grad for p in net.parameters()])))
        return out
    results = w.run(rank_fn)
    for step, data in enumerate(steps):
        want = _average_grads(make, data)       # the expected gradients, after the answer ran
        for r, out in enumerate(results):
            begin, mark, grads, _ = out[step]
            end = out[step + 1][0] if step + 1 < len(out) else float("inf")
            calls = [m for m in w.sent("all_reduce", rank=r) if begin < m.seq < end]
            _judge_step(f"step {step + 1}: " if step else "", calls, mark, want, grads,
                        grads_at_hook[r][step], ready[r][step], world)
            for n in want:
                w.expect_from_messages(r, grads[n], f"{n}.grad", world)
    for step in range(1, len(steps)):
        stale = max(out[step][3] for out in results)
        expect(not stale, f"step {step + 1}: after finish() your code still holds {stale} "
                          "all-reduce handle(s), future(s) or gradient(s) of an earlier step: "
                          "clear the pending list in finish() every step (handles.clear()), "
                          "or it grows by one entry per gradient each step and keeps every "
                          "step's gradients alive")


def _judge_step(when, calls, mark, want, grads, keys, ready, world):
    """One rank's all-reduces and gradients of one step (`when` names the step)."""
    expect(calls, f"{when}no all_reduce was called")
    expect(all(m.async_op for m in calls),
           f"{when}all_reduce was called without async_op=True: backward then waits for every "
           "all-reduce instead of overlapping it")
    late = [m for m in calls if m.seq > mark]
    expect(not late, f"{when}{len(late)} of the {len(calls)} all-reduces were launched after "
                     "backward returned (in finish()): launch each from its gradient's hook, "
                     "during backward, so communication overlaps the rest of backward")
    # every one was waited for: a rank that ends with one unwaited fails the run (waits.py)
    early = [m for m in calls if m.waited < mark]
    expect(not early, f"{when}{len(early)} all-reduce(s) were waited for inside backward (in "
                      "the hook): backward then stalls on every gradient; wait only in finish()")
    own = set(keys.values())
    expect(all(m.key in own for m in calls),
           f"{when}an all-reduce was handed a tensor that is not a parameter's .grad (a clone "
           "or a copy): its result never reaches the gradient; all-reduce p.grad itself")
    _launched_when_ready(calls, keys, ready, mark)
    trainable = len(want)
    expect(len(calls) == trainable,
           f"{when}{len(calls)} all-reduces for {trainable} trainable parameters: one each "
           "(frozen ones have nothing to reduce)" + (": hooks registered again for the next "
                                                    "step add a second all-reduce of each "
                                                    "gradient" if when else ""))
    expect(grads["2.weight"] is None, "a frozen parameter got a gradient")
    for n, avg in want.items():
        got = grads[n]
        expect(got is not None, f"{when}{n} has no gradient after finish()")
        expect(not tensor_close(got, avg * world, atol=1e-6),
               f"{when}{n}.grad is the sum over the {world} ranks: divide it by the world size")
        expect(tensor_close(got, avg, atol=1e-6),
               f"{when}{n}.grad after finish() is {float(got.norm()):.4g} in norm, expected the "
               f"average over the ranks, {float(avg.norm()):.4g}" + (
                   ": what an earlier step left behind (handles never cleared, hooks "
                   "registered again) acted on this one" if when else ""))


def _launched_when_ready(calls, keys, ready, mark):
    """Each gradient's all-reduce launched before the next gradient was ready (the last one's
    before backward returned): one launch per hook, as it fires, not all of them at the end of
    backward (from the last hook, or from a callback queued to run after it)."""
    name = {key: n for n, key in keys.items()}
    after = {n: seq for (_, n), (seq, _) in zip(ready, ready[1:] + [(mark, None)], strict=True)}
    for m in calls:
        n = name.get(m.key)
        if n in after and m.seq > after[n]:
            nxt = next((later for (_, earlier), (_, later) in pairwise(ready)
                        if earlier == n), None)
            raise CheckFailed(
                f"the all-reduce of {n}.grad was launched after {nxt}.grad was ready too: "
                "launch each all-reduce from its own gradient's hook, as soon as that gradient "
                "is ready, so it overlaps the rest of backward (not all together at the end)")


@check("average_bucket", changes_inputs=True, observes=[
    "on a World of 2-4 thread ranks with different gradients: every call between the ranks "
    "(all_reduce only, one per rank, its bytes) and the gradients afterwards (the same tensor "
    "objects, in place)"])
def check_average_bucket(fn):
    """fn(grads) averages a bucket of gradients over the ranks, in place, with ONE all-reduce of
    a flat buffer; run by every rank of a World whose ranks hold different gradients."""
    g = fresh_generator()
    for case in range(2):
        world, count = randint(g, 2, 4), randint(g, 3, 6)
        if case == 0 and count == world:    # one bucket whose tensors do not number the ranks
            count = world + 1
        shapes = [tuple(randint(g, 1, 6) for _ in range(randint(g, 1, 2))) for _ in range(count)]
        data = [[torch.randn(s, generator=g) for s in shapes] for _ in range(world)]
        n = sum(t.numel() for t in data[0])
        # allow: a decoy all_reduce beside all_gathers fails
        w = World(world, allow={"all_reduce"}, record_ops=True)

        def rank_fn(comm, data=data):
            grads = [t.clone() for t in data[comm.rank]]
            given = kept_aside(grads)
            fn(grads)
            return grads, given
        results = w.run(rank_fn)
        want = torch.stack([torch.cat([t.reshape(-1) for t in d]) for d in data]).mean(0)
        call = f"average_bucket ({len(shapes)} gradients {shapes}, world {world})"
        for r in range(world):
            calls = w.sent("all_reduce", rank=r)
            expect(calls, f"{call} called no all_reduce")
            expect(len(calls) == 1, f"{call} made {len(calls)} all-reduces, expected one: "
                                    "flatten the bucket into one buffer, so it pays the latency "
                                    "of one message")
            nbytes = w.traffic(r).payload_bytes("all_reduce")
            expect(nbytes == 4 * n, f"{call} all-reduced {nbytes} bytes, expected the whole "
                                    f"bucket, {4 * n}")
        for r, (grads, given) in enumerate(results):
            grads = in_place(f"{call} on rank {r}", grads, given)
            expect([tuple(t.shape) for t in grads] == shapes,
                   f"{call} reshaped the gradient tensors: write into them in place")
            got = torch.cat([t.reshape(-1) for t in grads])
            mine = torch.cat([t.reshape(-1) for t in data[r]])
            expect(not tensor_equal(got, mine),
                   f"{call} left the gradients unchanged: the flat buffer is a copy, copy its "
                   "averaged slices back into each gradient")
            expect(not tensor_close(got, want * world, atol=1e-5),
                   f"{call} left the sum over the ranks: divide by the world size")
            expect(tensor_close(got, want, atol=1e-5),
                   f"{call}: the gradients are not the average over the ranks (copy slice i of "
                   "the buffer back into gradient i, in order)")
            for i, t in enumerate(grads):
                w.expect_from_messages(r, t, f"gradient {i}", world)


@check("scratch_accumulate", observes=[
    "a real DDPFromScratch on a World of 2-3 thread ranks, never as many micro-batches as ranks: "
    "the backward passes per micro-batch and their order with the forwards (counted by hooks), "
    "the all_reduce calls of the step, "
    "any refusal the wrapper raised",
    "the gradients after the step against the mean-loss gradient over every rank's "
    "micro-batches"])
def check_scratch_accumulate(fn):
    """fn(model, loss_fn, micro_batches): one accumulation step with helpers.DDPFromScratch,
    every micro-batch forward and backward, one all-reduce per bucket, ending with finish."""
    g = fresh_generator()
    # never as many micro-batches as ranks (3..4 but world): a loss divided by the world size
    # instead of the micro-batch count shows; three or more, so the no_sync forwards batched
    # before their backwards show
    world, k = randint(g, 2, 3), randint(g, 3, 4)
    k += k == world
    seed = randint(g, 0, 10**6)
    _, widths = _random_mlp(g, seed=seed)
    data = [[(torch.randn(3, widths[0], generator=g), torch.randn(3, widths[-1], generator=g))
             for _ in range(k)] for _ in range(world)]

    def make():
        torch.manual_seed(seed)
        layers = []
        for a, b in pairwise(widths):
            layers += [nn.Linear(a, b), nn.Tanh()]
        return nn.Sequential(*layers[:-1])
    given = [t for d in data for pair in d for t in pair]
    copies = kept(*given)
    w = World(world, timeout=15)
    backwards = [0] * world
    passes = [[] for _ in range(world)]             # "forward" / "backward", in order, per rank

    nets = [make() for _ in range(world)]   # here: thread ranks would share torch's seed

    def rank_fn(comm):
        model = DDPFromScratch(net := nets[comm.rank])
        first = next(p for p in net.parameters())
        first.register_post_accumulate_grad_hook(
            lambda p: passes[comm.rank].append("backward") or backwards.__setitem__(
                comm.rank, backwards[comm.rank] + 1))
        net.register_forward_pre_hook(lambda mod, args: passes[comm.rank].append("forward"))
        before = len(w.sent("all_reduce", rank=comm.rank))
        fn(model, nn.MSELoss(), list(data[comm.rank]))
        calls = len(w.sent("all_reduce", rank=comm.rank)) - before
        expect(model.synchronized, "the step ended with gradients not yet averaged: call "
                                   "model.finish_gradient_synchronization() at the end")
        return calls, len(model.buckets), grads_left(net.named_parameters(), f"rank {comm.rank}")
    results = w.run(rank_fn)
    expect_unchanged("scratch_accumulate", copies, given, ["a micro-batch"] * len(given))
    whole = [(torch.cat([X for X, _ in d]), torch.cat([y for _, y in d])) for d in data]
    want = _average_grads(make, whole)           # the expected gradients, after the answer ran
    for r, (calls, buckets, grads) in enumerate(results):
        expect(backwards[r] == k, f"rank {r} ran {backwards[r]} backward pass(es) for {k} micro-"
                                  "batches: each micro-batch needs its own forward and backward "
                                  "(that is what keeps the memory of one micro-batch)")
        expect(passes[r] == ["forward", "backward"] * k,
               f"rank {r} ran its forwards and backwards in the order {passes[r]}: run each "
               "micro-batch's backward right after its forward (accumulation keeps one "
               "micro-batch's activations alive at a time, never one graph of them all)")
        expect(calls == buckets, f"rank {r} made {calls} all-reduces for {buckets} buckets: "
                                 "communicate once per step, not once per micro-batch (all but "
                                 "the last micro-batch inside `with model.no_sync():`)")
        for n, avg in want.items():
            if tensor_close(grads[n], avg * k, atol=1e-5):
                expect(False, f"the gradients are {k}x too large: divide each micro-batch's loss "
                              f"by the number of micro-batches ({k})")
            expect(k == world or not tensor_close(grads[n], avg * k / world, atol=1e-5),
                   f"rank {r}: each micro-batch's loss was divided by the world size ({world}): "
                   f"divide it by the number of micro-batches ({k}); the all-reduce already "
                   "averages over the ranks")
            expect(tensor_close(grads[n], avg, atol=1e-5),
                   f"rank {r}: {n}.grad is not the gradient of the mean loss over all the "
                   "micro-batches, averaged over the ranks")
