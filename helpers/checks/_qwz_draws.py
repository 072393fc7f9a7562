"""The draws and bounds of `check_qwz_all_gather` (zero.py): shards whose blocks differ in size
by up to 10**5, and each element's bound, half a round-to-nearest step of its own block."""
import torch

__all__ = ["shards", "bounds"]


def shards(g, world, n, block):
    """Shards whose blocks differ in size by up to 10**5: one scale for a whole shard rounds
    the small blocks to nothing."""
    out = []
    for _ in range(world):
        x = torch.randn(n, generator=g)
        mags = 10 ** (torch.rand(-(-n // block), generator=g) * 5 - 3)
        out.append(x * mags.repeat_interleave(block)[:n])
    return out


def bounds(shard, block):
    """Per element: half a round-to-nearest step of its block (absmax / 127 / 2)."""
    n = shard.numel()
    x = torch.cat([shard, shard.new_zeros(-n % block)]).view(-1, block)
    return (x.abs().amax(1) / 127 / 2).repeat_interleave(block)[:n]
