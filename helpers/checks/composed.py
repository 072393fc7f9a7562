"""Checks for the chapter that composes every split: a rank's three groups, Korthikanti's count,
tensor-parallel bytes, what accumulation costs ZeRO-2.

Random inputs are drawn so that the shortcuts learners take give numbers the rule does not.
"""
import math

import torch

from .. import activation_bytes_per_token, data_parallel_costs, rank_grid, ring_bytes_per_device
from ._core import (
    CheckFailed,
    as_number,
    check,
    expect,
    fresh_generator,
    near,
    randint,
    rounding_note,
    shown,
)

__all__ = ["check_mesh_groups_3d", "check_activation_bytes", "check_tp_bytes_per_step",
           "check_accumulation_bytes"]


@check("mesh_groups_3d", references=["rank_grid", "coords_of"], observes=[
    "the three groups returned for every rank of a 2x2x2, of sizes 2, 3 and 4 in a fresh order, "
    "and of fresh mesh shapes"])
def check_mesh_groups_3d(fn):
    """fn(rank, shape) -> {"pp": [...], "dp": [...], "tp": [...]} for a (pp, dp, tp) mesh."""
    g = fresh_generator()
    # forced: three different sizes, so that no two axes read in the wrong order agree
    apart = tuple((2, 3, 4)[i] for i in torch.randperm(3, generator=g).tolist())
    shapes = [(2, 2, 2), apart] + [tuple(randint(g, 1, 3) for _ in range(3)) for _ in range(3)]
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
             (None, True, "selective"), (None, False, "full"), (None, True, "full")]
    for tp, sp, rec in cases:
        log_heads = randint(g, 2, 5)
        heads = 2 ** log_heads
        width = heads * 2 ** randint(g, 4, 7)
        seq = 2 ** randint(g, 6, 11)
        if rec == "none" and not sp:     # forced: an odd seq, so 5 a s / h has a fraction (a
            seq += 2 * randint(g, 0, seq // 2 - 1) + 1     # `//` or int() loses it)
        tp = tp or 2 ** randint(g, 1, min(3, log_heads))   # tp divides the heads
        what = f"activation_bytes({width}, {heads}, {seq}, tp={tp}, sp={sp}, {rec!r})"
        got, dtype = as_number(fn(width, heads, seq, tp, sp, rec), what, with_dtype=True)
        want = activation_bytes_per_token(width, heads, seq, tp, sp, rec, 2, flash=False,
                                          dropout=True, ln_stats=False)
        gs, ws = shown(got, want, 6)
        expect(near(got, want, dtype, 16, 1e-6),
               f"{what} returned {gs}, expected {ws} (per token: "
               f"{want / width:.4g} x width){rounding_note(got, want, dtype)}")


@check("tp_bytes_per_step", references=["stage_costs"], observes=[
    "the bytes returned for fresh stages, micro-batches, sizes and tensor-parallel degrees, "
    "2- and 4-byte activations both"])
def check_tp_bytes_per_step(fn):
    """fn(blocks, m, tokens, width, tp, dtype_bytes) -> bytes a tensor-parallel rank sends
    per step (ring all-reduces of f and g, forward and backward)."""
    g = fresh_generator()
    first = (2, 4)[randint(g, 0, 1)]
    # Both dtypes forced on cases where every factor counts (tp, blocks, m > 1; tp = 1 sends
    # nothing), then two drawn freely: a formula that drops an argument fails on every draw.
    # The first tp is odd, so (tp - 1) / tp of the power-of-two bytes has a fraction (`//`).
    for i, (low, b) in enumerate(((2, first), (2, 6 - first), (1, None), (1, None))):
        blocks, m, tokens = randint(g, low, 8), randint(g, low, 8), 2 ** randint(g, 4, 12)
        width, tp = 2 ** randint(g, 5, 10), randint(g, low, 8)
        tp = 2 * randint(g, 1, 3) + 1 if i == 0 else tp
        b = b or (2, 4)[randint(g, 0, 1)]
        what = f"tp_bytes_per_step({blocks}, {m}, {tokens}, {width}, {tp}, {b})"
        got, dtype = as_number(fn(blocks, m, tokens, width, tp, b), what, with_dtype=True)
        want = 4 * blocks * m * ring_bytes_per_device(tokens * width * b, tp)
        if near(got, want, dtype, 16, 1e-9, max(1, want)):
            continue
        # the slips tp_ring_bytes names; one number can have two causes: name each that fits
        slips = [(want / 2, "forward only (f and g each all-reduce one activation in backward "
                            "too)"),
                 (want / 2, "each all-reduce counted as (tp-1)/tp of its activation: a ring "
                            "all-reduce is a reduce-scatter then an all-gather, 2(tp-1)/tp"),
                 (want / m, "the micro-batches left out: each of the m runs every f and g"),
                 (want / blocks, "the blocks left out: each block has its own f and g"),
                 (4 * blocks * m * tokens * width * b, "the payload: a ring all-reduce sends "
                                                       "2(tp-1)/tp of it per rank"),
                 (want * (6 - b) / b, f"{6 - b}-byte activations: dtype_bytes is {b}")]
        named = [w for v, w in slips if v != want and near(got, v, dtype, 16, 1e-9, max(1, want))]
        gs, ws = shown(got, want, 6)
        raise CheckFailed(f"{what} returned {gs}, expected {ws}" + (
            ": that is " + "; or, the same number, ".join(named) if named
            else rounding_note(got, want, dtype)))


@check("accumulation_bytes", references=["data_parallel_costs", "sharding_costs",
                                         "stage_costs"], observes=[
    "the bytes returned for fresh parameter counts, ranks and micro-batches, both ways of "
    "accumulating, each with 2- and 4-byte gradients"])
def check_accumulation_bytes(fn):
    """fn(n_params, k, m, acc, dtype_bytes) -> bytes a ZeRO-2 rank sends per step with m
    micro-batches: acc "every" (a reduce-scatter per micro-batch) or "no_sync"."""
    g = fresh_generator()
    first = (2, 4)[randint(g, 0, 1)]
    # Each way of accumulating with both dtypes (forced, in a fresh order), not left to the draw.
    fails = []
    for acc, b in (("every", first), ("no_sync", first), ("every", 6 - first),
                   ("no_sync", 6 - first)):
        n, k, m = randint(g, 10, 10**6), randint(g, 2, 16), randint(g, 2, 16)
        what = f"accumulation_bytes({n}, {k}, {m}, {acc!r}, {b})"
        got, dtype = as_number(fn(n, k, m, acc, b), what, with_dtype=True)
        want = data_parallel_costs(n, k, "zero2", m, acc, "adam", b)["sent_bytes"]
        if near(got, want, dtype, 16, 1e-9, max(1.0, want)):
            continue
        once, tol = (k - 1) / k * n * b, 1e-6 * max(want, 1.0)
        other = data_parallel_costs(n, k, "zero2", m, acc, "adam", 6 - b)["sent_bytes"]
        fails.append((what, got, want, b, dtype, {
            "micro": acc == "every" and abs(got - 2 * once) < tol,
            "all-reduce": abs(got - 2 * m * once) < tol, "dtype": abs(got - other) < tol}))
    if fails:       # a hint only where it explains every failing case (one draw can fit two)
        what, got, want, b, dtype, _ = fails[0]
        hints = {"micro": "that ignores the micro-batches: each one's backward reduce-scatters",
                 "all-reduce": "that is m all-reduces: a reduce-scatter moves half of one, and "
                               "the all-gather of the parameters comes once",
                 "dtype": f"that counts {6 - b}-byte gradients: each takes dtype_bytes ({b})"}
        named = [h for h in hints if all(f[5][h] for f in fails)]
        gs, ws = shown(got, want, 6)
        raise CheckFailed(f"{what} returned {gs}: " + (hints[named[0]] if named else
                          f"expected {ws}{rounding_note(got, want, dtype)}"))
