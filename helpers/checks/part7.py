"""Checks for the exercises of Part VII: context parallelism, expert parallelism, 3-D layouts.

Functions that communicate run on the harness's World of thread ranks, whose network records
every message: a check judges what an answer sent and to whom, not only the numbers it
returned. The others run on fresh random inputs, sized so that the shortcuts
learners take (the contiguous split, a softmax that overflows, ignoring the replicated part
of a layer) give numbers the right answer does not.
"""
import collections
import math

import torch

from ..context_parallel.scratch import attention_reference, split_positions
from ..costs import ring_allreduce_bytes
from ..transformer_costs import activation_bytes_per_token
from ..expert_parallel.moe import load_balancing_loss, route
from ..runtime.mesh import rank_grid
from ._core import (CheckFailed, RankFailed, Recorder, World, as_number, check, expect,
                    fresh_generator, randint)

__all__ = ["check_zigzag_positions", "check_merge_attention", "check_ring_forward",
           "check_balancing_loss", "check_keep_within_capacity", "check_dispatch_tokens",
           "check_mesh_groups_3d", "check_activation_bytes", "check_tp_bytes_per_step"]

TIMEOUT = 2.0


def _threads(fn, world, *args):
    """fn(comm, *args) on `world` thread ranks: (results, the sends each rank made)."""
    w = World(world, timeout=TIMEOUT)
    try:
        with torch.random.fork_rng():
            results = w.run(fn, *args)
    except RankFailed as e:
        raise CheckFailed(f"on {world} ranks: {e}") from None
    other = sorted({m.op for m in w.messages if m.op not in ("send", "recv")})
    expect(not other, f"on {world} ranks your code called {', '.join(other)}: this exercise "
                      "exchanges its data with send and recv only (a collective that gathers "
                      "everything is not the point-to-point pattern asked for)")
    sends = [[m for m in w.messages if m.op == "send" and m.src == r] for r in range(world)]
    return results, sends


def _carries(messages, blocks):
    """True when the values of `blocks` are among the values the messages carried (a multiset
    test: any packing of the payload passes, zeros of the right size do not)."""
    sent = collections.Counter(v for m in messages if m.tensor is not None
                               for v in m.tensor.detach().double().flatten().tolist())
    want = collections.Counter(v for b in blocks for v in b.double().flatten().tolist())
    return not (want - sent)


def _as_list(value, what):
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError):
        raise CheckFailed(f"{what} returned {value!r}, expected a list of positions") from None


# --- context parallelism ----------------------------------------------------------------------
@check("zigzag_positions", references=["split_positions", "shard_sequence"], observes=[
    "the positions returned for fresh sequence lengths, world sizes and every rank, against "
    "the zig-zag rule; the contiguous split is named"])
def check_zigzag_positions(fn):
    """fn(T, world, rank) -> the positions rank holds in the zig-zag split."""
    g = fresh_generator()
    for _ in range(4):
        world = randint(g, 2, 5)
        T = 2 * world * randint(g, 1, 4)
        for rank in range(world):
            got = _as_list(fn(T, world, rank), f"zigzag_positions({T}, {world}, {rank})")
            want = split_positions(T, world, rank, "zigzag").tolist()
            if got == want:
                continue
            contiguous = split_positions(T, world, rank, "contiguous").tolist()
            hint = ("that is the contiguous split: rank r takes chunk r and chunk "
                    "2*world-1-r of 2*world chunks" if got == contiguous
                    else f"expected {want}")
            raise CheckFailed(f"zigzag_positions({T}, {world}, {rank}) returned {got}: "
                              + hint)


@check("merge_attention", references=["merge_blocks"], observes=[
    "the merged output and log-sum-exp of two key blocks of fresh random scores, against "
    "attention over all the keys, with scores in the hundreds (a merge that exponentiates "
    "them unshifted overflows)"])
def check_merge_attention(fn):
    """fn(o1, lse1, o2, lse2) -> (o, lse) of attention over both key blocks."""
    g = fresh_generator()
    for scale in (1.0, 300.0):       # scores in the hundreds: exp() of them overflows
        B, H, T, D = 1, randint(g, 1, 3), randint(g, 2, 6), randint(g, 2, 5)
        q = torch.randn(B, H, T, D, generator=g)
        k = torch.randn(B, H, randint(g, 3, 9), D, generator=g) * scale
        v = torch.randn(B, H, k.shape[2], D, generator=g)
        cut = randint(g, 1, k.shape[2] - 1)
        s = q @ k.transpose(-2, -1) / math.sqrt(D)
        blocks = [(s[..., :cut], v[..., :cut, :]), (s[..., cut:], v[..., cut:, :])]
        parts = [(x.softmax(-1) @ w, torch.logsumexp(x, -1)) for x, w in blocks]
        want = attention_reference(q, k, v)
        got = fn(parts[0][0], parts[0][1], parts[1][0], parts[1][1])
        expect(isinstance(got, tuple) and len(got) == 2,
               "merge_attention must return a pair (o, lse)")
        o, lse = got
        expect(tuple(o.shape) == tuple(want.shape),
               f"o has shape {tuple(o.shape)}, expected {tuple(want.shape)}")
        if not torch.isfinite(o).all() or not torch.isfinite(lse).all():
            raise CheckFailed(f"with scores up to {float(s.abs().max()):.0f} your result "
                              "has inf or nan: exp() of large scores overflows; rescale "
                              "by the larger log-sum-exp before exponentiating")
        expect(torch.allclose(lse, torch.logsumexp(s, -1), rtol=1e-5, atol=1e-4),
               "lse is not the log-sum-exp of all the scores")
        expect(torch.allclose(o, want, rtol=1e-4, atol=1e-5),
               "o is not attention over both blocks: weight each block's output by its "
               "share exp(lse_block - lse) of the softmax denominator")


def _ring_rank(comm, fn, q, k, v):
    """This rank's output, and the largest tensor its answer built (an operation's output)."""
    w, r = comm.world, comm.rank
    parts = [t.chunk(w, dim=2)[r].clone() for t in (q, k, v)]
    with Recorder() as rec:
        out = fn(*parts, comm)
    return out, max((o.numel for op in rec.ops for o in op.outputs), default=0)


@check("ring_forward", references=["ring_attention", "RingAttention", "attention_reference"],
       observes=[
    "every message each thread rank sent: to whom (only the next rank) and how many bytes "
    "(K and V, world - 1 times)", "each rank's output against attention over the sequence"])
def check_ring_forward(fn):
    """fn(q, k, v, comm) -> this rank's attention output; K/V passed around the ring."""
    g = fresh_generator()
    for world in (2, randint(g, 3, 4)):
        t = randint(g, 2, 4)
        B, H, D, T = 1, randint(g, 1, 2), randint(g, 2, t), world * t   # D <= t: see peaks
        q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
        results, sends = _threads(_ring_rank, world, fn, q, k, v)
        peaks = [peak for _, peak in results]
        results = [out for out, _ in results]
        block = B * H * (T // world) * D * 4
        for rank, mine in enumerate(sends):
            peers = {m.dst for m in mine}
            expect(mine, f"on {world} ranks rank {rank} sent nothing: its keys and "
                         "values must travel around the ring")
            nxt = (rank + 1) % world
            expect(peers == {nxt}, f"on {world} ranks rank {rank} sent to ranks "
                                   f"{sorted(peers)}: in a ring each rank sends only to "
                                   f"the next one, rank {nxt}")
            sent = sum(m.nbytes for m in mine)
            expect(sent == 2 * (world - 1) * block,
                   f"on {world} ranks rank {rank} sent {sent} bytes; passing K and V "
                   f"on world - 1 times is {2 * (world - 1) * block}")
            passed = [(rank - i) % world for i in range(world - 1)]   # own block, then received
            blocks = [t.chunk(world, dim=2)[j] for j in passed for t in (k, v)]
            expect(_carries(mine, blocks),
                   f"on {world} ranks rank {rank}'s messages do not carry the K and V blocks of "
                   f"ranks {passed} (its own, then each one it received): send the blocks "
                   "themselves around the ring, not stand-ins of the right size")
        for rank, biggest in enumerate(peaks):
            expect(biggest <= 2 * B * H * (T // world) ** 2,
                   f"on {world} ranks rank {rank} built a tensor of {biggest} elements, as "
                   "large as the scores or keys of the whole sequence: merge each block into a "
                   "running output as it arrives (online softmax), one block at a time")
        want = attention_reference(q, k, v)
        for r, out in enumerate(results):
            expect(isinstance(out, torch.Tensor) and torch.allclose(
                out, want.chunk(world, dim=2)[r], rtol=1e-4, atol=1e-5),
                f"on {world} ranks rank {r}'s output is not attention over the whole "
                "sequence")


# --- expert parallelism -----------------------------------------------------------------------
@check("balancing_loss", references=["load_balancing_loss"], observes=[
    "the loss returned for fresh router probabilities and top-1 and top-2 choices; counting "
    "only first choices is named"])
def check_balancing_loss(fn):
    """fn(probs, expert, n_experts) -> Switch Transformer's load-balancing loss."""
    g = fresh_generator()
    for k in (1, 2, 2):
        N, E = randint(g, 6, 20), randint(g, 3, 6)
        probs = torch.softmax(torch.randn(N, E, generator=g) * 2, -1)
        expert = probs.topk(k, -1).indices
        want = float(load_balancing_loss(probs, expert, E))
        got = as_number(fn(probs, expert, E), "balancing_loss(probs, expert, n_experts)")
        if abs(got - want) <= 1e-5 * max(1, abs(want)):
            continue
        first = float(load_balancing_loss(probs, expert[:, :1], E))
        hint = ("that counts only the first choices: f_i is the share of all k choices"
                if abs(got - first) < 1e-5 and k > 1 else f"expected {want:.5f}")
        raise CheckFailed(f"with {N} tokens, {E} experts, k={k} you returned {got:.5f}: "
                          + hint)


@check("keep_within_capacity", references=["route"], observes=[
    "the kept mask for fresh choices crowding one expert: no expert over capacity, and the "
    "order first choices first, then earlier tokens"])
def check_keep_within_capacity(fn):
    """fn(expert, capacity, n_experts) -> kept (N, k) bools: first choices first, then
    earlier tokens."""
    g = fresh_generator()
    for _ in range(4):
        N, E, k = randint(g, 6, 16), randint(g, 2, 4), 2
        logits = torch.randn(N, E, generator=g)
        logits[:, 0] += 2                    # crowd expert 0 so that tokens drop
        cap = randint(g, 1, max(1, N // E))
        r = route(logits, k, cap)
        got = fn(r["expert"].clone(), cap, E)
        expect(isinstance(got, torch.Tensor) and tuple(got.shape) == (N, k),
               f"expected a (N, k) = ({N}, {k}) tensor of bools")
        got = got.bool()
        per_expert = torch.bincount(r["expert"][got], minlength=E)
        expect(int(per_expert.max()) <= cap,
               f"an expert kept {int(per_expert.max())} choices with capacity {cap}")
        if not torch.equal(got, r["kept"]):
            raise CheckFailed(f"with capacity {cap} you kept {got.int().tolist()}, expected "
                              f"{r['kept'].int().tolist()}: every first choice comes "
                              "before any second choice, then earlier tokens first")


def _dispatch_rank(comm, fn, xs, dests):
    return fn(xs[comm.rank].clone(), dests[comm.rank].clone(), comm)


@check("dispatch_tokens", references=["ExpertParallelMoE"], observes=[
    "the bytes each thread rank sent to each other rank (its rows for that rank, plus at "
    "most a few count integers)", "the rows each rank ended with, in source-rank order"])
def check_dispatch_tokens(fn):
    """fn(x, dest, comm) -> rows received from every rank (source order, then row order)."""
    g = fresh_generator()
    for world in (2, randint(g, 3, 4)):
        d = randint(g, 2, 5)
        xs = [torch.randn(randint(g, 3, 8), d, generator=g) for _ in range(world)]
        dests = [torch.randint(0, world, (len(x),), generator=g) for x in xs]
        results, sends = _threads(_dispatch_rank, world, fn, xs, dests)
        for rank, mine in enumerate(sends):
            for j in range(world):
                if j == rank:
                    continue
                need = int((dests[rank] == j).sum()) * d * 4
                sent = sum(m.nbytes for m in mine if m.dst == j)
                expect(need <= sent <= need + 64,
                       f"on {world} ranks rank {rank} sent {sent} bytes to rank {j}; "
                       f"its rows for rank {j} are {need} bytes: send each row only to "
                       "its destination")
                expect(_carries([m for m in mine if m.dst == j], [xs[rank][dests[rank] == j]]),
                       f"on {world} ranks rank {rank}'s messages to rank {j} do not carry its "
                       f"rows for rank {j}: send the rows themselves, not stand-ins")
        for r, got in enumerate(results):
            want = torch.cat([xs[s][dests[s] == r] for s in range(world)])
            expect(isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(
                want.shape) and torch.equal(got, want),
                f"on {world} ranks rank {r} should end with the {len(want)} rows sent to "
                "it, in source-rank order")


# --- 3-D layouts ------------------------------------------------------------------------------
@check("mesh_groups_3d", references=["rank_grid", "coords_of"], observes=[
    "the three groups returned for every rank of a 2x2x2 and of fresh mesh shapes"])
def check_mesh_groups_3d(fn):
    """fn(rank, shape) -> {"pp": [...], "dp": [...], "tp": [...]} for a (pp, dp, tp) mesh."""
    g = fresh_generator()
    shapes = [(2, 2, 2)] + [tuple(randint(g, 1, 3) for _ in range(3)) for _ in range(3)]
    for shape in shapes:
        grid = rank_grid(shape)
        for rank in range(math.prod(shape)):
            got = fn(rank, shape)
            expect(isinstance(got, dict), f"mesh_groups_3d({rank}, {shape}) returned "
                                          f"{got!r}, expected a dict")
            for name in ("pp", "dp", "tp"):
                want = next(grp for grp in grid[name] if rank in grp)
                mine = sorted(int(x) for x in got.get(name, []))
                expect(mine == want, f"rank {rank} of a {shape} (pp, dp, tp) mesh: your "
                                     f"{name} group is {mine}, expected {want}")


@check("activation_bytes", references=["activation_bytes_per_token"], observes=[
    "the bytes per token returned for fresh widths, heads, sequences and tensor-parallel "
    "sizes, with and without sequence parallelism, for each recomputation"])
def check_activation_bytes(fn):
    """fn(width, heads, seq, tp, sp, recompute) -> Korthikanti's bytes per token of a block
    (16-bit activations, dropout, no flash attention)."""
    g = fresh_generator()
    cases = [(1, False, "none"), (None, False, "none"), (None, True, "none"),
             (None, True, "selective"), (None, False, "full")]
    for tp, sp, rec in cases:
        log_heads = randint(g, 2, 5)
        heads = 2 ** log_heads
        width = heads * 2 ** randint(g, 4, 7)
        seq = 2 ** randint(g, 6, 11)
        tp = tp or 2 ** randint(g, 1, min(3, log_heads))   # tp divides the heads
        want = activation_bytes_per_token(width, heads, seq, tp, sp, rec, 2, flash=False,
                                          dropout=True, ln_stats=False)
        what = f"activation_bytes({width}, {heads}, {seq}, tp={tp}, sp={sp}, {rec!r})"
        got = as_number(fn(width, heads, seq, tp, sp, rec), what)
        expect(abs(got - want) <= 1e-6 * want,
               f"{what} returned {got:.6g}, expected {want:.6g} (per token: "
               f"{want / width:.4g} x width)")


@check("tp_bytes_per_step", references=["stage_costs"], observes=[
    "the bytes returned for fresh stages, micro-batches, sizes and tensor-parallel degrees"])
def check_tp_bytes_per_step(fn):
    """fn(blocks, m, tokens, width, tp, dtype_bytes) -> bytes a tensor-parallel rank sends
    per step (ring all-reduces of f and g, forward and backward)."""
    g = fresh_generator()
    for _ in range(4):
        blocks, m, tokens = randint(g, 1, 8), randint(g, 1, 8), 2 ** randint(g, 4, 12)
        width, tp, b = 2 ** randint(g, 5, 10), randint(g, 1, 8), (2, 4)[randint(g, 0, 1)]
        want = 4 * blocks * m * ring_allreduce_bytes(tokens * width * b, tp)
        what = f"tp_bytes_per_step({blocks}, {m}, {tokens}, {width}, {tp}, {b})"
        got = as_number(fn(blocks, m, tokens, width, tp, b), what)
        expect(abs(got - want) <= 1e-9 * max(1, want), f"{what} returned {got:.6g}, "
                                                       f"expected {want:.6g}")
