"""Checks for the exercises of Part VI: pipeline and tensor parallel across processes, 2D.

The student's functions run on ranks played by threads of this process (helpers.runtime.comm
ThreadComm: the same send/recv/all_reduce calls as DistComm over torch.distributed), so a check
sees every message an answer sends: an answer that computes the unsplit product on one rank, or
skips a send, fails for that reason even when its numbers come out right.
"""
import torch
from torch import nn

from ..costs import balanced_cuts
from .. import run_threads
from ._core import CheckFailed, as_number, expect, fresh_generator, randint, run_check

__all__ = ["check_idle_share", "check_pipeline_forward", "check_cuts_for_times",
           "check_row_parallel_linear", "check_megatron_mlp", "check_tp_ring_bytes",
           "check_mesh_groups", "check_dp_average", "check_local_shape"]

TIMEOUT = 2.0   # seconds a thread-rank waits for a message that never comes


def _threads(fn, world, *args):
    try:
        with torch.random.fork_rng():    # building layers draws numbers: not the notebook's
            return run_threads(fn, world, *args, timeout=TIMEOUT)
    except NotImplementedError:
        raise
    except TimeoutError as e:
        raise CheckFailed(f"on {world} ranks: {e}") from None
    except CheckFailed:
        raise
    except Exception as e:   # the student's code crashed on one of the ranks
        raise CheckFailed(f"on {world} ranks your code raised {type(e).__name__}: {e}") from None


# --- pipeline ---------------------------------------------------------------------------------
def _timelines(g, p, m, equal):
    """Per-rank timelines of a GPipe step with stage times that are equal or not."""
    base = [1.0] * p if equal else [randint(g, 1, 9) / 4 for _ in range(p)]
    if not equal:
        base[-1] = base[0] + randint(g, 1, 4) / 4      # at least two stages differ
    done = [[0.0] * m for _ in range(p)]
    tls, free = [[] for _ in range(p)], [0.0] * p
    for j in range(m):
        for s in range(p):
            start = max(free[s], done[s - 1][j] if s else 0.0)
            end = start + base[s]
            tls[s].append(dict(stage=s, micro=j, phase="F", start=start + 100, end=end + 100))
            done[s][j], free[s] = end, end
    for j in range(m):
        for s in reversed(range(p)):
            start = max(free[s], done[s + 1][j] if s < p - 1 else 0.0)
            end = start + 2 * base[s]
            tls[s].append(dict(stage=s, micro=j, phase="B", start=start + 100, end=end + 100))
            done[s][j], free[s] = end, end
    return tls


def _bubble(tls):
    events = [e for tl in tls for e in tl]
    span = max(e["end"] for e in events) - min(e["start"] for e in events)
    return 1 - sum(e["end"] - e["start"] for e in events) / (len(tls) * span)


def check_idle_share(fn):
    """fn(timelines) -> idle share of the step, from per-rank lists of F/B boxes."""

    def body(fn):
        g = fresh_generator()
        for equal in (True, False, False):
            p, m = randint(g, 2, 4), randint(g, 1, 8)
            tls = _timelines(g, p, m, equal)
            want = _bubble(tls)
            got = as_number(fn([list(tl) for tl in tls]), "idle_share(timelines)")
            if abs(got - want) < 1e-9:
                continue
            formula = (p - 1) / (m + p - 1)
            spans = [max(e["end"] for e in tl) - min(e["start"] for e in tl) for tl in tls]
            own = 1 - sum(sum(e["end"] - e["start"] for e in tl) / s
                          for tl, s in zip(tls, spans)) / p
            if abs(got - formula) < 1e-9 and not equal:
                msg = ("that is (p-1)/(m+p-1), which assumes equal stages; these stages differ: "
                       "measure the idle time from the boxes")
            elif abs(got - own) < 1e-9:
                msg = ("each rank's idle time must be counted over the whole step (first start "
                       "to last end on any rank), not over that rank's own span")
            else:
                msg = f"expected {want:.4f}"
            raise CheckFailed(f"with p={p}, m={m} you returned {got:.4f}: {msg}")

    return run_check("idle_share", body, fn)


def _forward_rank(comm, fn, stages, X, m, n, widths):
    r = comm.rank
    out = fn(stages[r], comm, X if r == 0 else None, m, n, (widths[r],))
    return out


def check_pipeline_forward(fn):
    """fn(stage, comm, X, num_microbatches, batch_size, in_shape): a forward-only pipeline; the
    last rank returns the output of the whole net (the other ranks return anything)."""

    def body(fn):
        g = fresh_generator()
        for p in (2, 3):
            m, n = randint(g, 2, 4), randint(g, 5, 12)
            widths = [randint(g, 3, 7) for _ in range(p + 1)]
            with torch.random.fork_rng():      # leave the notebook's random numbers alone
                torch.manual_seed(int(torch.randint(0, 2**31, (), generator=g)))
                stages = [nn.Sequential(nn.Linear(widths[s], widths[s + 1]), nn.Tanh())
                          for s in range(p)]
            X = torch.randn(n, widths[0], generator=g)
            with torch.no_grad():
                want = nn.Sequential(*stages)(X)
            results, comms = _threads(_forward_rank, p, fn, stages, X, m, n, widths)
            for s in range(p - 1):
                sends = [(dst, b) for op, dst, b in comms[s].log if op == "send"]
                expect(sends, f"on {p} ranks rank {s} sent nothing to rank {s + 1}: each "
                              "stage must pass its output on with comm.send")
                expect(all(dst == s + 1 for dst, _ in sends),
                       f"rank {s} sent to ranks {sorted({d for d, _ in sends})}; a stage sends "
                       f"only to the next one ({s + 1})")
                expect(len(sends) == m,
                       f"rank {s} sent {len(sends)} message(s), expected one per micro-batch "
                       f"({m}): cut the batch into micro-batches so the stages overlap")
                rows = [len(c) for c in torch.arange(n).tensor_split(m)]
                want_bytes = [rr * widths[s + 1] * 4 for rr in rows]
                expect(sorted(b for _, b in sends) == sorted(want_bytes),
                       f"rank {s} sent messages of {[b for _, b in sends]} bytes, expected "
                       f"{want_bytes}: one micro-batch of stage {s}'s output each")
            got = results[-1]
            expect(isinstance(got, torch.Tensor),
                   f"the last rank returned {type(got).__name__}, expected the output tensor")
            expect(tuple(got.shape) == tuple(want.shape),
                   f"the last rank returned shape {tuple(got.shape)}, expected "
                   f"{tuple(want.shape)} (all micro-batches, in order)")
            expect(torch.allclose(got.detach(), want, atol=1e-5),
                   f"on {p} ranks the output differs from the unsplit net (by "
                   f"{(got.detach() - want).abs().max():.3g})")

    return run_check("pipeline_forward", body, fn)


def check_cuts_for_times(fn):
    """fn(times, p) -> cuts: p-1 increasing layer indices that make the slowest stage as fast
    as possible, for per-layer measured `times`."""

    def body(fn):
        g = fresh_generator()
        for case in range(6):
            L, p = randint(g, 4, 10), randint(g, 2, 4)
            times = [randint(g, 1, 40) / 10 for _ in range(L)]
            if case == 0:                  # one slow layer first: equal counts are far off
                times[0] = sum(times)
            call = f"cuts_for_times({times}, {p})"
            got = fn(list(times), p)
            try:
                cuts = [int(c) for c in got]
            except (TypeError, ValueError):
                raise CheckFailed(f"{call} returned {got!r}, expected a list of ints")
            expect(len(cuts) == p - 1, f"{call} returned {len(cuts)} cuts, expected {p - 1}")
            expect(all(a < b for a, b in zip([0] + cuts, cuts + [L])),
                   f"{call} returned {cuts}: cuts must increase within 1..{L - 1}, so every "
                   "stage gets at least one layer")
            bounds = [0, *cuts, L]
            slowest = max(sum(times[a:b]) for a, b in zip(bounds, bounds[1:]))
            best_cuts = balanced_cuts(times, p)
            bb = [0, *best_cuts, L]
            best = max(sum(times[a:b]) for a, b in zip(bb, bb[1:]))
            if slowest > best + 1e-9:
                even = [round(L * i / p) for i in range(1, p)]
                hint = (": that gives every stage the same number of layers; balance the "
                        "measured times instead") if cuts == even else ""
                raise CheckFailed(f"{call} returned {cuts}: slowest stage {slowest:.2f} s, "
                                  f"but {best_cuts} gives {best:.2f} s{hint}")

    return run_check("cuts_for_times", body, fn)


# --- tensor parallel ---------------------------------------------------------------------------
def _row_rank(comm, fn, x, W, b):
    k, r = comm.world, comm.rank
    x_shard = x.chunk(k, -1)[r].clone()
    w_shard = W.chunk(k, 1)[r].clone()
    return fn(x_shard, w_shard, b.clone(), comm)


def check_row_parallel_linear(fn):
    """fn(x_shard, w_shard, b, comm): a row-split linear layer; every rank returns x @ W.T + b."""

    def body(fn):
        g = fresh_generator()
        for k in (2, 4):
            n, d_in, d_out = randint(g, 2, 5), k * randint(g, 1, 4), randint(g, 2, 6)
            x, W = torch.randn(n, d_in, generator=g), torch.randn(d_out, d_in, generator=g)
            b = torch.randn(d_out, generator=g)
            want = x @ W.T + b
            results, comms = _threads(_row_rank, k, fn, x, W, b)
            reduces = [c.calls("all_reduce") for c in comms]
            partial = x.chunk(k, -1)[0] @ W.chunk(k, 1)[0].T
            r0 = results[0]
            expect(isinstance(r0, torch.Tensor), f"rank 0 returned {type(r0).__name__}")
            if reduces[0] == 0 and torch.allclose(r0, partial + b, atol=1e-5):
                raise CheckFailed(f"on {k} ranks rank 0 returned only its partial sum: "
                                  "all-reduce the partial products (comm.all_reduce)")
            expect(reduces == [1] * k, f"on {k} ranks the ranks called all_reduce {reduces} "
                                       "times; a row-split layer needs exactly one each")
            nbytes = comms[0].bytes_sent("all_reduce")
            expect(nbytes == n * d_out * 4,
                   f"rank 0 all-reduced {nbytes} bytes; the partial output is {n * d_out * 4}")
            for r, y in enumerate(results):
                if torch.allclose(y, want + (k - 1) * b, atol=1e-5):
                    raise CheckFailed("the bias was added on every rank before the all-reduce, "
                                      f"so it counts {k} times: add it once, after")
                expect(torch.allclose(y, want, atol=1e-5),
                       f"on {k} ranks rank {r}'s output differs from x @ W.T + b by "
                       f"{(y - want).abs().max():.3g}")

    return run_check("row_parallel_linear", body, fn)


def _mlp_rank(comm, fn, x, W1, b1, W2, b2, R):
    k, r = comm.world, comm.rank
    shards = [W1.chunk(k, 0)[r], b1.chunk(k, 0)[r], W2.chunk(k, 1)[r], b2]
    shards = [s.clone().requires_grad_() for s in shards]
    x = x.clone().requires_grad_()
    out = fn(x, *shards, comm)
    n_fwd = len(comm.log)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        raise CheckFailed(f"rank {r} returned {type(out).__name__} without a gradient path: "
                          "build it from x and the shards with differentiable operations")
    (out * R).sum().backward()
    return out.detach(), x.grad, [s.grad for s in shards], n_fwd


def check_megatron_mlp(fn):
    """fn(x, up_w, up_b, down_w, down_b, comm): the Megatron SmallMLP on one rank's shards (up split
    by columns, down by rows), with f and g, differentiable: every rank returns the whole
    output, and x gets the whole gradient."""

    def body(fn):
        g = fresh_generator()
        for k in (2, 4):
            # more hidden units than rows: rebuilt weights are bigger than an activation
            n, d, h = randint(g, 2, 3), randint(g, 3, 6), k * randint(g, 2, 3)
            x = torch.randn(n, d, generator=g)
            W1, b1 = torch.randn(h, d, generator=g), torch.randn(h, generator=g)
            W2, b2 = torch.randn(d, h, generator=g), torch.randn(d, generator=g)
            R = torch.randn(n, d, generator=g)
            ref = [t.clone().requires_grad_() for t in (x, W1, b1, W2, b2)]
            out = torch.nn.functional.gelu(ref[0] @ ref[1].T + ref[2]) @ ref[3].T + ref[4]
            (out * R).sum().backward()
            results, comms = _threads(_mlp_rank, k, fn, x, W1, b1, W2, b2, R)
            act = n * d * 4
            for r, ((o, xg, grads, n_fwd), c) in enumerate(zip(results, comms)):
                fwd, bwd = c.log[:n_fwd], c.log[n_fwd:]
                sent = [b for op, _, b in fwd]
                expect(sent, f"on {k} ranks rank {r} did not communicate in forward: the "
                             "partial outputs of the row-split layer must be all-reduced (g)")
                expect(all(b <= act for b in sent),
                       f"rank {r} all-reduced {max(sent)} bytes in forward, more than one "
                       f"activation ({act} bytes): that rebuilds weights; a tensor-parallel "
                       "SmallMLP keeps its shard and communicates only the output")
                expect(len(fwd) == 1, f"rank {r} made {len(fwd)} all-reduces in forward, "
                                      "expected one (g, after the row-split layer)")
                expect(torch.allclose(o, out.detach(), atol=1e-4),
                       f"on {k} ranks rank {r}'s output differs from the unsplit SmallMLP by "
                       f"{(o - out.detach()).abs().max():.3g}")
                expect(xg is not None and len(bwd) == 1 and bwd[0][2] == act,
                       f"rank {r} made {len(bwd)} all-reduces in backward, expected one of "
                       "x's gradient (f: identity forward, all-reduce backward)")
                expect(torch.allclose(xg, ref[0].grad, atol=1e-4),
                       f"rank {r}'s gradient of x differs from the unsplit one: it is only "
                       "this rank's part unless f all-reduces it")
                want = [ref[1].grad.chunk(k, 0)[r], ref[2].grad.chunk(k, 0)[r],
                        ref[3].grad.chunk(k, 1)[r], ref[4].grad]
                for name, got, w in zip(("up_w", "up_b", "down_w", "down_b"), grads, want):
                    expect(got is not None and torch.allclose(got, w, atol=1e-4),
                           f"rank {r}'s gradient of {name} differs from its slice of the "
                           "unsplit gradient")

    return run_check("megatron_mlp", body, fn)


def _block_bytes(comm, block, X, R):
    from .. import TPBlock, block_loss
    X = X.clone().requires_grad_()
    block_loss(TPBlock(block, comm)(X), R).backward()
    return comm.bytes_sent("all_reduce")


def check_tp_ring_bytes(fn):
    """fn(batch, seq, width, k): bytes each rank sends in one forward and backward of the
    tensor-parallel SmallBlock over k ranks, its all-reduces done as rings. Compared with the
    payload the TPBlock really all-reduces (counted), times the ring's 2(k-1)/k."""

    def body(fn):
        from .. import small_block
        g = fresh_generator()
        for case in range(3):   # k = 4 always once: for k = 2 the ring sends the payload
            k = 4 if case == 0 else (2, 4)[randint(g, 0, 1)]
            batch, seq, heads = randint(g, 1, 3), randint(g, 2, 5), k * randint(g, 1, 2)
            width = heads * randint(g, 1, 3)
            with torch.random.fork_rng():      # leave the notebook's random numbers alone
                block = small_block(width, heads, seed=randint(g, 0, 1000))
            X = torch.randn(batch, seq, width, generator=g)
            R = torch.randn(batch, seq, width, generator=g)
            payloads, _ = _threads(_block_bytes, k, block, X, R)
            want = payloads[0] * 2 * (k - 1) / k
            call = f"tp_ring_bytes({batch}, {seq}, {width}, {k})"
            got = as_number(fn(batch, seq, width, k), call)
            if abs(got - want) <= 1e-6 * want:
                continue
            if abs(got - want / 2) <= 1e-6 * want:
                msg = "that is forward only: backward all-reduces as many activations"
            elif abs(got - payloads[0]) <= 1e-6 * want:
                msg = "that is the payload; a ring all-reduce sends 2(k-1)/k of it per rank"
            else:
                msg = f"the block's all-reduces carried {payloads[0]} bytes, so expected {want:g}"
            raise CheckFailed(f"{call} returned {got:g}: {msg}")

    return run_check("tp_ring_bytes", body, fn)


# --- 2D ---------------------------------------------------------------------------------------
def check_mesh_groups(fn):
    """fn(rank, dp, tp) -> dict(coords=(i, j), tp_group=[ranks], dp_group=[ranks]) for a
    row-major dp x tp mesh (init_device_mesh's layout: tp neighbours have consecutive ranks)."""

    def body(fn):
        g = fresh_generator()
        shapes = [(2, 2), (randint(g, 2, 4), randint(g, 2, 4)), (randint(g, 1, 3), 4)]
        for dp, tp in shapes:
            mesh = torch.arange(dp * tp).view(dp, tp)
            for rank in range(dp * tp):
                i, j = rank // tp, rank % tp
                want = dict(coords=(i, j), tp_group=mesh[i].tolist(),
                            dp_group=mesh[:, j].tolist())
                call = f"mesh_groups({rank}, {dp}, {tp})"
                got = fn(rank, dp, tp)
                expect(isinstance(got, dict) and set(got) >= set(want),
                       f"{call} returned {got!r}; expected a dict with keys coords, tp_group, "
                       "dp_group")
                got = dict(coords=tuple(int(c) for c in got["coords"]),
                           tp_group=[int(r) for r in got["tp_group"]],
                           dp_group=[int(r) for r in got["dp_group"]])
                if got["tp_group"] == want["dp_group"] != want["tp_group"]:
                    raise CheckFailed(f"{call}: the groups are swapped; tp neighbours sit in one "
                                      "row of the mesh (consecutive ranks, one node)")
                for key in ("coords", "tp_group", "dp_group"):
                    expect(got[key] == want[key], f"{call}: {key} is {got[key]}, expected "
                                                  f"{want[key]}")

    return run_check("mesh_groups", body, fn)


def _dp_rank(comm, fn, grads):
    mine = [g[comm.rank].clone() for g in grads]
    ids = [id(t) for t in mine]
    out = fn(mine, comm)
    return mine, out, ids


def check_dp_average(fn):
    """fn(grads, comm): average each gradient tensor over the data-parallel ranks, in place."""

    def body(fn):
        g = fresh_generator()
        for k in (2, 3):
            shapes = [(randint(g, 1, 4), randint(g, 1, 4)) for _ in range(randint(g, 2, 3))]
            grads = [torch.randn(k, *s, generator=g) for s in shapes]
            results, comms = _threads(_dp_rank, k, fn, grads)
            calls = comms[0].calls("all_reduce")
            expect(calls > 0, f"on {k} ranks rank 0 never called all_reduce: each rank only "
                              "has its own gradients until they are summed across ranks")
            for r, (mine, _, _) in enumerate(results):
                for t, full, s in zip(mine, grads, shapes):
                    want = full.mean(0)
                    if torch.allclose(t, full.sum(0), atol=1e-5):
                        raise CheckFailed(f"rank {r} holds the sum over {k} ranks: divide by "
                                          "the number of ranks for the average")
                    expect(torch.allclose(t, want, atol=1e-5),
                           f"on {k} ranks rank {r}'s gradient of shape {s} is not the average "
                           "(the tensors must be changed in place)")

    return run_check("dp_average", body, fn)


def check_local_shape(fn):
    """fn(shape, split_dim, dp, tp) -> the shape one rank holds of a weight of `shape` split by
    tensor parallelism along `split_dim` (0: column-wise, 1: row-wise, None: replicated) over
    tp ranks, then sharded by FSDP (fully_shard shards dim 0) over dp ranks."""

    def body(fn):
        g = fresh_generator()
        for _ in range(4):
            dp, tp = randint(g, 2, 4), randint(g, 2, 4)
            while dp == tp:
                tp = randint(g, 2, 4)
            for split_dim in (0, 1, None):
                shape = [dp * tp * randint(g, 1, 3), tp * randint(g, 1, 3)]
                if split_dim is None:
                    shape = [dp * randint(g, 1, 5)]
                want = list(shape)
                if split_dim is not None:
                    want[split_dim] //= tp
                want[0] //= dp
                call = f"local_shape({tuple(shape)}, {split_dim}, dp={dp}, tp={tp})"
                got = fn(tuple(shape), split_dim, dp, tp)
                try:
                    got = [int(v) for v in got]
                except (TypeError, ValueError):
                    raise CheckFailed(f"{call} returned {got!r}, expected a shape")
                if got == want:
                    continue
                only_tp = list(shape)
                if split_dim is not None:
                    only_tp[split_dim] //= tp
                if split_dim is None and got == list(shape):
                    msg = "a replicated weight is still sharded by FSDP over dp"
                elif got == only_tp:
                    msg = "that is the tensor-parallel slice; FSDP shards it again over dp"
                elif split_dim == 1 and got[0] * dp * tp == shape[0]:
                    msg = ("a row-wise weight is split along dim 1 by tp; FSDP then shards "
                           "dim 0 over dp")
                else:
                    msg = f"expected {tuple(want)}"
                raise CheckFailed(f"{call} returned {tuple(got)}: {msg}")

    return run_check("local_shape", body, fn)
