"""Checks for the exercises of the new sections of the foundation chapter and Part I (issue 22):
which GPUs talk over which link (gpus), what interleaving costs (network_split), the step time
of data parallelism with overlap (costs).

Formula exercises are judged against what the course's machinery counts (the interleaved
schedule's own clock), on fresh inputs; the course's answer for each is unavailable.
"""
import fractions

from .. import interleaved_order, interleaved_ticks
from ._core import (CheckFailed, as_number, as_pair, check, expect, fresh_generator, randint,
                    rel_close)

__all__ = ["check_link_between", "check_interleaved_costs", "check_dp_step_seconds"]

LINKS = ("NV4", "NV8", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS")


# ---- gpus: which physical GPU is cuda:i, and how is it linked ---------------------------------
def _topology(g, n):
    """A random symmetric `nvidia-smi topo -m` matrix of n GPUs ("X" on the diagonal)."""
    topo = [["X"] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            topo[a][b] = topo[b][a] = LINKS[randint(g, 0, len(LINKS) - 1)]
    return topo


def _visible(spec, n):
    """The physical GPUs cuda:0, cuda:1, ... are, as CUDA reads CUDA_VISIBLE_DEVICES: in the
    order listed, up to the first entry that is not a valid index (None: all of them)."""
    if spec is None:
        return list(range(n))
    out = []
    for entry in spec.split(","):
        entry = entry.strip()
        if not entry.isdigit() or int(entry) >= n or int(entry) in out:
            break
        out.append(int(entry))
    return out


def _specs(g, n):
    """CUDA_VISIBLE_DEVICES values that reorder, drop, and stop at an invalid entry."""
    perm = [int(i) for i in _permutation(g, n)]
    keep = perm[:randint(g, 2, n)]
    bad = str(n + randint(g, 0, 5))
    head = perm[:2]
    tail = [i for i in perm if i not in head][:2]
    return [None, ",".join(map(str, keep)), ",".join(map(str, head + [bad] + tail)),
            ",".join(map(str, perm[::-1])), ",".join(map(str, head + ["-1"] + tail))]


def _permutation(g, n):
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = randint(g, 0, i)
        order[i], order[j] = order[j], order[i]
    return order


@check("link_between", observes=[
    "the link returned for cuda:i and cuda:j on fresh topologies and CUDA_VISIBLE_DEVICES "
    "values (unset, reordered, shortened, with an invalid entry), against the physical GPUs "
    "CUDA makes visible; asking for a GPU that is not visible must raise"])
def check_link_between(fn):
    """fn(topo, visible, i, j): the link `nvidia-smi topo -m` shows between the GPUs PyTorch
    calls cuda:i and cuda:j, when CUDA_VISIBLE_DEVICES is `visible` (None: not set)."""
    g = fresh_generator()
    for _ in range(3):
        n = randint(g, 4, 8)
        topo = _topology(g, n)
        for spec in _specs(g, n):
            shown = _visible(spec, n)
            for _ in range(2):
                i = randint(g, 0, len(shown) - 1)
                j = (i + randint(g, 1, len(shown) - 1)) % len(shown)
                call = f"link_between(topo, {spec!r}, {i}, {j})"
                want = topo[shown[i]][shown[j]]
                got = fn([row[:] for row in topo], spec, i, j)
                if got == want:
                    continue
                hint = ""
                if got == topo[i][j]:
                    hint = (": nvidia-smi numbers the physical GPUs, PyTorch the visible ones; "
                            f"cuda:{i} is the physical GPU at position {i} of "
                            "CUDA_VISIBLE_DEVICES")
                expect(False, f"{call} returned {got!r}, expected {want!r} (cuda:{i} is GPU "
                              f"{shown[i]}, cuda:{j} is GPU {shown[j]}){hint}")
            if spec is not None and len(shown) < len(spec.split(",")):
                _raises_beyond(fn, topo, spec, shown)


def _raises_beyond(fn, topo, spec, shown):
    """cuda:len(shown) does not exist: CUDA stopped at the first invalid entry."""
    i = len(shown)
    call = f"link_between(topo, {spec!r}, 0, {i})"
    try:
        got = fn([row[:] for row in topo], spec, 0, i)
    except (ValueError, IndexError, KeyError, RuntimeError):
        return
    bad = spec.split(",")[i].strip()
    raise CheckFailed(f"{call} returned {got!r}, but there is no cuda:{i}: CUDA makes the GPUs "
                      f"visible up to the first invalid entry ({bad!r}) and ignores the rest, so "
                      f"only {len(shown)} are visible; raise ValueError")


# ---- network_split: interleaving -------------------------------------------------------------
@check("interleaved_costs", references=["interleaved_bubble"], observes=[
    "the pair returned for fresh (p, m, v) against the bubble counted on the clock of the "
    "interleaved 1F1B order (interleaved_order, interleaved_ticks) and the hand-offs between "
    "devices that one micro-batch makes, forward and back, through v*p chunks"])
def check_interleaved_costs(fn):
    """fn(p, m, v) -> (bubble, hand-offs per micro-batch) of interleaved 1F1B: p devices of v
    chunks each, m micro-batches, every chunk op the same time."""
    g = fresh_generator()
    cases = [(randint(g, 2, 5), 0, randint(g, 2, 4)) for _ in range(4)] + [(3, 0, 1)]
    for p, _, v in cases:
        m = p * randint(g, 1, 4)
        ticks = 1 + max(interleaved_ticks(interleaved_order(p, m, v), v).values())
        bubble = fractions.Fraction(ticks - 2 * m * v, ticks)
        sends = 2 * (v * p - 1)
        call = f"interleaved_costs({p}, {m}, {v})"
        got_bubble, got_sends = as_pair(fn(p, m, v), call, "bubble, hand-offs")
        if not rel_close(got_bubble, float(bubble), 8):
            hint = ""
            if rel_close(got_bubble, (p - 1) / (m + p - 1), 8):
                hint = (": that is GPipe's (p-1)/(m+p-1); with v chunks per device the fill and "
                        "drain take p-1 chunk-ops, each 1/v of a stage's")
            expect(False, f"{call}: bubble {got_bubble:g}, but the schedule's clock counts "
                          f"{ticks} ticks of which each device works {2 * m * v}: "
                          f"{float(bubble):g}{hint}")
        hint = ""
        if got_sends == 2 * (p - 1):
            hint = (f": a micro-batch crosses from device to device at every chunk boundary, "
                    f"{v * p - 1} of them, not only at the {p - 1} device boundaries of one lap")
        elif got_sends == v * p - 1:
            hint = ": count the gradient's way back too"
        expect(got_sends == sends, f"{call}: {got_sends:g} hand-offs per micro-batch, expected "
                                   f"{sends}{hint}")


# ---- costs: a data-parallel step with overlap ------------------------------------------------
@check("dp_step_seconds", references=["split_costs"], observes=[
    "the seconds returned for fresh (compute, k, communication), where the communication is "
    "shorter and longer than the backward it can hide behind, against compute/k plus the part "
    "of the communication that the backward (2/3 of the compute) does not hide"])
def check_dp_step_seconds(fn):
    """fn(compute_s, k, comm_s): one data-parallel step: each of k devices computes 1/k of the
    one-device step `compute_s` (backward 2/3 of it), and the all-reduce of `comm_s` overlaps
    with the backward, as far as the backward lasts."""
    g = fresh_generator()
    for hidden in (True, False, True, False, False):
        k = randint(g, 2, 16)
        compute = randint(g, 10, 1000) / 1000
        back = 2 / 3 * compute / k
        comm = back * (randint(g, 10, 90) / 100 if hidden else 1 + randint(g, 10, 300) / 100)
        want = compute / k + max(0.0, comm - back)
        call = f"dp_step_seconds({compute:g}, {k}, {comm:.6g})"
        got, dtype = as_number(fn(compute, k, comm), call, with_dtype=True)
        if rel_close(got, want, 16, dtype):
            continue
        hint = ""
        if rel_close(got, compute / k + comm, 16, dtype):
            hint = (": the all-reduce of the first buckets starts while the backward still runs, "
                    "so only what outlasts the backward adds to the step")
        elif rel_close(got, compute / k + comm - back, 16, dtype):
            hint = (": an all-reduce shorter than the backward hides completely; it cannot make "
                    "the step shorter than the compute")
        elif rel_close(got, compute + max(0.0, comm - 2 / 3 * compute), 16, dtype):
            hint = ": each device computes 1/k of the batch"
        expect(False, f"{call} returned {got:g}, expected {want:g}{hint}")
