"""Checks for the exercises of Part VI's pipeline chapter (pipeline_dist): the idle share of
measured boxes, a forward-only pipeline run on thread ranks whose every message and stage call
is recorded (micro-batch j must travel on before j + 1 comes in), cuts by measured time, and a
micro-batch count PyTorch's schedules accept."""
from itertools import pairwise

import torch
from torch import nn

from .. import balanced_cuts, validate_pipelining
from ._core import (
    CheckFailed,
    Recorder,
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
    storage_key,
    tensor_close,
)
from ._core.inputs import expect_unchanged, kept

__all__ = ["check_idle_share", "check_pipeline_forward", "check_cuts_for_times",
           "check_microbatches_for", "check_weight_grads"]

TIMEOUT = 5.0   # seconds a thread-rank waits for a message that never comes


# --- idle share -------------------------------------------------------------------------------
def _timelines(g, p, m, equal, backward=True):
    """Per-rank timelines of a GPipe step with stage times that are equal or not; without the
    backward, a forward-only pipeline's (the last rank ends last, not rank 0)."""
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
    for j in range(m if backward else 0):
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


@check("idle_share", references=["timeline_bubble", "busy_times"], observes=[
    "the share returned for fresh GPipe timelines (equal and unequal stages, the step starting "
    "at t = 100 s) and a forward-only pipeline's (its last rank ends last, not rank 0), in a "
    "fresh order, against the idle rank-time over p x the span, computed by the check"])
def check_idle_share(fn):
    """fn(timelines) -> idle share of the step, from per-rank lists of F/B boxes."""
    g = fresh_generator()
    kinds = [(True, True), (False, True), (False, True), (False, False)]   # (equal, backward)
    for i in torch.randperm(len(kinds), generator=g).tolist():
        equal, backward = kinds[i]
        p, m = randint(g, 2, 4), randint(g, 1, 8)
        tls = _timelines(g, p, m, equal, backward)
        got, dtype = as_number(fn([list(tl) for tl in tls]), "idle_share(timelines)",
                               with_dtype=True)
        want = _bubble(tls)
        ends = [e["end"] for tl in tls for e in tl]
        # the share cancels times near 100 s: rounding them costs (last end / span) relative
        scale = max(ends) / (max(ends) - min(e["start"] for tl in tls for e in tl))
        steps = 2 * len(ends) + 8
        close = lambda x, got=got, dtype=dtype, steps=steps, scale=scale: near(
            got, x, dtype, steps, 1e-9, scale)
        if close(want):
            continue
        formula = (p - 1) / (m + p - 1)
        spans = [max(e["end"] for e in tl) - min(e["start"] for e in tl) for tl in tls]
        busy = sum(e["end"] - e["start"] for tl in tls for e in tl)
        own = 1 - sum(sum(e["end"] - e["start"] for e in tl) / s
                      for tl, s in zip(tls, spans, strict=True)) / p
        if close(formula) and not equal:
            msg = ("that is (p-1)/(m+p-1), which assumes equal stages; these stages differ: "
                   "measure the idle time from the boxes")
        elif close(own):
            msg = ("each rank's idle time must be counted over the whole step (first start "
                   "to last end on any rank), not over that rank's own span")
        elif any(close(1 - busy / (p * s)) for s in spans):
            last = max(range(p), key=lambda r: max(e["end"] for e in tls[r]))
            msg = (f"that takes one rank's first start and last end as the step; here rank "
                   f"{last} ends last: the step runs from the first start to the last end on "
                   "any rank")
        else:
            msg = f"expected {shown(got, want)[1]}{rounding_note(got, want, dtype)}"
        what = "" if backward else " (forward only)"
        raise CheckFailed(f"with p={p}, m={m}{what} you returned {shown(got, want)[0]}: {msg}")


# --- a forward-only pipeline ------------------------------------------------------------------
class _Watched(nn.Module):
    """The stage the answer is given: every call leaves ("F", rows) in its rank's timeline. The
    stage and the world live in a closure only: no attribute runs the stage unwatched or marks
    the timeline without running it. Its parameters are the stage's (provenance and untouched.py
    see them as handed to this rank)."""

    def __init__(self, stage, world):
        super().__init__()
        self.params = nn.ParameterList(stage.parameters())

        def watched(x):
            world.mark(("F", int(x.shape[0])))
            return stage(x)
        self._watched = watched

    def forward(self, x):
        return self._watched(x)


def _forward_rank(comm, fn, stages, X, m, n, widths):
    r = comm.rank
    return fn(stages[r], comm, X if r == 0 else None, m, n, (widths[r],))


def _events(world, s):
    """Rank s's recorded steps in order: ("F", rows), ("send", k), ("recv", k) (k-th message)."""
    out, counts = [], {"send": 0, "recv": 0}
    for _, kind, detail in world.timeline[s]:
        if kind == "mark":
            out.append(detail)
        elif kind in counts:
            out.append((kind, counts[kind]))
            counts[kind] += 1
    return out


def _check_overlap(events, s, p, m, rows):
    forwards = [e for e in events if e[0] == "F"]
    expect(not (len(forwards) == 1 and m > 1),
           f"rank {s} ran its stage once, on all {sum(rows)} rows: run it on each micro-batch "
           "as it arrives, so the stages overlap")
    expect([e[1] for e in forwards] == rows,
           f"rank {s} ran its stage on {[e[1] for e in forwards]} rows, expected one call per "
           f"micro-batch, in order: {rows}")
    at = {e: i for i, e in enumerate(events)}
    f_at = [i for i, e in enumerate(events) if e[0] == "F"]
    for j in range(m - 1):
        if s < p - 1:
            later = at[("recv", j + 1)] if s > 0 else f_at[j + 1]
            expect(at[("send", j)] < later,
                   f"rank {s} {'received' if s > 0 else 'computed'} micro-batch {j + 1} before "
                   f"it sent micro-batch {j} on: pass each micro-batch on as soon as it is "
                   "computed, so the next stage works while this one computes the next")
        if s > 0:
            expect(f_at[j] < at[("recv", j + 1)],
                   f"rank {s} received micro-batch {j + 1} before it computed micro-batch {j}: "
                   "compute each micro-batch as it arrives, so the stages overlap")


@check("pipeline_forward", observes=[
    "on 2 and 3 thread ranks: every message (sender, receiver, bytes, order) and every call "
    "of each rank's stage (rows), recorded by the harness's World",
    "one stage call per micro-batch; rank r sends micro-batch j before it receives (or, rank "
    "0, computes) j + 1, and computes j before it receives j + 1: the stages overlap",
    "the last rank's output against the unsplit net"])
def check_pipeline_forward(fn):
    """fn(stage, comm, X, num_microbatches, batch_size, in_shape): a forward-only pipeline; the
    last rank returns the output of the whole net (the other ranks return anything)."""
    g = fresh_generator()
    for p in (2, 3):
        m, n = randint(g, 3, 4), randint(g, 6, 12)
        while p == 2 and n % m in (0, m - 1):   # forced: chunk's sizes are not tensor_split's
            n += 1
        widths = [randint(g, 3, 7) for _ in range(p + 1)]
        with torch.random.fork_rng():      # leave the notebook's random numbers alone
            torch.manual_seed(int(torch.randint(0, 2**31, (), generator=g)))
            stages = [nn.Sequential(nn.Linear(widths[s], widths[s + 1]), nn.Tanh())
                      for s in range(p)]
        X = torch.randn(n, widths[0], generator=g)
        params = [X, *(q for st in stages for q in st.parameters())]
        copies = kept(*params)
        world = World(p, timeout=TIMEOUT, record_ops=True, allow={"send"})   # recv allowed too
        watched = [_Watched(st, world) for st in stages]
        results = world.run(_forward_rank, fn, watched, X, m, n, widths)
        expect_unchanged(f"pipeline_forward on {p} ranks", copies, params,
                         ["X", *(f"a parameter of stage {s}" for s, st in enumerate(stages)
                                 for _ in st.parameters())])
        with torch.no_grad():          # the expected output, after the answer ran
            want = nn.Sequential(*stages)(X)
        rows = [len(c) for c in torch.arange(n).tensor_split(m)]
        for s in range(p - 1):
            sends = [(t.dst, t.payload) for t in world.traffic(s).records if t.op == "send"]
            expect(sends, f"on {p} ranks rank {s} sent nothing to rank {s + 1}: each "
                          "stage must pass its output on with comm.send")
            expect(all(dst == s + 1 for dst, _ in sends),
                   f"rank {s} sent to ranks {sorted({d for d, _ in sends})}; a stage sends "
                   f"only to the next one ({s + 1})")
            expect(len(sends) == m,
                   f"rank {s} sent {len(sends)} message(s), expected one per micro-batch "
                   f"({m}): cut the batch into micro-batches so the stages overlap")
            want_bytes = [rr * widths[s + 1] * 4 for rr in rows]
            expect([b for _, b in sends] == want_bytes,
                   f"rank {s} sent messages of {[b for _, b in sends]} bytes, expected "
                   f"{want_bytes}: one micro-batch of stage {s}'s output each, in order")
        for s in range(p):
            _check_overlap(_events(world, s), s, p, m, rows)
        got = results[-1]
        expect(isinstance(got, torch.Tensor),
               f"the last rank returned {type(got).__name__}, expected the output tensor")
        expect(tuple(got.shape) == tuple(want.shape),
               f"the last rank returned shape {tuple(got.shape)}, expected "
               f"{tuple(want.shape)} (all micro-batches, in order)")
        expect(tensor_close(got.detach(), want, atol=1e-5),
               f"on {p} ranks the output differs from the unsplit net (by "
               f"{(got.detach() - want).abs().max():.3g})")
        world.expect_from_messages(p - 1, got, "output (the last stage's)", p)


# --- cuts by measured time --------------------------------------------------------------------
@check("cuts_for_times", references=["balanced_cuts"], observes=[
    "the cuts returned for fresh per-layer times (one slow first layer among them, and the "
    "fixed times [1.8, 1.2, 0.5, 3.9, 0.1] over 3 stages, which cuts nearest the time "
    "quantiles or closed greedily miss, in a fresh place): valid "
    "(increasing, no empty stage) and with a slowest stage no slower than the best cut's, "
    "computed by the check"])
def check_cuts_for_times(fn):
    """fn(times, p) -> cuts: p-1 increasing layer indices that make the slowest stage as fast
    as possible, for per-layer measured `times`."""
    g = fresh_generator()
    fixed = randint(g, 1, 6)
    for case in range(7):
        L, p = randint(g, 4, 10), randint(g, 2, 4)
        times = [randint(g, 1, 40) / 10 for _ in range(L)]
        if case == 0:                  # one slow layer first: equal counts are far off
            times[0] = sum(times)
        if case == fixed:              # cuts at the time quantiles, or greedy ones, are off
            times, p = [1.8, 1.2, 0.5, 3.9, 0.1], 3
            L = len(times)
        call = f"cuts_for_times({times}, {p})"
        got = fn(list(times), p)
        try:
            cuts = [as_int(c, call) for c in got]
        except TypeError:
            raise CheckFailed(f"{call} returned {got!r}, expected a list of ints") from None
        expect(len(cuts) == p - 1, f"{call} returned {len(cuts)} cuts, expected {p - 1}")
        expect(all(a < b for a, b in zip([0] + cuts, cuts + [L], strict=True)),
               f"{call} returned {cuts}: cuts must increase within 1..{L - 1}, so every "
               "stage gets at least one layer")
        bounds = [0, *cuts, L]
        slowest = max(sum(times[a:b]) for a, b in pairwise(bounds))
        best_cuts = balanced_cuts(times, p)
        bb = [0, *best_cuts, L]
        best = max(sum(times[a:b]) for a, b in pairwise(bb))
        if slowest > best + 1e-9:
            even = [round(L * i / p) for i in range(1, p)]
            hint = (": that gives every stage the same number of layers; balance the "
                    "measured times instead") if cuts == even and case != fixed else ""
            raise CheckFailed(f"{call} returned {cuts}: slowest stage {slowest:.2f} s, "
                              f"but {best_cuts} gives {best:.2f} s{hint}")


# --- a micro-batch count PyTorch's schedules accept -------------------------------------------
@check("microbatches_for", observes=[
    "each count returned is fed to helpers.validate_pipelining (PyTorch's schedules): it must be "
    "accepted, and no accepted count may be closer to the one wanted (a tie: the larger)",
    "fixed cases (10, 4), (12, 5), (7, 3), (16, 8) and (7, 6), whose count is the batch size "
    "itself, in every call, besides four drawn"])
def check_microbatches_for(fn):
    """fn(batch_size, wanted) -> the micro-batch count closest to `wanted` (the larger on a tie)
    that torch.distributed.pipelining's schedules accept for `batch_size`."""
    g = fresh_generator()
    cases = [(10, 4), (12, 5), (7, 3), (16, 8), (7, 6)]   # (7, 6): the batch size itself
    cases += [(randint(g, 6, 60), randint(g, 2, 9)) for _ in range(4)]
    for n, wanted in cases:
        call = f"microbatches_for({n}, {wanted})"
        m = as_int(fn(n, wanted), call)
        try:
            validate_pipelining("Schedule1F1B", n, m, 2, 4, [2])
        except ValueError as e:
            raise CheckFailed(f"{call} returned {m}, which PyTorch's schedules refuse: "
                              f"{e}") from None
        ok = [k for k in range(1, n + 1) if n % k == 0]
        best = min(ok, key=lambda k: (abs(k - wanted), -k))
        expect(m == best, f"{call} returned {m}; {best} is accepted too and closer to "
                          f"{wanted}" + (" (on a tie take the larger: more micro-batches, a "
                                         "smaller bubble)" if abs(best - wanted) ==
                                         abs(m - wanted) else ""))


# --- the weight gradient, later (zero bubble) ---------------------------------------------------
# ops that read a tensor for its shape alone: what they make is made from neither x nor dy
_SHAPE_ONLY = frozenset({"zeros_like", "ones_like", "empty_like", "full_like", "rand_like",
                         "randn_like", "randint_like", "new_zeros", "new_ones", "new_empty",
                         "new_full", "new_empty_strided"})


class _EngineRecorder(Recorder):
    """A Recorder that also notes each operation the autograd engine ran (a backward)."""

    def __init__(self):
        super().__init__()
        self.engine = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch._C._current_graph_task_id() != -1:
            self.engine.append(func.__name__.split(".")[0])
        return super().__torch_dispatch__(func, types, args, kwargs)


def _forward_ops(rec, x, dy):
    """(operation, operand) for each operation that computes with data made from x (not dy)
    and an operand of more than one element made from neither x nor dy (a weight, or a stand-in
    for one): a forward, by dataflow over the storage versions the Recorder saw. An operand
    the weight cancels (x * zeros) is still an operand; one overwritten whole (out=) is not."""
    X, DY, NONE = frozenset(["x"]), frozenset(["dy"]), frozenset()
    made = {(storage_key(x), 0): X, (storage_key(dy), 0): DY}
    found = []
    for op in rec.ops:
        written = {r.key for r in op.writes}
        operands = [(made.get((r.key, r.version), NONE), r) for i, r in enumerate(op.reads)
                    if i not in op.targets and (i not in op.blind or r.key not in written)]
        kinds = [k for k, _ in operands]
        weights = [r for k, r in operands if k == NONE and r.numel > 1]
        if op.is_work and X in kinds and not any(DY <= k for k in kinds) and weights:
            found.append((op, weights[0]))
        read = [made.get((r.key, r.version), NONE) for i, r in enumerate(op.reads)
                if i not in op.blind]
        out = NONE if op.name in _SHAPE_ONLY else NONE.union(*read)
        for r in op.outputs + op.writes:
            made[(r.key, r.version)] = out
    return found


@check("weight_grads", references=["LinearTape"], observes=[
    "the (dW, db) returned for fresh inputs x of 2 and 3 dimensions and output gradients dy, "
    "against autograd's gradients of an nn.Linear",
    "what every aten operation the answer ran is made from (Recorder, dataflow): none may "
    "compute with x and a tensor made from neither x nor dy (a weight: the forward again), and "
    "none may be run by autograd's engine (a backward); how many products it takes is free"])
def check_weight_grads(fn):
    """fn(x, dy) -> (dW, db): an nn.Linear's weight and bias gradients from the input x it
    saw and the gradient dy of its output, as the zero-bubble W box computes them."""
    g = fresh_generator()
    for shape in ((randint(g, 3, 6),), (randint(g, 2, 3), randint(g, 2, 4))):
        d_in, d_out = randint(g, 2, 5), randint(g, 3, 6)
        while d_out == d_in:
            d_out = randint(g, 2, 6)
        x = torch.randn(*shape, d_in, generator=g)
        dy = torch.randn(*shape, d_out, generator=g)
        lin = nn.Linear(d_in, d_out)
        call = f"weight_grads(x of shape {tuple(x.shape)}, dy of shape {tuple(dy.shape)})"
        handed = x.clone(), dy.clone()
        with _EngineRecorder() as rec:
            got = fn(*handed)
        lin(x).backward(dy)                   # the expected gradients, after the call
        expect(isinstance(got, (tuple, list)) and len(got) == 2,
               f"{call} returned {type(got).__name__}, expected (dW, db)")
        dW, db = (torch.as_tensor(t) for t in got)
        if tuple(dW.shape) == (d_in, d_out):
            raise CheckFailed(f"{call}: dW has shape {tuple(dW.shape)}, the transpose of the "
                              f"weight's ({d_out}, {d_in}): dW = dy^T x")
        expect(tuple(dW.shape) == (d_out, d_in) and tuple(db.shape) == (d_out,),
               f"{call} returned shapes {tuple(dW.shape)} and {tuple(db.shape)}, expected "
               f"({d_out}, {d_in}) and ({d_out},)")
        forward = _forward_ops(rec, *handed)
        if forward:
            op, weight = forward[0]
            raise CheckFailed(f"{call} ran the layer's forward again: its {op.name} computes "
                              f"with x and a {list(weight.shape)} tensor made from neither x "
                              "nor dy (a weight); W needs only x and dy: dW = dy^T x, in one "
                              "product or many")
        expect(not rec.engine, f"{call} ran the layer's forward again and a backward through "
               f"it (autograd's engine ran {', '.join(dict.fromkeys(rec.engine))}); W needs "
               "only x and dy, no graph: dW = dy^T x")
        expect(tensor_close(dW, lin.weight.grad, atol=1e-5),
               f"{call}: dW differs from the weight's gradient by "
               f"{(dW - lin.weight.grad).abs().max():.3g}")
        expect(tensor_close(db, lin.bias.grad, atol=1e-5),
               f"{call}: db differs from the bias's gradient (sum dy over every row, of every "
               "leading dimension)")
