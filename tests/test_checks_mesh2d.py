"""The checks of Part VI's 2-D mesh chapter (helpers/checks/mesh2d.py): the worked answers
(taken from the notebook's solution cells: tests/part6_solutions.py), shortcuts of different
kinds with the words of their messages, and other right answers (tests/check_cases.py)."""
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut, worked
from part6_solutions import solution

for check, notebook, name in [
        ("check_mesh_groups", "mesh2d.ipynb", "mesh_groups"),
        ("check_dp_average", "mesh2d.ipynb", "dp_average"),
        ("check_local_shape", "mesh2d.ipynb", "local_shape")]:
    worked(check)(solution(notebook, name, __name__))


# ---- mesh groups --------------------------------------------------------------------------------
@shortcut("check_mesh_groups", "the groups swapped", "swapped")
def groups_swapped(rank, dp, tp):
    i, j = divmod(rank, tp)
    return dict(coords=(i, j), tp_group=[r * tp + j for r in range(dp)],
                dp_group=[i * tp + c for c in range(tp)])


@shortcut("check_mesh_groups", "column-major coordinates", "coords")
def groups_column_major(rank, dp, tp):
    j, i = divmod(rank, dp)
    return dict(coords=(i, j), tp_group=[i * tp + c for c in range(tp)],
                dp_group=[r * tp + j for r in range(dp)])


@other("check_mesh_groups", "read off an arange")
def groups_arange(rank, dp, tp):
    mesh = torch.arange(dp * tp).view(dp, tp)
    i, j = (mesh == rank).nonzero()[0].tolist()
    return dict(coords=(i, j), tp_group=mesh[i].tolist(), dp_group=mesh[:, j].tolist())


# ---- dp average ---------------------------------------------------------------------------------
@shortcut("check_dp_average", "divides only, no communication", "never called all_reduce")
def dp_divide_only(grads, comm):
    for g in grads:
        g /= comm.world


@shortcut("check_dp_average", "sums without dividing", "holds the sum")
def dp_sum_only(grads, comm):
    for g in grads:
        comm.all_reduce(g)


@shortcut("check_dp_average", "all-reduces a clone it drops", "in place")
def dp_clone(grads, comm):
    for g in grads:
        comm.all_reduce(g.clone())
        g /= comm.world


@other("check_dp_average", "one flat all-reduce, written back")
def dp_flat(grads, comm):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.AVG)
    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))


# ---- local shape --------------------------------------------------------------------------------
@shortcut("check_local_shape", "floor division (wrong only when tp does not divide)",
          "torch.chunk")
def local_shape_floor(shape, split_dim, dp, tp, dp_rank):
    shape = list(shape)
    if split_dim is not None:
        shape[split_dim] //= tp
    shape[0] //= dp
    return tuple(shape)


@shortcut("check_local_shape", "the tensor-parallel slice only", "shards it again")
def local_shape_tp_only(shape, split_dim, dp, tp, dp_rank):
    shape = list(shape)
    if split_dim is not None:
        shape[split_dim] //= tp
    return tuple(shape)


@other("check_local_shape", "torch.chunk on a meta tensor, FSDP's way")
def local_shape_chunk(shape, split_dim, dp, tp, dp_rank):
    t = torch.empty(shape, device="meta")
    if split_dim is not None:
        t = t.chunk(tp, split_dim)[0]
    pieces = t.chunk(dp, 0)
    if dp_rank < len(pieces):
        return tuple(pieces[dp_rank].shape)
    return (0, *t.shape[1:])


test_case = parametrize_cases(__name__)
