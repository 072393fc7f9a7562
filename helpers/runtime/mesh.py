"""Named mesh dimensions turned into process groups, in one place (as torchtitan's ParallelDims
and picotron's process-group manager do): by hand (`new_groups`, one `dist.new_group` per row)
or through torch (`device_mesh`, `init_device_mesh`). Both lay the ranks out row-major, the last
name varying fastest, so the innermost dimension's ranks are consecutive (one node);
tests/test_mesh.py proves the two give every rank the same groups.
"""
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..validate import validate_positive_int

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["rank_grid", "coords_of", "new_groups", "device_mesh"]

MESH_DIMS = ("pp", "dp", "tp")   # Part VII's order: outermost first, tp ranks consecutive


def _checked(shape: Sequence[int], names: Sequence[str], world: int | None = None
             ) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(shape, names) as tuples; an error naming the fix for a mesh that cannot be laid out."""
    shape, names = tuple(shape), tuple(names)
    if len(shape) != len(names):
        raise ValueError(f"a mesh of shape {shape} needs {len(shape)} dimension names, got "
                         f"{names}")
    if len(set(names)) != len(names):
        raise ValueError(f"mesh dimension names must differ, got {names}")
    for name, s in zip(names, shape, strict=True):
        validate_positive_int(s, f"mesh dimension {name}", fix=f"its ranks, in shape {shape}")
    if world is not None and math.prod(shape) != world:
        raise ValueError(f"a {' x '.join(map(str, shape))} mesh ({', '.join(names)}) holds "
                         f"{math.prod(shape)} ranks, the world has {world}: choose dimensions "
                         f"whose product is {world}")
    return shape, names


def rank_grid(shape: Sequence[int], names: Sequence[str] = MESH_DIMS
              ) -> dict[str, list[list[int]]]:
    """{name: [[ranks of one group], ...]} for each dimension of the row-major mesh (the layout
    of init_device_mesh)."""
    shape, names = _checked(shape, names)
    grid = torch.arange(math.prod(shape)).view(*shape)
    return {name: [row.tolist() for row in grid.movedim(d, -1).reshape(-1, shape[d])]
            for d, name in enumerate(names)}


def coords_of(rank: int, shape: Sequence[int], names: Sequence[str] = MESH_DIMS
              ) -> dict[str, int]:
    """{name: index} of a rank in the row-major mesh."""
    shape, names = _checked(shape, names)
    out = {}
    for name, s in zip(reversed(names), reversed(shape), strict=True):
        rank, out[name] = divmod(rank, s)
    return {name: out[name] for name in names}


def new_groups(shape: Sequence[int], names: Sequence[str] = MESH_DIMS
               ) -> dict[str, tuple[dist.ProcessGroup, list[int]]]:
    """{name: (group, ranks)}: this rank's process group along each mesh dimension, built by
    hand. Every rank creates every group in the same order (torch.distributed requires it)."""
    shape, names = _checked(shape, names, dist.get_world_size())
    rank, mine = dist.get_rank(), {}
    for name, groups in rank_grid(shape, names).items():
        for ranks in groups:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = (group, ranks)
    return mine


def device_mesh(shape: Sequence[int], names: Sequence[str], device_type: str = "cpu"
                ) -> "DeviceMesh":
    """torch's DeviceMesh of this world with named dimensions (init_device_mesh), refused with
    the fix when the shape does not hold the world's ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    shape, names = _checked(shape, names, dist.get_world_size())
    return init_device_mesh(device_type, shape, mesh_dim_names=names)
