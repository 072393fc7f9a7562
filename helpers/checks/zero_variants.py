"""Check for the exercise of the ZeRO chapter's section on ZeRO's variants (book/part5/zero.ipynb).

qwZ's gather is judged by what travelled (the bytes every rank handed to the network, in a World
of thread ranks) and by the error of every element against the bound of its own block: half a
step of round-to-nearest with that block's scale (its largest |value| / 127).
"""
import torch

from ._core import World, check, expect, fresh_generator, randint

__all__ = ["check_qwz_all_gather"]


def _shards(g, world, n, block):
    """Shards whose blocks differ in size by up to 10**5: one scale for a whole shard rounds
    the small blocks to nothing."""
    out = []
    for _ in range(world):
        x = torch.randn(n, generator=g)
        mags = 10 ** (torch.rand(-(-n // block), generator=g) * 5 - 3)
        out.append(x * mags.repeat_interleave(block)[:n])
    return out


def _bounds(shard, block):
    """Per element: half a round-to-nearest step of its block (absmax / 127 / 2)."""
    n = shard.numel()
    x = torch.cat([shard, shard.new_zeros(-n % block)]).view(-1, block)
    return (x.abs().amax(1) / 127 / 2).repeat_interleave(block)[:n]


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
        w = World(world)
        got = w.run(lambda comm: fn(shards[comm.rank].clone(), block))
        call = f"qwz_all_gather ({world} ranks, {n} elements each, block {block})"
        want = torch.cat(shards)
        bound = torch.cat([_bounds(s, block) for s in shards])
        blocks = -(-n // block)
        limit = blocks * block + 4 * blocks
        for r in range(world):
            sent = sum(m.nbytes for m in w.sent(rank=r))
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
