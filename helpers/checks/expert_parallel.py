"""Checks for the expert-parallelism chapter: the balancing loss, capacity, dispatch by hand, the
router z-loss, token permutation, the expert-gradient groups.

Random inputs are drawn so that the shortcuts learners take give numbers the rule does not.
"""

import math

import torch

from .. import load_balancing_loss, route, router_z_loss
from ._core import (
    CheckFailed,
    as_int,
    as_number,
    check,
    expect,
    fresh_generator,
    randint,
    tensor_equal,
    uniform,
)
from ._core.gradients import expect_gradient
from ._sendrecv import _carries, _threads

__all__ = ["check_balancing_loss", "check_keep_within_capacity", "check_dispatch_tokens",
           "check_z_loss", "check_permute_tokens", "check_expert_grad_group"]


# The chapter adds both router losses to the loss it backpropagates: their gradient is their job
_GRAD = ("keep it a torch computation on {x} (no torch.tensor([...]) of its values, .item(), "
         ".tolist(), numpy or .detach()): the chapter adds it to the loss it backpropagates, and "
         "its gradient is what {does}")


@check("balancing_loss", references=["load_balancing_loss"], observes=[
    "the loss returned for fresh router probabilities and top-1 and top-2 choices (in one case "
    "of every draw no token chooses the last expert); counting only first choices is named",
    "the gradient backward through it gives the router's logits behind the probabilities (a "
    "softmax's output), against the course's loss's (what trains the router: a change along a "
    "row's (1, ..., 1), renormalising, does not reach the logits)"])
def check_balancing_loss(fn):
    """fn(probs, expert, n_experts) -> Switch Transformer's load-balancing loss, differentiable
    in probs."""
    g = fresh_generator()
    empty = randint(g, 0, 2)     # forced, in a fresh case: the last expert chosen by no token
    for case, k in enumerate((1, 2, 2)):
        N, E = randint(g, 6, 20), randint(g, 3, 6)
        logits = torch.randn(N, E, generator=g)
        if case == empty:           # each token's lowest score moved to the last expert
            rows, low = torch.arange(N), logits.argmin(-1)
            logits[rows, low], logits[rows, -1] = logits[rows, -1], logits[rows, low]
        probs = torch.softmax(logits * 2, -1)
        expert = probs.topk(k, -1).indices
        # the router's probabilities as the chapter has them: a softmax's output, on its graph
        leaf = logits.clone().requires_grad_()
        handed = torch.softmax(leaf * 2, -1)
        out = fn(handed, expert.clone(), E)
        call = "balancing_loss(probs, expert, n_experts)"
        got = as_number(out, call)
        want = float(load_balancing_loss(probs, expert, E))
        if abs(got - want) <= 1e-5 * max(1, abs(want)):
            expect_gradient(out, [leaf], lambda lg, e=expert, n=E: load_balancing_loss(
                torch.softmax(lg * 2, -1), e, n), call, ["the router's logits behind probs"],
                _GRAD.format(x="probs", does="pushes the router back to balance"),
                "keep every term of P_i on probs' graph (no .detach() on part of it, no term "
                "added for its gradient alone; f_i counted from the choices): its gradient "
                "pushes the router back to balance")
            continue
        first = float(load_balancing_loss(probs, expert[:, :1], E))
        hint = ("that counts only the first choices: f_i is the share of all k choices"
                if abs(got - first) < 1e-5 and k > 1 else f"expected {want:.5f}")
        raise CheckFailed(f"with {N} tokens, {E} experts, k={k} you returned {got:.5f}: "
                          + hint)


def _served(expert, capacity, n_experts, order):
    """The kept mask when the choices (token, column) are served in `order`."""
    used, kept = [0] * n_experts, torch.zeros(expert.shape, dtype=torch.bool)
    for i, j in order:
        if used[expert[i, j]] < capacity:
            used[expert[i, j]] += 1
            kept[i, j] = True
    return kept


def _told_apart(expert, capacity, n_experts, kept):
    """Whether `kept` (served column by column) differs from the named wrong orders: token by
    token, and for k = 3 the later choices token by token, or the third never served."""
    n, k = expert.shape
    wrong = [[(i, j) for i in range(n) for j in range(k)]] if k > 1 else []
    if k > 2:
        wrong += [[(i, 0) for i in range(n)] + [(i, j) for i in range(n) for j in range(1, k)],
                  [(i, j) for j in (0, 1) for i in range(n)]]
    return all(not tensor_equal(_served(expert, capacity, n_experts, o), kept) for o in wrong)


@check("keep_within_capacity", references=["route"], observes=[
    "the kept mask for fresh choices crowding one expert, with k = 1, 2 and 3 choices per token "
    "in a fresh order (k = 2 and 3 drawn where serving token by token, or the later choices "
    "token by token, keeps other choices): no expert over capacity, and the order first "
    "choices first, then earlier tokens"])
def check_keep_within_capacity(fn):
    """fn(expert, capacity, n_experts) -> kept (N, k) bools: first choices first, then
    earlier tokens."""
    g = fresh_generator()
    # forced, in a fresh order: k = 1 (Switch's), 2 and 3, so that no top-2 answer passes
    for k in [(1, 2, 3, 2)[i] for i in torch.randperm(4, generator=g).tolist()]:
        for _ in range(200):     # judged draw after draw, until one where the wrong orders
            N, E = randint(g, 6, 16), randint(g, max(2, k), 4)     # keep other choices (k > 1)
            logits = torch.randn(N, E, generator=g)
            logits[:, 0] += 2                    # crowd expert 0 so that tokens drop
            cap = randint(g, 1, max(1, N // E))
            expert = logits.softmax(-1).topk(k, dim=-1).indices     # the choices route() makes
            got = fn(expert.clone(), cap, E)
            r = route(logits, k, cap)          # the kept mask, after the answer ran
            expect(isinstance(got, torch.Tensor) and tuple(got.shape) == (N, k),
                   f"expected a (N, k) = ({N}, {k}) tensor of bools")
            got = got.bool()
            per_expert = torch.bincount(r["expert"][got], minlength=E)
            expect(int(per_expert.max()) <= cap,
                   f"an expert kept {int(per_expert.max())} choices with capacity {cap}")
            if not tensor_equal(got, r["kept"]):
                raise CheckFailed(f"with k={k} choices per token and capacity {cap} you kept "
                                  f"{got.int().tolist()}, expected {r['kept'].int().tolist()}: "
                                  "every first choice comes before any second choice (every "
                                  "second before any third), then earlier tokens first")
            if _told_apart(expert, cap, E, r["kept"]):
                break


def _dispatch_rank(comm, fn, xs, dests):
    return fn(xs[comm.rank].clone(), dests[comm.rank].clone(), comm)


def _counts_unknown(dests):
    """The words for a receive of another number of rows than its sender sent, when every
    sender sent exactly its rows for each rank: the receiver's count (out_splits) was wrong,
    as it is when a rank passes its own counts, never exchanged (the comm's words name the
    all_to_all's inner receive, which the reader never wrote)."""
    def reword(w, error):
        rank, failure = w.network_failure or (None, None)      # the first refusal, the cause
        if not all("into a buffer of shape" in str(e) for e in (failure or "", error)):
            return None
        if any(m.op == "send" and len(m.shape) == 2         # rows (a count sent is not)
               and m.shape[0] != int((dests[m.src] == m.dst).sum()) for m in w.messages):
            return None
        return (f"on {len(dests)} ranks rank {rank} expected another number of rows from a "
                "rank than it was sent (each rank sent exactly its rows for it): out_splits[j] "
                "must be the number of rows rank j sends you, which only rank j knows. Exchange "
                "the counts first (an all_to_all of one count per rank), then the rows")
    return reword


@check("dispatch_tokens", references=["ExpertParallelMoE"], observes=[
    "the bytes each thread rank sent to each other rank (its rows for that rank, plus at "
    "most a few count integers)", "the rows each rank ended with, in source-rank order, "
    "then row order (one rank of 32 rows or more, where an unstable sort shows, and one that "
    "sends the last rank nothing)"])
def check_dispatch_tokens(fn):
    """fn(x, dest, comm) -> rows received from every rank (source order, then row order)."""
    g = fresh_generator()
    for world in (2, randint(g, 3, 4)):
        d = randint(g, 2, 5)
        # One rank of 32 rows or more, forced, in a fresh place: torch's CPU sort keeps equal
        # keys in order up to 16 elements, stable or not, so an unstable sort shows only above.
        many = randint(g, 0, world - 1)
        xs = [torch.randn(randint(g, 32, 40) if r == many else randint(g, 3, 8), d, generator=g)
              for r in range(world)]
        # Forced, in a fresh place: one rank that sends the last rank nothing.
        quiet = randint(g, 0, world - 1)
        dests = [torch.randint(0, world - (r == quiet), (len(x),), generator=g)
                 for r, x in enumerate(xs)]
        results, sends, w = _threads(_dispatch_rank, world, fn, xs, dests,
                                     reword=_counts_unknown(dests))
        for rank, mine in enumerate(sends):
            for j in range(world):
                if j == rank:
                    continue
                need = int((dests[rank] == j).sum()) * d * 4
                sent = w.traffic(messages=mine).payload_bytes(dst=j)
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
                want.shape) and tensor_equal(got, want),
                f"on {world} ranks rank {r} should end with the {len(want)} rows sent to "
                "it, in source-rank order, each source's in their own order (a stable sort "
                "keeps it)")
            if any((dests[s] == r).any() for s in range(world) if s != r):
                w.expect_from_messages(r, got, "rows", world)




@check("z_loss", references=["router_z_loss"], observes=[
    "the loss returned for fresh router scores, small and large (one above 100 in every large "
    "draw, where exp overflows float32); the square and the log-sum-exp are named",
    "the gradient backward through it gives the scores (requiring grad), against the course's "
    "loss's"])
def check_z_loss(fn):
    """fn(logits) -> ST-MoE's router z-loss: the mean over tokens of logsumexp(logits)^2,
    differentiable in logits."""
    g = fresh_generator()
    for scale in (1.0, 30.0):
        N, E = randint(g, 4, 12), randint(g, 3, 8)
        logits = torch.randn(N, E, generator=g) * scale + scale
        if scale > 1:       # forced, not left to the draw: exp overflows float32 above 88.7
            logits[randint(g, 0, N - 1), randint(g, 0, E - 1)] = uniform(g, 100.0, 130.0)
        handed = logits.clone().requires_grad_()
        out = fn(handed)
        got = as_number(out, "z_loss(logits)")
        want = float(router_z_loss(logits))
        if abs(got - want) <= 1e-4 * max(1.0, abs(want)):
            expect_gradient(out, [handed], router_z_loss, "z_loss(logits)", ["logits"],
                            _GRAD.format(x="logits", does="keeps the router's scores small"))
            continue
        lse = torch.logsumexp(logits, -1)
        if abs(got - float(lse.mean())) < 1e-4 * max(1.0, abs(want)):
            hint = "that is the mean log-sum-exp: square it per token, then average"
        elif abs(got - float((logits.amax(-1) ** 2).mean())) < 1e-4 * max(1.0, abs(want)):
            hint = "that squares the largest score: the z-loss squares the log-sum-exp"
        elif not math.isfinite(got):
            hint = (f"exp overflowed (expected {want:.5g}): subtract each token's largest score "
                    "before exp, and add it back after the log")
        else:
            hint = f"expected {want:.5g}"
        raise CheckFailed(f"with {N} tokens and {E} experts you returned {got:.5g}: {hint}")


_ROWS_GRAD = ("index x with the order, keeping it a torch computation (no torch.tensor of its "
              "values, .tolist(), numpy, .data or .detach()): the layer backpropagates through "
              "the rows to the tokens")


@check("permute_tokens", references=["permute_by_expert", "EPMoE"], observes=[
    "the rows and counts returned for fresh tokens, top-1 and top-2 choices both (32 choices or "
    "more in one case of every draw, where an unstable sort shows, and in one no choice of the "
    "last expert): each expert's rows together, experts in order, within an expert the "
    "choices in token order", "the gradient backward through the rows gives the tokens "
    "(requiring grad), against indexing's"])
def check_permute_tokens(fn):
    """fn(x, expert, n_experts) -> (rows, counts): the tokens of every choice (expert (N, k)),
    grouped by expert in expert order, each group in token order, differentiable in x;
    counts (E,)."""
    g = fresh_generator()
    first = randint(g, 1, 2)        # top-1 and top-2 both, in a fresh order: never k=1 alone
    # One case of 32 choices or more, forced, in a fresh place: torch's CPU sort keeps equal keys
    # in order up to 16 elements, stable or not, so an unstable sort shows only above.
    many = randint(g, 0, 2)
    empty = randint(g, 0, 2)        # forced, in a fresh case: the last expert chosen by no token
    for case, k in enumerate((first, 3 - first, randint(g, 1, 2))):
        N, E, d = randint(g, 5, 12), randint(g, 2, 5), randint(g, 2, 4)
        if case == many:
            N = randint(g, 32, 40) // k     # N * k >= 32 choices of at most 5 experts
        if case == empty:
            E = max(E, k + 1)
        x = torch.randn(N, d, generator=g)
        chosen = E - (case == empty)        # the experts the choices are drawn from
        expert = torch.stack([torch.randperm(chosen, generator=g)[:k] for _ in range(N)])
        handed = x.clone().requires_grad_()     # the layer backpropagates through the rows
        got = fn(handed, expert.clone(), E)
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
        if not tensor_equal(rows, want):
            by_token = x.repeat_interleave(k, 0)
            hint = ("those are the tokens in their own order: group them by expert"
                    if tensor_equal(rows, by_token) else
                    "each expert's rows together, experts in order, and within an expert the "
                    "tokens in their order (a stable sort)")
            raise CheckFailed(f"with {N} tokens, {E} experts, k={k} the rows are not "
                              f"permuted right: {hint}")
        expect_gradient(rows, [handed], lambda t, i=order // k: t[i], "permute_tokens' rows",
                        ["x"], _ROWS_GRAD, weight=torch.randn(want.shape, generator=g))


@check("expert_grad_group", references=["ep_dp_mesh", "EPMoE", "rank_grid"], observes=[
    "the group returned for every rank of fresh (dp, ep) layouts (one with dp other than ep in "
    "every call), against the ranks that hold the same experts"])
def check_expert_grad_group(fn):
    """fn(rank, world, ep) -> the ranks (sorted) whose expert gradients rank's are reduced with:
    ep consecutive ranks split the experts, so the same experts sit every ep ranks."""
    g = fresh_generator()
    apart = randint(g, 0, 3)     # forced, in a fresh case: dp = world // ep other than ep
    for case in range(4):
        ep = randint(g, 2, 4)
        dp = randint(g, 2, 3 if case == apart else 4)
        if case == apart:           # 2..4 but ep
            dp += dp >= ep
        world = ep * dp
        for rank in range(world):
            got = sorted(as_int(v, "expert_grad_group") for v in fn(rank, world, ep))
            want = list(range(rank % ep, world, ep))
            if got == want:
                continue
            split = list(range(rank - rank % ep, rank - rank % ep + ep))
            hint = (f"those {ep} ranks split the experts between them: none holds rank "
                    f"{rank}'s" if got == split else
                    f"that steps by world // ep = {world // ep}; the same experts sit every ep "
                    f"= {ep} ranks" if got == list(range(rank % ep, world, world // ep)) else
                    "every rank holds different experts' weights than most: reduce over those "
                    "holding the same ones" if got == list(range(world)) else
                    f"expected {want}")
            raise CheckFailed(f"rank {rank} of {world} with ep={ep}: you returned {got}: "
                              + hint)
