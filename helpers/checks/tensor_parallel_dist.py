"""Checks for the exercises of Part VI's tensor-parallel chapter (tensor_parallel_dist): a
row-parallel linear layer, Megatron's MLP, a block's ring bytes, the loss over a split
vocabulary. The answers run on thread ranks of the harness's World, which records every
collective (who called it, with which tensor, how many bytes, forward or backward), so an
answer that computes the unsplit product on one rank, or skips a collective, fails for that
reason even when its numbers come out right."""
import torch

from .. import TPBlock, block_loss, small_block
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
)

__all__ = ["check_row_parallel_linear", "check_megatron_mlp", "check_tp_ring_bytes",
           "check_vocab_loss"]

TIMEOUT = 5.0


def _reduces(world, rank, since=0):
    return [m for m in world.sent("all_reduce", rank=rank) if m.seq >= since]


# --- tensor parallel ----------------------------------------------------------------------------
def _row_rank(comm, fn, x, W, b):
    k, r = comm.world, comm.rank
    return fn(x.chunk(k, -1)[r].clone(), W.chunk(k, 1)[r].clone(), b.clone(), comm)


_ONE = dict.fromkeys(("all_gather", "broadcast", "send", "reduce_scatter", "all_to_all"),
                     "a row-split layer needs exactly one all-reduce each, of the partial output")


@check("row_parallel_linear", references=["TPMLP", "dense_split_rows"], observes=[
    "on 2 and 4 thread ranks: the collectives each rank called (one all-reduce each, of the "
    "partial output's bytes) and every rank's output against x @ W.T + b"])
def check_row_parallel_linear(fn):
    """fn(x_shard, w_shard, b, comm): a row-split linear layer; every rank returns x @ W.T + b."""
    g = fresh_generator()
    for k in (2, 4):
        n, d_in, d_out = randint(g, 2, 5), k * randint(g, 1, 4), randint(g, 2, 6)
        x, W = torch.randn(n, d_in, generator=g), torch.randn(d_out, d_in, generator=g)
        b = torch.randn(d_out, generator=g)
        world = World(k, timeout=TIMEOUT, record_ops=True, allow={"all_reduce"}, why=_ONE)
        results = world.run(_row_rank, fn, x, W, b)      # the ranks get copies of x, W, b
        want = x @ W.T + b
        calls = [len(world.sent(rank=r)) for r in range(k)]
        reduces = [len(_reduces(world, r)) for r in range(k)]
        partial = x.chunk(k, -1)[0] @ W.chunk(k, 1)[0].T
        r0 = results[0]
        expect(isinstance(r0, torch.Tensor), f"rank 0 returned {type(r0).__name__}")
        if calls[0] == 0 and tensor_close(r0, partial + b, atol=1e-5, what="rank 0's output"):
            raise CheckFailed(f"on {k} ranks rank 0 returned only its partial sum: "
                              "all-reduce the partial products (comm.all_reduce)")
        expect(reduces == [1] * k and calls == [1] * k,
               f"on {k} ranks the ranks called {calls} collectives ({reduces} all-reduces); a "
               "row-split layer needs exactly one all-reduce each, of the partial output")
        nbytes = world.traffic(0).payload_bytes("all_reduce")
        expect(nbytes == n * d_out * 4,
               f"rank 0 all-reduced {nbytes} bytes; the partial output is {n * d_out * 4}")
        for r, y in enumerate(results):
            if tensor_close(y, want + (k - 1) * b, atol=1e-5, what=f"rank {r}'s output"):
                raise CheckFailed("the bias was added on every rank before the all-reduce, "
                                  f"so it counts {k} times: add it once, after")
            expect(tensor_close(y, want, atol=1e-5),
                   f"on {k} ranks rank {r}'s output differs from x @ W.T + b by "
                   f"{(y - want).abs().max():.3g}")
            world.expect_from_messages(r, y, "output", k)


def _mlp_rank(comm, fn, world, x, W1, b1, W2, b2, R):
    k, r = comm.world, comm.rank
    shards = [W1.chunk(k, 0)[r], b1.chunk(k, 0)[r], W2.chunk(k, 1)[r], b2]
    shards = [s.clone().requires_grad_() for s in shards]
    x = x.clone().requires_grad_()
    out = fn(x, *shards, comm)
    split = world.mark("forward done")
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        raise CheckFailed(f"rank {r} returned {type(out).__name__} without a gradient path: "
                          "build it from x and the shards with differentiable operations")
    (out * R).sum().backward()
    return out.detach(), x.grad, [s.grad for s in shards], split


_REBUILDS = dict.fromkeys(("all_gather", "broadcast", "send", "reduce_scatter", "all_to_all"),
                          "moving shards rebuilds weights; a tensor-parallel MLP keeps its shard "
                          "and all-reduces only the output (g) and x's gradient (f)")


@check("megatron_mlp", references=["TPMLP", "megatron_mlp"], observes=[
    "on 2 and 4 thread ranks: the collectives each rank called in forward and in backward "
    "(one all-reduce each, of at most one activation's bytes: no weight travels)",
    "every rank's output, x's gradient and each shard's gradient against the unsplit MLP"])
def check_megatron_mlp(fn):
    """fn(x, up_w, up_b, down_w, down_b, comm): the Megatron SmallMLP on one rank's shards (up
    split by columns, down by rows), with f and g, differentiable: every rank returns the whole
    output, and x gets the whole gradient."""
    g = fresh_generator()
    for k in (2, 4):
        # more hidden units than rows: rebuilt weights are bigger than an activation
        n, d, h = randint(g, 2, 3), randint(g, 3, 6), k * randint(g, 2, 3)
        x = torch.randn(n, d, generator=g)
        W1, b1 = torch.randn(h, d, generator=g), torch.randn(h, generator=g)
        W2, b2 = torch.randn(d, h, generator=g), torch.randn(d, generator=g)
        R = torch.randn(n, d, generator=g)
        world = World(k, timeout=TIMEOUT, record_ops=True, allow={"all_reduce"}, why=_REBUILDS)
        results = world.run(lambda comm, *a, world=world: _mlp_rank(comm, fn, world, *a),
                            x, W1, b1, W2, b2, R)        # the ranks get copies of the inputs
        ref = [t.clone().requires_grad_() for t in (x, W1, b1, W2, b2)]
        out = torch.nn.functional.gelu(ref[0] @ ref[1].T + ref[2]) @ ref[3].T + ref[4]
        (out * R).sum().backward()
        act = n * d * 4
        for r, (o, xg, grads, split) in enumerate(results):
            fwd = [m for m in world.sent(rank=r) if m.seq < split and m.op != "recv"]
            bwd = [m for m in world.sent(rank=r) if m.seq > split and m.op != "recv"]
            expect(fwd, f"on {k} ranks rank {r} did not communicate in forward: the partial "
                        "outputs of the row-split layer must be all-reduced (g)")
            moved = [t.gathered for t in world.traffic(messages=fwd).records]
            expect(max(moved) <= act,
                   f"rank {r} moved {max(moved)} bytes in one {fwd[0].op} in forward, more "
                   f"than one activation ({act} bytes): that rebuilds weights; a "
                   "tensor-parallel MLP keeps its shard and communicates only the output")
            expect(len(fwd) == 1 and fwd[0].op == "all_reduce",
                   f"rank {r} made {[m.op for m in fwd]} in forward, expected one all-reduce "
                   "(g, after the row-split layer)")
            expect(tensor_close(o, out.detach(), atol=1e-4, what=f"rank {r}'s output"),
                   f"on {k} ranks rank {r}'s output differs from the unsplit MLP by "
                   f"{(o - out.detach()).abs().max():.3g}")
            expect(xg is not None and len(bwd) == 1 and bwd[0].op == "all_reduce"
                   and world.transfer(bwd[0]).payload == act,
                   f"rank {r} made {len(bwd)} all-reduces in backward, expected one of "
                   "x's gradient (f: identity forward, all-reduce backward)")
            expect(tensor_close(xg, ref[0].grad, atol=1e-4),
                   f"rank {r}'s gradient of x differs from the unsplit one: it is only "
                   "this rank's part unless f all-reduces it")
            want = [ref[1].grad.chunk(k, 0)[r], ref[2].grad.chunk(k, 0)[r],
                    ref[3].grad.chunk(k, 1)[r], ref[4].grad]
            for name, got, w in zip(("up_w", "up_b", "down_w", "down_b"), grads, want, strict=True):
                expect(got is not None and tensor_close(got, w, atol=1e-4),
                       f"rank {r}'s gradient of {name} differs from its slice of the "
                       "unsplit gradient")
            world.expect_from_messages(r, o, "output", k)
            world.expect_from_messages(r, xg, "gradient of x", k)


# half the bytes has two causes, one number: name both
_HALF = ("forward only (backward all-reduces as many activations), or each all-reduce counted "
         "as (k-1)/k of its payload: a ring all-reduce is a reduce-scatter then an all-gather, "
         "2(k-1)/k")


def _block_bytes(comm, block, X, R):
    X = X.clone().requires_grad_()
    block_loss(TPBlock(block, comm)(X), R).backward()
    return comm.traffic.payload_bytes("all_reduce"), comm.traffic.wire_bytes("all_reduce")


@check("tp_ring_bytes", references=["ring_bytes_per_device"],
       observes=["the number returned for fresh (batch, seq, width, k), against the wire bytes "
                 "of the from-scratch TPBlock's all-reduces on k thread ranks (recorded: the "
                 "ring's 2(k-1)/k of each payload)"])
def check_tp_ring_bytes(fn):
    """fn(batch, seq, width, k): bytes each rank sends in one forward and backward of the
    tensor-parallel SmallBlock over k ranks, its all-reduces done as rings."""
    g = fresh_generator()
    for case in range(3):   # k = 4 always once: for k = 2 the ring sends the payload
        k = 4 if case == 0 else (2, 4)[randint(g, 0, 1)]
        batch, seq, heads = randint(g, 1, 3), randint(g, 2, 5), k * randint(g, 1, 2)
        width = heads * randint(g, 1, 3)
        with torch.random.fork_rng():      # leave the notebook's random numbers alone
            block = small_block(width, heads, seed=randint(g, 0, 1000))
        X = torch.randn(batch, seq, width, generator=g)
        R = torch.randn(batch, seq, width, generator=g)
        call = f"tp_ring_bytes({batch}, {seq}, {width}, {k})"
        got, dtype = as_number(fn(batch, seq, width, k), call, with_dtype=True)
        payload, want = World(k, timeout=TIMEOUT).run(_block_bytes, block, X, R)[0]
        if near(got, want, dtype, 16, 1e-6):
            continue
        if batch > 1 and abs(got - want / batch) <= 1e-6 * want:
            msg = ("that leaves out the batch: each all-reduce carries batch * seq * width "
                   "numbers") + (f" (or, the same number, {_HALF})" if batch == 2 else "")
        elif abs(got - want / 2) <= 1e-6 * want:
            msg = f"that is half: {_HALF}"
        elif abs(got - payload) <= 1e-6 * want:
            msg = "that is the payload; a ring all-reduce sends 2(k-1)/k of it per rank"
        else:
            msg = (f"the block's all-reduces carried {payload} bytes, so expected "
                   f"{shown(got, want)[1]}{rounding_note(got, want, dtype)}")
        raise CheckFailed(f"{call} returned {shown(got, want)[0]}: {msg}")


# --- the loss over a split vocabulary -----------------------------------------------------------
def _vocab_rank(comm, fn, pieces, target):
    r = comm.rank
    mine = pieces[r].requires_grad_()          # this rank's columns, copied before the run
    loss = fn(mine, target.clone(), comm, r * mine.shape[-1])
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        raise CheckFailed(f"rank {r} returned {type(loss).__name__} without a gradient path: "
                          "compute the loss from the logits with differentiable operations")
    loss.backward()
    return loss.detach(), mine.grad


_LOGITS = dict.fromkeys(("all_gather", "broadcast", "send", "reduce_scatter", "all_to_all"),
                        "that gathered the logits, whole or piece by piece; all-reduce one "
                        "number per row instead (a maximum, a sum, the target's logit)")


@check("vocab_loss", references=["vocab_parallel_cross_entropy"], observes=[
    "on 2 and 4 thread ranks: every collective each rank called and its bytes (at most one "
    "number per row per call, and about three per row in all: the logits never travel)",
    "every rank's loss and its logits' gradient against the unsplit cross-entropy, with logits "
    "large enough that exp() overflows without the maximum taken out first"])
def check_vocab_loss(fn):
    """fn(logits, target, comm, start): the mean cross-entropy over a vocabulary split along
    the ranks (this rank: columns start .. start + V/k), differentiable."""
    g = fresh_generator()
    for k in (2, 4):
        n, v = randint(g, 3, 6), randint(g, 3, 5)
        logits = torch.randn(n, k * v, generator=g) * 3
        logits[randint(g, 0, n - 1)] += 120.0            # exp(120) overflows float32
        target = torch.randint(0, k * v, (n,), generator=g)
        world = World(k, timeout=TIMEOUT, record_ops=True, allow={"all_reduce"}, why=_LOGITS)
        pieces = [logits[:, r * v:(r + 1) * v].clone() for r in range(k)]   # the ranks' copies
        results = world.run(_vocab_rank, fn, pieces, target)
        ref = logits.clone().requires_grad_()
        want = torch.nn.functional.cross_entropy(ref, target)
        want.backward()
        for r in range(k):
            sent = world.traffic(r)
            expect(len(sent), f"on {k} ranks rank {r} never communicated: no rank holds the "
                              "whole logits, so the sums over the vocabulary must be "
                              "all-reduced")
            big = [t for t in sent.records if t.gathered > n * 8]
            if big:
                raise CheckFailed(f"rank {r} moved {big[0].payload} bytes in one {big[0].op} "
                                  f"(there are {n} rows): it gathered the logits; all-reduce "
                                  "one number per row instead (a maximum, a sum, the target's "
                                  "logit)")
            total = sent.numbers(gathered=True)                # many small ones too
            expect(total <= 4 * n, f"on {k} ranks rank {r} sent {total} numbers in "
                   f"{len(sent)} call(s), for {n} rows: it gathered the logits piece by piece; "
                   "all-reduce about three numbers per row in all (a maximum, a sum, the "
                   "target's logit)")
        for r, (loss, grad) in enumerate(results):
            expect(torch.isfinite(loss).all(),
                   f"rank {r}'s loss is {loss.item()}: exp() overflowed on logits near 120; "
                   "subtract the maximum over all ranks first")
            expect(abs(loss.item() - want.item()) <= 1e-4 * max(1.0, abs(want.item())),
                   f"on {k} ranks rank {r}'s loss is {loss.item():.6f}, the unsplit "
                   f"cross-entropy {want.item():.6f}")
            expect(grad is not None and tensor_close(
                grad, ref.grad[:, r * v:(r + 1) * v], atol=1e-5),
                   f"rank {r}'s gradient of its logits differs from its columns of the "
                   "unsplit one (the sums must pass the gradient back: g)")
            world.expect_from_messages(r, loss, "loss", k)
            world.expect_from_messages(r, grad, "gradient of its logits", k)
