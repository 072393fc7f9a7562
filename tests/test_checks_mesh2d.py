"""The checks of Part VI's 2-D mesh chapter (helpers/checks/mesh2d.py): the worked answers
(taken from the notebook's solution cells: tests/part6_solutions.py), shortcuts of different
kinds with the words of their messages, and other right answers (tests/check_cases.py)."""
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, quiet, shortcut, worked
from part6_solutions import solution

from helpers.checks import check_dp_average

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


@other("check_dp_average", "one flat all-reduce over comm, written back")
def dp_flat(grads, comm):
    flat = torch.cat([g.reshape(-1) for g in grads])
    comm.all_reduce(flat)
    flat /= comm.world
    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))


@other("check_dp_average", "torch.distributed on the dp group of init_device_mesh's 2-D mesh")
def dp_device_mesh(grads, comm):
    from torch.distributed.device_mesh import init_device_mesh
    tp = dist.get_world_size() // comm.world
    mesh = init_device_mesh("cpu", (comm.world, tp), mesh_dim_names=("dp", "tp"))
    assert mesh.get_local_rank("dp") == comm.rank and mesh["dp"].size() == comm.world
    for g in grads:
        dist.all_reduce(g, op=dist.ReduceOp.AVG, group=mesh.get_group("dp"))


@shortcut("check_dp_average", "torch.distributed's default group: the whole dp x tp mesh",
          ["default group, the whole mesh", "comm is its data-parallel group"])
def dp_default_group(grads, comm):
    for g in grads:
        dist.all_reduce(g)
        g /= dist.get_world_size()


@shortcut("check_dp_average", "divided by the whole mesh's size", "dist.get_world_size()")
def dp_mesh_size(grads, comm):
    for g in grads:
        comm.all_reduce(g)
        g /= dist.get_world_size()


@shortcut("check_dp_average", "divided before and after the all-reduce", "twice")
def dp_divide_twice(grads, comm):
    for g in grads:
        g /= comm.world
        comm.all_reduce(g)
        g /= comm.world


# torch's new_group is entered by every rank of the default group, in one order, with the same
# ranks (use_local_synchronization=True: by the members only); on 6 gloo processes the answer
# below gives wrong sums or "Connection reset by peer" (each rank's first group is named "1")
@shortcut("check_dp_average", "each rank creates only its own dp group with dist.new_group",
          ["dist.new_group is entered by every rank of the default group",
           "Create every group on every rank", "use_local_synchronization=True"])
def dp_new_group_members_only(grads, comm):
    world, rank = dist.get_world_size(), dist.get_rank()
    tp = world // comm.world
    mine = dist.new_group(list(range(rank % tp, world, tp)))
    for g in grads:
        dist.all_reduce(g, group=mine)
        g /= comm.world


@other("check_dp_average", "dist.new_group for every column on every rank, its own kept")
def dp_new_group_every_column(grads, comm):
    world = dist.get_world_size()
    tp = world // comm.world
    groups = [dist.new_group(list(range(j, world, tp))) for j in reversed(range(tp))]
    mine = next(g for g in groups if g is not dist.GroupMember.NON_GROUP_MEMBER)
    for g in grads:
        dist.all_reduce(g, group=mine)
        g /= dist.get_world_size(mine)


@other("check_dp_average", "its own dp group only, with use_local_synchronization=True")
def dp_new_group_local(grads, comm):
    world, rank = dist.get_world_size(), dist.get_rank()
    tp = world // comm.world
    mine = dist.new_group(list(range(rank % tp, world, tp))[::-1],
                          use_local_synchronization=True)
    for g in grads:
        dist.all_reduce(g, group=mine)
        g /= comm.world


def test_new_group_gives_a_rank_outside_it_what_torch_gives():
    """torch sorts a new group's ranks, and hands a rank outside it NON_GROUP_MEMBER, on which
    a collective does nothing and get_rank / get_world_size say -1 (_core/groups.py)."""
    from helpers.checks._core import World
    outside = dist.GroupMember.NON_GROUP_MEMBER

    def rank(comm):
        g = dist.new_group([2, 0])
        local = dist.new_group([1, 2], use_local_synchronization=True)   # rank 0: no meeting
        t = torch.ones(1) * (comm.rank + 1)
        out = dist.all_reduce(t, group=g)
        return (g is outside, out, t, dist.get_rank(g), dist.get_world_size(g),
                local is outside)
    got = World(3, timeout=30).run(rank)
    assert [r[0] for r in got] == [False, True, False] and got[1][1] is None
    assert [r[2].item() for r in got] == [4, 2, 4]       # ranks 0 and 2 summed, 1 untouched
    assert [r[3:5] for r in got] == [(0, 2), (-1, -1), (1, 2)]
    assert [r[5] for r in got] == [True, False, False]


def test_a_wrong_average_made_in_place_is_not_told_to_work_in_place():
    """Rank 0 divides before the all-reduce, the others after: wrong, in place all the same."""
    def mixed(grads, comm):
        for g in grads:
            if comm.rank == 0:
                g /= comm.world
            comm.all_reduce(g)
            if comm.rank != 0:
                g /= comm.world
    result = quiet(check_dp_average, mixed)
    assert result.status == "failed" and "not the average" in result.message, result
    assert "in place" not in result.message, result


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


def test_init_device_mesh_is_played_by_the_checks_world():
    """In a check's World, torch's init_device_mesh (here through helpers.device_mesh) gives
    each rank the row-major mesh of the world's ranks and groups the world plays
    (helpers/checks/_core/meshes.py); what it does not play is an AttributeError naming it."""
    import helpers
    from helpers.checks._core import World

    def rank(comm):
        mesh = helpers.device_mesh((2, 2), ("dp", "tp"))
        try:
            missing = f"played: {mesh._flatten}"
        except AttributeError as e:
            missing = str(e)
        return (mesh.get_coordinate(), dist.get_process_group_ranks(mesh.get_group("dp")),
                dist.get_process_group_ranks(mesh["tp"].get_group()), mesh.size(),
                mesh.shape, missing)
    got = World(4, timeout=30).run(rank)
    for r, (coords, dp, tp, size, shape, missing) in enumerate(got):
        assert coords == [r // 2, r % 2] and size == 4 and shape == (2, 2)
        assert dp == [r % 2, r % 2 + 2] and tp == [r - r % 2, r - r % 2 + 1]
        assert "plays a DeviceMesh's groups" in missing and "not DTensor" in missing, missing
