"""Checks for Part VII's new exercises: the half-block rule and the all-to-all over heads of
context parallelism, the router z-loss, token permutation and the expert-gradient groups of
expert parallelism, and what gradient accumulation costs ZeRO-2 in the planner.

Functions that communicate run on the harness's World of thread ranks, whose network records
every message: the check judges what an answer sent and to whom. The others run on fresh
random inputs chosen so that the shortcuts learners take give numbers the rule does not.
"""
import torch

from ..composed.planner import data_parallel_costs
from ..context_parallel.scratch import causal_block, split_positions
from ..expert_parallel.moe import router_z_loss
from ._core import CheckFailed, RankFailed, World, as_int, as_number, check, expect, \
    fresh_generator, randint

__all__ = ["check_half_block", "check_tokens_to_heads", "check_z_loss", "check_permute_tokens",
           "check_expert_grad_group", "check_accumulation_bytes"]

TIMEOUT = 2.0


def _pair(got, what):
    try:
        a, b = got
        return as_int(a, what), as_int(b, what)
    except (TypeError, ValueError):
        raise CheckFailed(f"{what} returned {got!r}, expected a pair (first row, "
                          "columns)") from None


# --- context parallelism ----------------------------------------------------------------------
@check("half_block", references=["causal_block", "block_work", "ring_schedule"], observes=[
    "the rows and columns returned for every pair of ranks of fresh zig-zag and contiguous "
    "splits, against the causal mask: no needed pair left out, no row or column formed that "
    "the mask hides whole"])
def check_half_block(fn):
    """fn(q_pos, k_pos) -> (first, cols): this rank computes queries q_pos[first:] against keys
    k_pos[:cols] (cols 0: nothing)."""
    g = fresh_generator()
    for layout in ("zigzag", "contiguous", "zigzag"):
        world = randint(g, 2, 5)
        T = 2 * world * randint(g, 1, 3)
        pos = [split_positions(T, world, r, layout) for r in range(world)]
        for r in range(world):
            for s in range(world):
                what = f"half_block for rank {r}'s queries and rank {s}'s keys ({layout}, " \
                       f"{T} tokens on {world} ranks)"
                first, cols = _pair(fn(pos[r].clone(), pos[s].clone()), what)
                want_first, want_cols, _ = causal_block(pos[r], pos[s])
                if want_cols == 0:
                    expect(cols == 0 or first >= len(pos[r]),
                           f"{what} returned ({first}, {cols}): no query there sees any of "
                           "those keys, so nothing is computed (cols 0)")
                    continue
                formed = (len(pos[r]) - first) * cols
                seen = (pos[s][:cols][None, :] <= pos[r][first:][:, None]).sum()
                total = (pos[s][None, :] <= pos[r][:, None]).sum()
                expect(int(seen) == int(total),
                       f"{what} returned ({first}, {cols}): it leaves out pairs the mask "
                       "keeps; every query must see every earlier key")
                if formed == len(pos[r]) * len(pos[s]) and (want_first, want_cols) != (
                        0, len(pos[s])):
                    raise CheckFailed(f"{what} returned the whole block ({first}, {cols}): "
                                      f"only rows {want_first}.. and the first {want_cols} "
                                      "columns hold pairs the mask keeps; under zig-zag that "
                                      "is half a block")
                expect((first, cols) == (want_first, want_cols),
                       f"{what} returned ({first}, {cols}), expected ({want_first}, "
                       f"{want_cols}): the first query that sees a key, and the keys up to "
                       "the last query")


def _heads_rank(comm, fn, xs):
    return fn(xs[comm.rank].clone(), comm)


@check("tokens_to_heads", references=["seq_to_heads", "heads_to_seq", "SeqToHeads",
                                   "ulysses_attention"], observes=[
    "every message each thread rank sent: to whom and how many bytes (1/world of its tensor to "
    "each other rank, no collective)", "the tensor each rank returned, against the sequence's "
    "tokens of its heads"])
def check_tokens_to_heads(fn):
    """fn(x, comm) -> (B, H/w, T, D): every token of this rank's heads, from x (B, H, T/w, D)
    this rank's tokens of every head."""
    g = fresh_generator()
    for world in (2, randint(g, 3, 4)):
        B, D, per = 1, randint(g, 2, 3), randint(g, 1, 2)
        H, T = world * per, world * randint(g, 2, 3)
        full = torch.randn(B, H, T, D, generator=g)
        xs = [t.contiguous() for t in full.chunk(world, dim=2)]
        w = World(world, timeout=TIMEOUT)
        try:
            with torch.random.fork_rng():
                results = w.run(_heads_rank, fn, xs)
        except RankFailed as e:
            raise CheckFailed(f"on {world} ranks: {e}") from None
        ops = {m.op for m in w.messages if m.op not in ("recv", "wait")}
        expect(ops <= {"send"}, f"on {world} ranks the answer called {sorted(ops - {'send'})}: "
                                "each rank sends each other rank only the heads it will hold "
                                "(send and recv), not a collective of everything")
        piece = xs[0].numel() * xs[0].element_size() // world
        for r in range(world):
            for j in range(world):
                if j == r:
                    continue
                sent = sum(m.nbytes for m in w.messages
                           if m.op == "send" and m.src == r and m.dst == j)
                expect(sent == piece, f"on {world} ranks rank {r} sent {sent} bytes to rank "
                                      f"{j}; its tokens of rank {j}'s heads are {piece} bytes")
        for r, got in enumerate(results):
            want = full.chunk(world, dim=1)[r]
            expect(isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(want.shape)
                   and torch.equal(got, want),
                   f"on {world} ranks rank {r} should return every token of heads "
                   f"{r * per}..{(r + 1) * per - 1}, shape {tuple(want.shape)}, the tokens in "
                   "sequence order (rank 0's first)")


# --- expert parallelism -----------------------------------------------------------------------
@check("z_loss", references=["router_z_loss"], observes=[
    "the loss returned for fresh router scores, large and small; the square and the "
    "log-sum-exp are named"])
def check_z_loss(fn):
    """fn(logits) -> ST-MoE's router z-loss: the mean over tokens of logsumexp(logits)^2."""
    g = fresh_generator()
    for scale in (1.0, 30.0):
        N, E = randint(g, 4, 12), randint(g, 3, 8)
        logits = torch.randn(N, E, generator=g) * scale + scale
        want = float(router_z_loss(logits))
        got = as_number(fn(logits.clone()), "z_loss(logits)")
        if abs(got - want) <= 1e-4 * max(1.0, abs(want)):
            continue
        lse = torch.logsumexp(logits, -1)
        if abs(got - float(lse.mean())) < 1e-4 * max(1.0, abs(want)):
            hint = "that is the mean log-sum-exp: square it per token, then average"
        elif abs(got - float((logits.amax(-1) ** 2).mean())) < 1e-4 * max(1.0, abs(want)):
            hint = "that squares the largest score: the z-loss squares the log-sum-exp"
        else:
            hint = f"expected {want:.5g}"
        raise CheckFailed(f"with {N} tokens and {E} experts you returned {got:.5g}: {hint}")


@check("permute_tokens", references=["permute_by_expert", "EPMoE"], observes=[
    "the rows and counts returned for fresh tokens and top-k choices: each expert's rows "
    "together, experts in order, within an expert the choices in token order"])
def check_permute_tokens(fn):
    """fn(x, expert, n_experts) -> (rows, counts): the tokens of every choice (expert (N, k)),
    grouped by expert in expert order, each group in token order; counts (E,)."""
    g = fresh_generator()
    for _ in range(3):
        N, E, k, d = randint(g, 5, 12), randint(g, 2, 5), randint(g, 1, 2), randint(g, 2, 4)
        x = torch.randn(N, d, generator=g)
        expert = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(N)])
        got = fn(x.clone(), expert.clone(), E)
        expect(isinstance(got, tuple) and len(got) == 2,
               "permute_tokens must return a pair (rows, counts)")
        rows, counts = got
        want_counts = torch.bincount(expert.reshape(-1), minlength=E)
        expect(torch.as_tensor(counts).tolist() == want_counts.tolist(),
               f"counts {torch.as_tensor(counts).tolist()}, expected "
               f"{want_counts.tolist()}: the choices of each expert")
        order = torch.argsort(expert.reshape(-1), stable=True)
        want = x[order // k]
        expect(isinstance(rows, torch.Tensor) and tuple(rows.shape) == tuple(want.shape),
               f"rows must be a ({len(want)}, {d}) tensor: one row per choice")
        if not torch.equal(rows, want):
            by_token = x.repeat_interleave(k, 0)
            hint = ("those are the tokens in their own order: group them by expert"
                    if torch.equal(rows, by_token) else
                    "each expert's rows together, experts in order, and within an expert the "
                    "tokens in their order (a stable sort)")
            raise CheckFailed(f"with {N} tokens, {E} experts, k={k} the rows are not "
                              f"permuted right: {hint}")


@check("expert_grad_group", references=["ep_dp_mesh", "EPMoE", "rank_grid"], observes=[
    "the group returned for every rank of fresh (dp, ep) layouts, against the ranks that hold "
    "the same experts"])
def check_expert_grad_group(fn):
    """fn(rank, world, ep) -> the ranks (sorted) whose expert gradients rank's are reduced with:
    ep consecutive ranks split the experts, so the same experts sit every ep ranks."""
    g = fresh_generator()
    for _ in range(4):
        ep = randint(g, 2, 4)
        world = ep * randint(g, 2, 4)
        for rank in range(world):
            got = sorted(as_int(v, "expert_grad_group") for v in fn(rank, world, ep))
            want = list(range(rank % ep, world, ep))
            if got == want:
                continue
            split = list(range(rank - rank % ep, rank - rank % ep + ep))
            hint = (f"those {ep} ranks split the experts between them: none holds rank "
                    f"{rank}'s" if got == split else
                    "every rank holds different experts' weights than most: reduce over those "
                    "holding the same ones" if got == list(range(world)) else
                    f"expected {want}")
            raise CheckFailed(f"rank {rank} of {world} with ep={ep}: you returned {got}: "
                              + hint)


# --- the planner ------------------------------------------------------------------------------
@check("accumulation_bytes", references=["data_parallel_costs", "sharding_costs",
                                         "stage_costs"], observes=[
    "the bytes returned for fresh parameter counts, ranks and micro-batches, both ways of "
    "accumulating"])
def check_accumulation_bytes(fn):
    """fn(n_params, k, m, acc, dtype_bytes) -> bytes a ZeRO-2 rank sends per step with m
    micro-batches: acc "every" (a reduce-scatter per micro-batch) or "no_sync"."""
    g = fresh_generator()
    for acc in ("every", "no_sync", "every", "no_sync"):
        n, k, m, b = randint(g, 10, 10**6), randint(g, 2, 16), randint(g, 2, 16), (2, 4)[
            randint(g, 0, 1)]
        want = data_parallel_costs(n, k, "zero2", m, acc, "adam", b)["sent_bytes"]
        what = f"accumulation_bytes({n}, {k}, {m}, {acc!r}, {b})"
        got = as_number(fn(n, k, m, acc, b), what)
        if abs(got - want) <= 1e-9 * max(1.0, want):
            continue
        once = (k - 1) / k * n * b
        hint = ("that ignores the micro-batches: each one's backward reduce-scatters"
                if acc == "every" and abs(got - 2 * once) < 1e-6 * want else
                "that is m all-reduces: a reduce-scatter moves half of one, and the "
                "all-gather of the parameters comes once" if abs(got - 2 * m * once) <
                1e-6 * max(want, 1.0) else f"expected {want:.6g}")
        raise CheckFailed(f"{what} returned {got:.6g}: {hint}")
