"""Checks for the exercises of Part V's ZeRO chapter (book/part5/zero.ipynb).

Partitions are judged by the loads they make against the greedy bound on cases where dealing
sorted tensors out without looking at the loads is worse; optimizers by the values they step to;
collectives by what a World of thread ranks saw travel (dist.* calls of every correct form).
qwZ's gather (ZeRO's variants) by the bytes every rank handed to the network and by the error of
every element against the bound of its own block: half a step of round-to-nearest with that
block's scale (its largest |value| / 127).
"""
import torch
from torch import nn
from torch.nn import functional as F

from .. import Zero2
from ._core import (
    CheckFailed,
    World,
    as_int,
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
from ._qwz_draws import bounds as _bounds
from ._qwz_draws import shards as _shards

__all__ = ["check_partition", "check_zero1_optimizer", "check_grad_shard",
           "check_accumulate_zero2", "check_mixed_zero_bytes", "check_qwz_all_gather"]


def _owners(fn, sizes, world, call):
    got = fn(list(sizes), world)
    if isinstance(got, torch.Tensor):
        got = got.tolist()
    try:
        got = [as_int(r, call) for r in got]
    except TypeError:
        raise CheckFailed(f"{call} returned {got!r}, expected a list of ranks") from None
    expect(len(got) == len(sizes), f"{call} returned {len(got)} owners for {len(sizes)} tensors")
    expect(all(0 <= r < world for r in got), f"{call} returned a rank outside 0..{world - 1}")
    return got


def _greedy_max(sizes, world):
    """The largest load of largest-first-to-the-least-loaded (unique whatever the ties)."""
    load = [0] * world
    for s in sorted(sizes, reverse=True):
        load[load.index(min(load))] += s
    return max(load)


@check("partition", references=["partition_by_size"], observes=[
    "the loads the returned owners make, on fresh sizes and on cases where dealing sorted "
    "tensors out in turn (round-robin or snake), by index, or in contiguous runs is worse",
    "the largest load against that of largest-first-to-the-least-loaded (any answer at least "
    "as good passes)"])
def check_partition(fn):
    """fn(sizes, world) -> the owning rank of each tensor: largest first, each to the least
    loaded rank (or any partition whose largest load is no larger)."""
    g = fresh_generator()
    cases = [([randint(g, 1, 1000) for _ in range(randint(g, 6, 20))], randint(g, 2, 5))
             for _ in range(4)]
    cases += [([1000, 10] * 4, 2), ([1000] * 4 + [10] * 4, 2),      # by index, contiguous
              ([10, 9, 8, 1, 1, 1], 2),                              # sorted round-robin, snake
              ([7, 7, 6, 6, 5, 4, 4, 4], 3), ([5000] + [10] * 9, 4)]
    perm = torch.randperm(6, generator=g).tolist()
    cases.append(([[10, 9, 8, 1, 1, 1][i] for i in perm], 2))        # the same, shuffled
    for sizes, world in cases:
        call = f"partition({sizes}, {world})"
        owners = _owners(fn, sizes, world, call)
        load = [sum(s for s, r in zip(sizes, owners, strict=True) if r == k) for k in range(world)]
        best = _greedy_max(sizes, world)
        expect(max(load) <= best,
               f"{call}: the ranks hold {load} elements, the largest {max(load)}; giving each "
               f"tensor, largest first, to the rank with the least load so far gives at most "
               f"{best}. Dealing tensors out in a fixed order never looks at the loads")


# partition_by_size is not a reference: check_partition's answer, which this exercise offers
@check("zero1_optimizer", references=["ShardedOptimizer"], observes=[
    "the optimizer returned on every rank of a fresh world: its class, learning rate and what "
    "one step does to each parameter (against torch.optim.AdamW with that lr)",
    "which parameters each rank steps and the bytes of state it holds: one owner each, "
    "balanced by size (wide matrices and tall, thin ones in one case, where the first "
    "dimension orders them the other way, and the same transposed, where the last does; and "
    "small ones before each big one, where the least loaded rank in turn, unsorted, is worse)"])
def check_zero1_optimizer(fn):
    """fn(params, rank, world, lr) -> a torch.optim.AdamW over this rank's share of params."""
    g = fresh_generator()
    for adjacent, flipped in ((False, False), (True, False), (True, True)):
        world = randint(g, 2, 4)
        lr = [1e-2, 3e-3, 0.05][randint(g, 0, 2)]
        big, small = (randint(g, 20, 30), randint(g, 20, 30)), (randint(g, 2, 5),)
        if adjacent:    # big and wide, small and tall: balanced by len(p), the first dimension,
            # the 2 * world + 1 tall ones fill the ranks first and two big ones share a rank
            big, small = (2, randint(g, 150, 200)), (randint(g, 35, 45), 1)
        if flipped:     # the same, transposed: balanced by p.shape[-1], the last dimension
            big, small = big[::-1], small[::-1]
        # a big matrix after every world - 1 small ones (dealt by index, or to the least loaded
        # rank unsorted: two share a rank), or one per rank first (runs by count: two on rank 0)
        shapes = [big if (i < world if adjacent else i % world == world - 1) else small
                  for i in range(3 * world + 1)]
        start = [torch.randn(s, generator=g) for s in shapes]
        grads = [torch.randn(s, generator=g) for s in shapes]
        owned = {}
        for rank in range(world):
            params = [nn.Parameter(t.clone()) for t in start]
            opt = fn(params, rank, world, lr)
            call = f"zero1_optimizer(params, rank {rank}, world {world}, lr {lr})"
            expect(isinstance(opt, torch.optim.Optimizer),
                   f"{call} returned {type(opt).__name__}, expected a torch optimizer")
            expect(isinstance(opt, torch.optim.AdamW),
                   f"{call} returned {type(opt).__name__}: the exercise asks for torch.optim.AdamW "
                   "(Adam's weight decay is coupled to the gradient; AdamW's is not)")
            for grp in opt.param_groups:    # a tensor lr (torch.compile's form) is float32
                got, dtype = as_number(grp["lr"], f"{call}'s learning rate", with_dtype=True)
                expect(near(got, lr, dtype), "{}: the optimizer's learning rate is {}, not {}"
                       .format(call, *shown(got, lr)))
            for p, gr in zip(params, grads, strict=True):
                p.grad = gr.clone()
            opt.step()
            stepped = [i for i, (p, b) in enumerate(zip(params, start, strict=True))
                       if not tensor_equal(p, b)]
            state = sum(v.numel() * v.element_size() for st in opt.state.values()
                        for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
            total = 8 * sum(p.numel() for p in params)
            expect(len(stepped) < len(shapes),
                   f"rank {rank} of {world} stepped every parameter and holds {state} bytes of "
                   f"optimizer state, {state / total:.0%} of the unsharded {total}: ZeRO-1 keeps "
                   "about 1/world (build the optimizer over this rank's parameters only)")
            expect(state == 8 * sum(params[i].numel() for i in stepped),
                   f"rank {rank}: the optimizer state does not match the parameters it stepped")
            for i in stepped:   # one AdamW step from the same start: the values of AdamW
                q = nn.Parameter(start[i].clone())
                q.grad = grads[i].clone()
                torch.optim.AdamW([q], lr=lr).step()
                expect(tensor_close(params[i], q, atol=1e-6),
                       f"{call}: parameter {i} moved to other values than one AdamW step (lr {lr}, "
                       "default weight decay) gives")
                expect(i not in owned, f"parameter {i} is stepped by ranks {owned.get(i)} and "
                                       f"{rank}: each parameter has exactly one owner")
                owned[i] = rank
        missing = sorted(set(range(len(shapes))) - set(owned))
        expect(not missing, f"no rank steps parameters {missing}")
        sizes = [torch.Size(s).numel() for s in shapes]
        load = [sum(n for i, n in enumerate(sizes) if owned[i] == r) for r in range(world)]
        expect(max(load) <= _greedy_max(sizes, world),
               f"world {world}: the ranks own {load} elements (optimizer state "
               f"{[8 * n for n in load]} bytes): balance them by size in elements, p.numel() "
               "(len(p) is only the first dimension), so each holds about 1/world (dealing "
               "parameters out by index, or in contiguous runs, never looks at sizes)")


_NOT_RS = {"all_reduce": "it sends twice what a reduce-scatter sends and leaves the whole "
           "gradient on every rank; ZeRO-2 reduce-scatters",
           "all_gather": "gathering every rank's whole gradient to average a slice by hand "
           "moves world times the data; ZeRO-2 reduce-scatters"}


@check("grad_shard", references=["reduce_scatter_flat"], observes=[
    "every collective each rank of a fresh world of thread ranks calls (list or tensor form; "
    "an async one waited for), and the bytes it hands over (one padded case on 3 or 4 ranks)",
    "the returned slice against the average of every rank's padded gradient, in the "
    "gradient's dtype (one case in bfloat16)"])
def check_grad_shard(fn):
    """fn(flat_grad) -> this rank's averaged shard of the flat gradient (padded to a multiple
    of the world size), through one reduce-scatter. Run on every rank of a world."""
    g = fresh_generator()
    half = randint(g, 0, 2)     # forced, in a fresh case: bfloat16 gradients, as mixed precision
    for case in range(3):
        # forced: the padded case on 3 or 4 ranks (on 2, a pad of n % world is -n % world's)
        world, n = randint(g, 3 if case == 0 else 2, 4), randint(g, 5, 40)
        if case < 2:     # one padded, one that the world size divides (no padding at all)
            n = world * randint(g, 2, 6) + (1 - case)
        dtype, tol = (torch.bfloat16, 1e-2) if case == half else (torch.float32, 1e-5)
        grads = [torch.randn(n, generator=g).to(dtype) for _ in range(world)]
        # any other collective beside the reduce-scatter would be its substitute (a decoy
        # reduce-scatter, the gradients all-gathered and averaged by hand)
        w = World(world, record_ops=True, allow={"reduce_scatter"}, why=_NOT_RS)
        got = w.run(lambda comm, grads=grads: fn(grads[comm.rank].clone()))
        pad = -n % world
        full = torch.cat([sum(t.float() for t in grads), torch.zeros(pad)]) / world
        call = f"grad_shard ({world} ranks, {n} {str(dtype)[6:]} gradients)"
        for r in range(world):
            rs = w.sent("reduce_scatter", rank=r)
            expect(len(rs) == 1, f"{call}: rank {r} made {len(rs)} reduce-scatters, expected one")
            nbytes = w.traffic(r).payload_bytes("reduce_scatter")
            expect(nbytes in (4 * (n + pad), dtype.itemsize * (n + pad)),    # float32, or not
                   f"{call}: rank {r} reduce-scattered {nbytes} bytes; pad the {n} "
                   f"gradients to {n + pad} (a multiple of the world size) and send them once")
            want = full.chunk(world)[r]
            out = got[r]
            expect(torch.is_tensor(out) and out.shape == want.shape,
                   f"{call}: rank {r} returned shape {tuple(getattr(out, 'shape', ()))}, "
                   f"expected {tuple(want.shape)} (1/world of the padded gradient)")
            expect_dtype(out, dtype, f"{call}: rank {r}'s shard")
            expect(not (want.abs().max() > 1e-3 and tensor_close(out, want * world, tol, tol)),
                   f"{call}: rank {r} returned the sum over the ranks: divide by the world size")
            expect(tensor_close(out, want, tol, tol),
                   f"{call}: rank {r} returned the wrong values: expected its slice of the "
                   "averaged gradient")
            w.expect_from_messages(r, out, "shard", world)


def _mlp(seed, d, h, k):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(d, h), nn.Tanh(), nn.Linear(h, k))


@check("accumulate_zero2", changes_inputs=True, references=[], observes=[
    "the weights after the answer's step with helpers.Zero2 on every rank of a fresh world, "
    "against one process on all micro-batches (plain SGD with lr 1: the step is the averaged "
    "gradient itself, so a gradient scaled by any factor shows); micro-batches of one size "
    "(2 to 4 rows), never as many as the ranks",
    "the reduce-scatters each rank ran: one per bucket per step (no_sync until the last "
    "micro-batch), not one per micro-batch; whether the last backward ran outside no_sync "
    "(Zero2's finish reduces a step whose backwards all ran under it, DDP and FSDP2 never do)",
    "the forwards and backwards each rank's model ran, in order: one backward right after each "
    "micro-batch's forward"])
def check_accumulate_zero2(fn):
    """fn(model, micro_batches) -> one optimizer step of a helpers.Zero2 `model` over the list
    of (X, y) micro-batches: each loss divided by their number, full gradients kept under
    no_sync() until the last backward, then finish and step. Clearing the gradients after
    it (the worked answer's zero_grad) is not judged: the exercise's text does not ask it.
    The micro-batches are of one size, so the mean of their mean losses is the mean loss over
    all their rows (Part III's check_accumulate_gradients weighs unequal ones by their rows):
    both weightings are right here."""
    g = fresh_generator()
    # never as many micro-batches as ranks (3..4 but world): a loss divided by the world size
    # shows; three or more, so the no_sync forwards batched before their backwards show; two
    # rows or more each: a summed loss (reduction="sum") divided by m shows
    world, m = randint(g, 2, 3), randint(g, 3, 4)
    m += m == world
    d, h, k, b = randint(g, 3, 7), randint(g, 3, 9), randint(g, 2, 4), randint(g, 2, 4)
    seed = randint(g, 0, 10**6)
    sizes = [b] * m
    X = [torch.randn(world * s, d, generator=g) for s in sizes]
    y = [torch.randint(0, k, (world * s,), generator=g) for s in sizes]
    batches = [(a.clone(), b.clone()) for a, b in zip(X, y, strict=True)]   # for the reference
    w = World(world)
    nets = [_mlp(seed, d, h, k) for _ in range(world)]   # built here: threads share one RNG
    seen = [[] for _ in range(world)]                     # the rows of every forward, per rank
    passes = [[] for _ in range(world)]                   # "forward" / "backward", in order
    for r, net in enumerate(nets):
        net.register_forward_pre_hook(lambda mod, args, r=r: seen[r].append(args[0].shape[0]))
        net.register_forward_pre_hook(lambda mod, args, r=r: passes[r].append("forward"))
        next(net.parameters()).register_post_accumulate_grad_hook(
            lambda p, r=r: passes[r].append("backward"))

    synced = [[] for _ in range(world)]     # per backward: whether it ran outside no_sync

    def rank(comm):
        # SGD, not an adaptive optimizer: AdamW's first step, about lr * sign(g), is blind to
        # the gradient's scale (every loss left undivided by m would pass)
        model = Zero2(nets[comm.rank], torch.optim.SGD, lr=1.0)
        next(nets[comm.rank].parameters()).register_post_accumulate_grad_hook(
            lambda p, r=comm.rank: synced[r].append(model.__dict__.get("_sync") is True))
        rows = [slice(comm.rank * s, (comm.rank + 1) * s) for s in sizes]
        fn(model, [(X[i][rows[i]], y[i][rows[i]]) for i in range(m)])
        return model, {n: p.detach().clone() for n, p in model.module.named_parameters()}
    out = w.run(rank)
    ref = _mlp(seed, d, h, k)                             # the reference after the answer ran
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    opt = torch.optim.SGD(ref.parameters(), lr=1.0)
    F.cross_entropy(ref(torch.cat([a for a, _ in batches])),      # one process, every row
                    torch.cat([b for _, b in batches])).backward()
    opt.step()
    call = f"accumulate_zero2 ({world} ranks, {m} micro-batches of {sizes} rows per rank)"
    buckets = len(out[0][0].buckets)
    for r, (_model, got) in enumerate(out):
        expect(max(seen[r], default=0) <= max(sizes),
               f"{call}: rank {r}'s model ran forwards of {seen[r]} rows: run one forward and "
               "one backward per micro-batch (accumulation keeps one micro-batch's activations "
               "alive at a time, never the concatenated batch)")
        expect(passes[r] == ["forward", "backward"] * (len(passes[r]) // 2),
               f"{call}: rank {r} ran {passes[r].count('forward')} forwards and "
               f"{passes[r].count('backward')} backwards in the order {passes[r]}: run one "
               "backward per micro-batch, right after its forward (accumulation keeps one "
               "micro-batch's activations alive at a time, never one graph of them all)")
        rs = len(w.sent("reduce_scatter", rank=r))
        expect(rs <= buckets,
               f"{call}: rank {r} ran {rs} reduce-scatters for {buckets} buckets: one per "
               "micro-batch. Keep the full gradients under model.no_sync() for all but the "
               "last backward, so each bucket is reduced once per step")
        expect(rs == buckets, f"{call}: rank {r} ran {rs} reduce-scatters, expected {buckets}: "
                              "call finish_gradient_synchronization() before step()")
        expect(synced[r][-1:] != [False],
               f"{call}: rank {r} ran every backward under model.no_sync(): Zero2's finish "
               "reduced what they kept, but DDP and FSDP2 never synchronise gradients kept "
               "under no_sync (each rank would step on its own). Run the last backward "
               "outside no_sync(): it reduces them, once")
        for n, p in ref.named_parameters():
            gap = float((got[n] - p.detach()).abs().max())
            scaled = m * (start[n] - p.detach())    # the step of losses left undivided by m
            expect(gap <= 2e-5 or not tensor_close(start[n] - got[n], scaled, atol=2e-5),
                   f"{call}: your step moved {n} by {m} times the averaged gradient: divide "
                   f"each micro-batch's loss by their number ({m}), so that the gradients "
                   "accumulate to the mean over the micro-batches, not their sum")
            by_world = m / world * (start[n] - p.detach())   # each loss divided by world
            expect(gap <= 2e-5 or not tensor_close(start[n] - got[n], by_world, atol=2e-5),
                   f"{call}: your step moved {n} by {m}/{world} of the averaged gradient: each "
                   f"loss was divided by the world size ({world}); divide it by the number of "
                   f"micro-batches ({m}): Zero2's reduce-scatter already averages over the ranks")
            expect(gap <= 2e-5,
                   f"{call}: after your step {n} differs from one process on all the "
                   f"micro-batches by {gap:.1e} (divide each loss by the number of "
                   "micro-batches; zero_grad only after the step)")


@check("mixed_zero_bytes", references=["sharding_costs"], observes=[
    "the number returned for each stage and fresh world sizes, against the mixed-precision "
    "accounting (bf16 weights and gradients, fp32 master weights, momentum and variance)"])
def check_mixed_zero_bytes(fn):
    """fn(stage, k) -> bytes per parameter one rank holds in mixed-precision Adam training:
    2 (bf16 weights) + 2 (bf16 gradients) + 12 (fp32 master, momentum, variance), sharded by k
    from stage "zero1" (the 12), "zero2" (and the gradients), "zero3" (and the weights)."""
    g = fresh_generator()
    for k in (1, randint(g, 2, 5), randint(g, 6, 64)):
        for stage in ("dp", "zero1", "zero2", "zero3"):
            call = f"mixed_zero_bytes({stage!r}, {k})"
            got, dtype = as_number(fn(stage, k), call, with_dtype=True)
            want = {"dp": 16, "zero1": 4 + 12 / k, "zero2": 2 + 14 / k,      # after the call
                    "zero3": 16 / k}[stage]
            if near(got, want, dtype, 16, 1e-9, max(1, want)):
                continue
            fp32 = {"dp": 16, "zero1": 8 + 8 / k, "zero2": 4 + 12 / k, "zero3": 16 / k}[stage]
            whole = {"dp": 16, "zero1": 8 + 8 / k, "zero2": 6 + 10 / k, "zero3": 4 + 12 / k}
            master = ("the 4 bytes of fp32 master weights kept whole: ZeRO-1 shards them with "
                      "the momentum and variance (the 12 bytes of fp32 state)")
            expect(not near(got, whole[stage], dtype, 16, 1e-9) or stage == "zero1",
                   f"{call} = {got:g}: that keeps {master}")
            same = {"zero1": f" (or, the same number, {master})",
                    "zero2": " (or, the same number, ZeRO-2 with the 2 bytes of bf16 gradients "
                             "left whole: ZeRO-2 shards them too, 2 + (2 + 12) / k)"}.get(stage, "")
            expect(not near(got, fp32, dtype, 16, 1e-9),
                   f"{call} = {got:g}: that is float32 training's 4 + 4 + 8{same}; mixed "
                   "precision keeps 2 + 2 bytes of bf16 weights and gradients and 12 of fp32 "
                   "state")
            gs, ws = shown(got, want)
            raise CheckFailed(
                f"{call} = {gs}, expected {ws}: ZeRO-1 shards the 12 bytes of fp32 state, "
                "ZeRO-2 the 2 of gradients too, ZeRO-3 the 2 of weights too"
                f"{rounding_note(got, want, dtype)}")


# --- ZeRO's variants: qwZ's quantized gather ---------------------------------------------------
@check("qwz_all_gather", references=["quantized_all_gather", "quantize_blocks",
                                     "dequantize_blocks"], observes=[
    "the bytes every rank of a fresh world of thread ranks hands to its collectives (at most "
    "one int8 per element and one float32 scale per block, padding included)",
    "every returned element against the same element of every rank's shard, within half a "
    "round-to-nearest step of its own block (blocks whose sizes differ by up to 10**5)"])
def check_qwz_all_gather(fn):
    """fn(shard, block) -> every rank's float32 shard, in rank order, gathered as int8 values
    with one float32 scale per `block` consecutive elements (largest |value| / 127), then
    dequantized. Run on every rank of a world."""
    g = fresh_generator()
    for case in range(3):
        world, block = randint(g, 2, 4), [16, 32, 64][randint(g, 0, 2)]
        n = block * randint(g, 3, 6) - (0 if case == 0 else randint(g, 1, block // 4))
        shards = _shards(g, world, n, block)
        w = World(world, record_ops=True, allow={"all_gather"})
        pieces = [s.clone() for s in shards]   # each rank's copy (the answer may write it)
        got = w.run(lambda comm, pieces=pieces, block=block: fn(pieces[comm.rank], block))
        call = f"qwz_all_gather ({world} ranks, {n} elements each, block {block})"
        want = torch.cat(shards)
        bound = torch.cat([_bounds(s, block) for s in shards])
        blocks = -(-n // block)
        limit = blocks * block + 4 * blocks
        for r in range(world):
            sent = w.traffic(r).payload_bytes()
            expect(sent > 0, f"{call}: rank {r} sent nothing: gather the other ranks' shards "
                             "with dist.all_gather_into_tensor")
            expect(sent <= limit,
                   f"{call}: rank {r} handed {sent} bytes to its collectives; {n} int8 values "
                   f"(padded to {blocks} blocks) and one float32 scale per block are {limit}. "
                   "float32 would be 4 bytes per element, bfloat16 2: quantize before the "
                   "all-gather")
            out = got[r]
            expect(torch.is_tensor(out) and out.numel() == want.numel(),
                   f"{call}: rank {r} returned {getattr(out, 'shape', type(out).__name__)}, "
                   f"expected {world * n} elements (every rank's shard, padding dropped)")
            err = (out.detach().reshape(-1).double() - want.double()).abs()
            bad = err > bound.double() * (1 + 1e-5) + 1e-12
            if bad.any():
                i = int(bad.nonzero()[0])
                expect(False,
                       f"{call}: rank {r}'s element {i} is {float(err[i]):.2e} from the true "
                       f"value; its block's scale allows {float(bound[i]):.2e}. Use a scale "
                       "per block (its largest |value| / 127), round to the nearest integer, "
                       "and gather each rank's scales with its values")
            w.expect_from_messages(r, out, "gathered shards", world)
