"""Checks for the context-parallelism chapter: the zig-zag split, merging attention blocks, the
ring forward pass, the half-block rule, the all-to-all over heads.

Random inputs are drawn so that the shortcuts learners take give numbers the rule does not.
"""
import math

import torch

from .. import attention_reference, causal_block, split_positions
from ._core import (
    CheckFailed,
    Recorder,
    World,
    check,
    expect,
    fresh_generator,
    randint,
    tensor_close,
    tensor_equal,
    uniform,
)
from ._core.references import torch_family
from ._sendrecv import TIMEOUT, _as_list, _carries, _pair, _threads

# torch's context parallelism holds copies of two exercises: the zig-zag ("head-tail") split (in
# every load balancer it offers, each a subclass of _LoadBalancer) and the merge of two blocks'
# attention
_CP = "torch.distributed.tensor.experimental._context_parallel."

__all__ = ["check_zigzag_positions", "check_merge_attention", "check_ring_forward",
           "check_half_block", "check_tokens_to_heads"]


@check("zigzag_positions", references=[
    "split_positions", "shard_sequence", *torch_family(_CP + "_load_balancer._LoadBalancer")],
       observes=[
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


@check("merge_attention", references=["merge_blocks", _CP + "_attention._SDPAMerger._merge_one"],
       observes=[
    "the merged output and log-sum-exp (float32, as given) of two key blocks of fresh random "
    "scores, against attention over all the keys, computed after the answer returned; with "
    "scores shifted by hundreds, up and down, so that a merge exponentiating the log-sum-exps "
    "unshifted overflows or underflows, in float64 too"])
def check_merge_attention(fn):
    """fn(o1, lse1, o2, lse2) -> (o, lse) of attention over both key blocks."""
    g = fresh_generator()
    # exp(lse) of a block overflows float64 above 709 and is 0 below -745: a shift of
    # +-(760..900) added to every score (softmax ignores it, lse moves with it) defeats an
    # unshifted merge in any dtype; beside it, unshifted scores in the hundreds
    for scale, shift in ((1.0, 0.0), (300.0, 0.0), (1.0, uniform(g, 760, 900)),
                         (1.0, -uniform(g, 760, 900))):
        B, H, T, D = 1, randint(g, 1, 3), randint(g, 2, 6), randint(g, 2, 5)
        q = torch.randn(B, H, T, D, generator=g)
        k = torch.randn(B, H, randint(g, 3, 9), D, generator=g) * scale
        v = torch.randn(B, H, k.shape[2], D, generator=g)
        cut = randint(g, 1, k.shape[2] - 1)
        s = q @ k.transpose(-2, -1) / math.sqrt(D) + shift
        blocks = [(s[..., :cut], v[..., :cut, :]), (s[..., cut:], v[..., cut:, :])]
        parts = [(x.softmax(-1) @ w, torch.logsumexp(x, -1)) for x, w in blocks]
        got = fn(*(t.clone() for part in parts for t in part))     # copies: nothing to edit
        expect(isinstance(got, (tuple, list)) and len(got) == 2,
               "merge_attention must return a pair (o, lse), a tuple or a list")
        o, lse = got
        expect(isinstance(o, torch.Tensor) and isinstance(lse, torch.Tensor),
               "merge_attention must return two tensors (o, lse)")
        expect(o.dtype == lse.dtype == s.dtype,
               f"o and lse are {o.dtype} and {lse.dtype}: return them in the inputs' dtype "
               f"({s.dtype}), computed stably in it")
        want = s.softmax(-1) @ v         # after the answer: attention over all the keys
        expect(tuple(o.shape) == tuple(want.shape),
               f"o has shape {tuple(o.shape)}, expected {tuple(want.shape)}")
        if not torch.isfinite(o).all() or not torch.isfinite(lse).all():
            raise CheckFailed(f"with scores from {float(s.min()):.0f} to {float(s.max()):.0f} "
                              "your result has inf or nan: exp() of a large log-sum-exp "
                              "overflows (of a very negative one, underflows to 0); rescale by "
                              "the larger log-sum-exp before exponentiating")
        expect(tensor_close(lse, torch.logsumexp(s, -1), rtol=1e-5, atol=1e-4, what="lse"),
               "lse is not the log-sum-exp of all the scores")
        # float32 holds an lse near 900 to about 1e-4: the weights exp(lse_i - lse) carry
        # that much, whatever the merge; a wrong merge is off by the outputs' size
        atol = 1e-5 + 8 * torch.finfo(s.dtype).eps * float(s.abs().max() * v.abs().max())
        expect(tensor_close(o, want, rtol=1e-4, atol=atol, what="o"),
               "o is not attention over both blocks: weight each block's output by its "
               "share exp(lse_block - lse) of the softmax denominator")


def _shift(q, k, g):
    """k plus c * u for one fresh unit vector u: each query's scores move by c (q . u) / sqrt(D),
    one number per row, which softmax ignores; c is set so that the largest move is 760 to 900,
    past exp()'s range in float64 (709 up, 745 down). Returns (the keys, that largest move)."""
    u = torch.randn(q.shape[-1], generator=g)
    u = u / u.norm()
    most = float((q @ u).abs().max()) / math.sqrt(q.shape[-1])
    shift = uniform(g, 760, 900)
    return k + (shift / most) * u, shift


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
    "(K and V, world - 1 times)", "each rank's output against attention over the sequence",
    "the received K/V blocks (and copies of them) each rank kept alive at once, from arrival to "
    "last use (a sent one: to the wait that finishes its send): three at most, on 6 ranks too "
    "(no holding the whole sequence); with what it "
    "computed from them (any operation, values read out of torch): no more on 6 ranks than on 4",
    "on one of the three worlds, a fresh one, every key shifted by one shared vector: "
    "attention unchanged, scores shifted by up to +-(760..900), so exp() without a running "
    "maximum overflows or underflows, in float64 too"])
def check_ring_forward(fn):
    """fn(q, k, v, comm) -> this rank's attention output; K/V passed around the ring."""
    g = fresh_generator()
    held = {}          # world -> the most bytes one rank held at once of what it received
    unsent = {}        # the same, a sent block not held until the wait that finishes its send
    t = randint(g, 3, 4)          # world <= 2t: a row's stats fit a block; D <= t: see peaks
    same = t, randint(g, 1, 2), randint(g, 2, t)    # t, H, D: the same on 4 and 6 ranks
    shifted = (2, 4, 6)[randint(g, 0, 2)]           # forced, in a fresh world: see _shift
    for world in (2, 4, 6):       # 6: keeping every block exceeds a ring's three
        t = randint(g, 2, 4) if world == 2 else same[0]
        H, D = (randint(g, 1, 2), randint(g, 2, t)) if world == 2 else same[1:]
        B, T = 1, world * t
        q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
        plain, shift = k, 0.0
        if world == shifted:
            k, shift = _shift(q, k, g)
        results, sends, w = _threads(_ring_rank, world, fn, q, k, v)
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
            sent = w.traffic(messages=mine).payload_bytes()
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
            # what it kept: the received K/V blocks (and copies of them) alive at once, each
            # from its arrival to its last use; a ring needs the one it computes with, the one
            # arriving, and one in flight at most; a block sent lives until the wait that
            # finishes its send (the comm holds it: one wait at the end holds every block)
            rec = w.recorders[rank]
            kv_keys = rec.copies_of(key for key, _ in w.received[rank])
            kept_kv = rec.live_peak(kv_keys, until=w.sent_until(rank))
            held[world] = max(held.get(world, 0), w.held_from_messages(rank))
            unsent[world] = max(unsent.get(world, 0), w.held_from_messages(rank, sends=False))
            expect(kept_kv <= 3 * 2 * block,
                   f"on {world} ranks rank {rank} kept {kept_kv // (2 * block)} received K/V "
                   "blocks alive at once" + (
                       ", sent and not yet waited for: the comm holds a sent block until "
                       "comm.wait(); call it each step once the next block has arrived"
                       if rec.live_peak(kv_keys) <= 3 * 2 * block else
                       ": holding the whole sequence's keys and values is what the ring avoids; "
                       "merge each block into a running output as it arrives (online softmax), "
                       "then let it go"))
        want = attention_reference(q, plain, v)       # the shift changes no attention
        # float32 holds a score near 900 to about 1e-4: the output carries that much
        atol = 1e-5 + bool(shift) * 8 * torch.finfo(q.dtype).eps * float(
            (q.abs() @ k.abs().transpose(-2, -1)).max() / math.sqrt(D) * v.abs().max())
        for r, out in enumerate(results):
            if shift and isinstance(out, torch.Tensor) and not torch.isfinite(out).all():
                raise CheckFailed(
                    f"on {world} ranks every key was shifted by one shared vector, so a query's "
                    f"scores move by up to {shift:.0f} (softmax ignores a row's shift: attention "
                    f"is unchanged), and rank {r}'s output has inf or nan: exp() of a score in "
                    "the hundreds overflows (of a very negative one, underflows to 0), in "
                    "float64 too. Keep each row's running maximum, exponentiate the scores "
                    "minus it, and rescale the running sums when it grows (online softmax)")
            expect(isinstance(out, torch.Tensor) and tensor_close(
                out, want.chunk(world, dim=2)[r], rtol=1e-4, atol=atol,
                what=f"on {world} ranks rank {r}'s output"),
                f"on {world} ranks rank {r}'s output is not attention over the whole "
                "sequence")
            w.expect_from_messages(r, out, "output", world)
    # what the ranks made from the blocks counts too (`kv * 1.0`, `-kv`, values read out): a
    # ring holds as much on 6 ranks as on 4, on the same blocks; every block kept grows by two
    grown = (held[6] - held[4]) / (2 * block)
    expect(grown <= 0.5 or (unsent[6] - unsent[4]) / (2 * block) > 0.5,
           f"a rank kept {grown:.3g} more received K/V blocks alive at once on 6 ranks than on 4 "
           "(counting what it computed from them and sent, `k * 1.0` or `-(-k)`), sent and not "
           "yet waited for: the comm holds a sent block until comm.wait(); call it each step "
           "once the next block has arrived")
    expect(grown <= 0.5,
           f"a rank kept {grown:.3g} more received K/V blocks alive at once on 6 ranks than on 4 "
           "(counting what it computed from them: `kv * 1.0`, `-kv`, a cast, values read out "
           "of torch): holding the whole sequence's keys and values is what the ring avoids; "
           "merge each block into a running output as it arrives (online softmax), then let it "
           "go")




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
    "tokens of its heads, on one world with one head per rank and on one with two"])
def check_tokens_to_heads(fn):
    """fn(x, comm) -> (B, H/w, T, D): every token of this rank's heads, from x (B, H, T/w, D)
    this rank's tokens of every head."""
    g = fresh_generator()
    first = randint(g, 1, 2)        # one head per rank and two, both forced, in a fresh order
    for world, per in ((2, first), (randint(g, 3, 4), 3 - first)):
        B, D = 1, randint(g, 2, 3)
        H, T = world * per, world * randint(g, 2, 3)
        full = torch.randn(B, H, T, D, generator=g)
        xs = [t.contiguous() for t in full.chunk(world, dim=2)]
        w = World(world, timeout=TIMEOUT, record_ops=True)
        try:
            with torch.random.fork_rng():
                results = w.run(_heads_rank, fn, xs)
        except TimeoutError as e:
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
                sent = w.traffic(r).payload_bytes("send", dst=j)
                expect(sent == piece, f"on {world} ranks rank {r} sent {sent} bytes to rank "
                                      f"{j}; its tokens of rank {j}'s heads are {piece} bytes")
            mine = [m for m in w.messages if m.op == "send" and m.src == r]
            blocks = [p for j, p in enumerate(xs[r].chunk(world, dim=1)) if j != r]
            expect(_carries(mine, blocks),
                   f"on {world} ranks rank {r}'s messages do not carry its tokens of the other "
                   "ranks' heads: send those tokens themselves, not stand-ins of the right size")
        for r, got in enumerate(results):
            want = full.chunk(world, dim=1)[r]
            expect(isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(want.shape)
                   and tensor_equal(got, want),
                   f"on {world} ranks rank {r} should return every token of heads "
                   f"{r * per}..{(r + 1) * per - 1}, shape {tuple(want.shape)}, the tokens in "
                   "sequence order (rank 0's first)")
            w.expect_from_messages(r, got, "tensor", world)
