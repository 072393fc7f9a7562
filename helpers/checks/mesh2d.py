"""Checks for the exercises of Part VI's 2-D chapter (mesh2d): a dp x tp mesh's groups, the
data-parallel average on thread ranks of the harness's World (which records every collective),
and the shape a rank holds under TP then FSDP2."""
import torch

from ._core import CheckFailed, World, check, expect, fresh_generator, randint, tensor_close
from ._core.handed import in_place, kept_aside

__all__ = ["check_mesh_groups", "check_dp_average", "check_local_shape"]

TIMEOUT = 5.0   # seconds a thread-rank waits for a message that never comes


@check("mesh_groups", references=["rank_grid", "coords_of"], observes=[
    "the coordinates and groups returned for every rank of fresh dp x tp meshes, against "
    "init_device_mesh's row-major layout"])
def check_mesh_groups(fn):
    """fn(rank, dp, tp) -> dict(coords=(i, j), tp_group=[ranks], dp_group=[ranks]) for a
    row-major dp x tp mesh (init_device_mesh's layout: tp neighbours have consecutive ranks)."""
    g = fresh_generator()
    shapes = [(2, 2), (randint(g, 2, 4), randint(g, 2, 4)), (randint(g, 1, 3), 4), (3, 2)]
    for dp, tp in shapes:
        mesh = torch.arange(dp * tp).view(dp, tp)
        for rank in range(dp * tp):
            call = f"mesh_groups({rank}, {dp}, {tp})"
            got = fn(rank, dp, tp)
            i, j = rank // tp, rank % tp       # the expected groups, after the answer ran
            want = dict(coords=(i, j), tp_group=mesh[i].tolist(), dp_group=mesh[:, j].tolist())
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


def _dp_rank(comm, fn, grads, tp):
    """Rank (i, j) of a dp x tp mesh (row-major, init_device_mesh's layout) hands the answer
    its gradients and a comm over its data-parallel group, column j (ThreadComm.subgroup, as
    DistComm(dist.new_group(column)) on processes): torch.distributed's default group spans
    the whole mesh."""
    i, j = divmod(comm.rank, tp)
    comm = comm.subgroup(range(j, comm.world, tp))
    mine = [g[j, i].clone() for g in grads]
    kept = kept_aside(mine)     # the caller's tensors (a model's p.grad): the ones judged
    fn(mine, comm)
    return mine, kept


def _dp_groups(world, k, tp):
    """Fail a rank that all-reduced over other ranks than its data-parallel group (its column
    of the mesh): torch.distributed's default group mixes in its tp partners' gradients."""
    for m in world.sent("all_reduce"):
        group = list(range(m.rank % tp, k * tp, tp))
        if list(m.ranks) != group:
            which = ("torch.distributed's default group, the whole mesh"
                     if len(m.ranks) == k * tp else "not its data-parallel group")
            raise CheckFailed(
                f"on a {k} x {tp} (dp x tp) mesh rank {m.rank} all-reduced over ranks "
                f"{list(m.ranks)} ({which}): comm is its data-parallel group, ranks {group}, "
                "whose ranks hold the same shard; its tp partners hold other shards' "
                "gradients. Reduce over comm (comm.all_reduce), and average by comm.world")


@check("dp_average", changes_inputs=True, observes=[
    "on 2 x 3 and 3 x 2 meshes of thread ranks (dp x tp, torch.distributed's default group the "
    "whole mesh, comm each rank's data-parallel group), each rank handed a number of tensors "
    "other than dp and dp squared: the all-reduces each rank called and over which ranks, and "
    "each rank's own tensors (the tensor objects it was handed, changed in place: a list entry "
    "rebound to a new tensor fails) against the mean over its data-parallel group"])
def check_dp_average(fn):
    """fn(grads, comm): average each gradient tensor over the data-parallel ranks, in place."""
    g = fresh_generator()
    for k, tp in ((2, 3), (3, 2)):     # dp * tp, the whole mesh, is neither dp nor dp * dp
        # never as many tensors as ranks, nor their square: a sum divided by len(grads) shows
        counts = [c for c in range(2, 6) if c not in (k, k * k)]
        count = counts[randint(g, 0, len(counts) - 1)]
        shapes = [(randint(g, 1, 4), randint(g, 1, 4)) for _ in range(count)]
        grads = [torch.randn(tp, k, *s, generator=g) for s in shapes]   # [column, dp index]
        # allow: a decoy all_reduce beside all_gathers of the whole gradients fails
        world = World(k * tp, timeout=TIMEOUT, record_ops=True, allow={"all_reduce"})
        results = world.run(_dp_rank, fn, grads, tp)
        on = f"on a {k} x {tp} mesh"
        expect(world.sent("all_reduce", rank=0),
               f"{on} rank 0 never called all_reduce: each rank only has its own "
               "gradients until they are summed across ranks")
        _dp_groups(world, k, tp)
        for r, (mine, kept) in enumerate(results):
            mine = in_place(f"{on} rank {r}", mine, kept)
            for t, full, s in zip(mine, grads, shapes, strict=True):
                full, own = full[r % tp], full[r % tp, r // tp]
                if tensor_close(t, full.sum(0), atol=1e-5, what=f"rank {r}'s gradient"):
                    raise CheckFailed(f"{on} rank {r} holds the sum over its {k} data-parallel "
                                      "ranks: divide by their number for the average")
                if len(grads) != k and tensor_close(t, full.sum(0) / len(grads), atol=1e-5):
                    raise CheckFailed(f"{on} rank {r} divided the sum by "
                                      f"{len(grads)}, the number of gradient tensors: the "
                                      f"average divides by the number of ranks, comm.world ({k})")
                if tensor_close(t, full.sum(0) / (k * tp), atol=1e-5):
                    raise CheckFailed(f"{on} rank {r} divided the sum by {k * tp}, the whole "
                                      "mesh (dist.get_world_size()): the average over comm "
                                      f"divides by comm.world ({k}), its data-parallel ranks")
                if tensor_close(t, full.mean(0) / k, atol=1e-5):
                    raise CheckFailed(f"{on} rank {r} divided by comm.world ({k}) twice, "
                                      "before the all-reduce and after: the average is the "
                                      "sum over comm divided once")
                alone = [w for w, mine in (("", own), (" divided by comm.world", own / k))
                         if tensor_close(t, mine, atol=1e-6)]
                expect(not alone, f"{on} rank {r}'s gradient of shape {s} is its own"
                                  f"{''.join(alone[:1])}: the sum never reached it. All-reduce "
                                  "the tensors you were given, in place (not a copy): the "
                                  "caller holds them")
                expect(tensor_close(t, full.mean(0), atol=1e-5),
                       f"{on} rank {r}'s gradient of shape {s} is not the average over its "
                       f"{k} data-parallel ranks")
                world.expect_from_messages(r, t, f"gradient of shape {s}", k * tp)
        need = 4 * sum(int(torch.tensor(s).prod()) for s in shapes)
        for r in range(k * tp):
            got = world.traffic(r).payload_bytes("all_reduce")
            expect(got == need,
                   f"{on} rank {r} all-reduced {got} bytes, its gradients hold {need}: "
                   "all-reduce the gradients themselves, each element once")


def _swapped(shape, split_dim, dp, tp, dp_rank):
    """The shape local_shape gives with dp and tp swapped (a list)."""
    out = list(shape)
    if split_dim is not None:
        out[split_dim] //= dp
    out[0] = _fsdp_rows(out[0], tp, dp_rank)
    return out


def _fsdp_rows(n, dp, rank):
    """Rows of dim 0 that FSDP2 gives `rank`: torch.chunk into dp pieces of ceil(n / dp) rows,
    the last smaller, ranks beyond the pieces an empty shard."""
    c = -(-n // dp)
    return max(0, min(c, n - rank * c))


@check("local_shape", observes=[
    "the shape returned for every dp rank of fresh weights (column-wise, row-wise, "
    "replicated), dim 0 divisible by dp and not (in every draw a case where torch.tensor_split's "
    "sizes differ, one whose tp is not its dp, and 5 rows over dp = 4, whose last rank gets an "
    "empty shard), against TP's slice then FSDP2's torch.chunk "
    "of dim 0 (ceil rows, the last shard smaller, empty shards past the end)"])
def check_local_shape(fn):
    """fn(shape, split_dim, dp, tp, dp_rank) -> the shape the rank at dp index `dp_rank` holds of a
    weight of `shape`, split by tensor parallelism along `split_dim` (0: column-wise, 1:
    row-wise, None: replicated) over tp ranks, then sharded by fully_shard over dp ranks."""
    g = fresh_generator()
    # One uneven case, forced, in a fresh place: dp >= 3 and 1 <= rows % dp <= dp - 2, where
    # torch.tensor_split's sizes (the extra rows one each to the first ranks) are not chunk's.
    split_apart = 2 * randint(g, 0, 2) + 1
    past_end = (split_apart + 2) % 6   # forced too: 5 rows over dp = 4, chunk's 2, 2, 1 and 0
    for case in range(6):
        dp, tp = randint(g, 3 if case == split_apart else 2, 4), randint(g, 2, 4)
        dp = 4 if case == past_end else dp
        if case == (split_apart + 1) % 6:    # forced, the next case: tp other than dp (2..4)
            tp = randint(g, 2, 3)
            tp += tp >= dp
        uneven = case % 2 == 1
        most = dp - 2 if case == split_apart else dp - 1
        for split_dim in (0, 1, None):
            rows = dp * randint(g, 1, 3) + (randint(g, 1, most) if uneven else 0)
            rows = 5 if case == past_end else rows
            shape = [rows * (tp if split_dim == 0 else 1), tp * randint(g, 1, 3)]
            if split_dim is None:
                shape = [rows]
            for dp_rank in range(dp):
                call = f"local_shape({tuple(shape)}, {split_dim}, dp={dp}, tp={tp}, " \
                       f"dp_rank={dp_rank})"
                got = fn(tuple(shape), split_dim, dp, tp, dp_rank)
                want = list(shape)             # the expected shape, after the answer ran
                if split_dim is not None:
                    want[split_dim] //= tp
                want[0] = _fsdp_rows(want[0], dp, dp_rank)
                try:
                    got = [int(v) for v in got]
                except (TypeError, ValueError):
                    raise CheckFailed(f"{call} returned {got!r}, expected a shape") from None
                if got == want:
                    continue
                only_tp = list(shape)
                if split_dim is not None:
                    only_tp[split_dim] //= tp
                floor = list(only_tp)
                floor[0] //= dp
                if split_dim is None and got == list(shape):
                    msg = "a replicated weight is still sharded by FSDP over dp"
                elif got == only_tp:
                    msg = "that is the tensor-parallel slice; FSDP shards it again over dp"
                elif got == floor and dp_rank > 0:     # the ranks before it held ceil rows
                    msg = (f"those are torch.tensor_split's sizes for {only_tp[0]} rows over "
                           f"{dp} ranks (the extra rows one each to the first ranks): FSDP2 "
                           "cuts dim 0 with torch.chunk (ceil(rows / dp) each, the last "
                           "smaller)")
                elif got == floor:
                    msg = (f"{only_tp[0]} rows do not split evenly over {dp} ranks: FSDP2 cuts "
                           "dim 0 with torch.chunk (ceil(rows / dp) each, the last smaller)")
                elif split_dim == 1 and got[0] * dp * tp == shape[0]:
                    msg = ("a row-wise weight is split along dim 1 by tp; FSDP then shards "
                           "dim 0 over dp")
                else:
                    msg = ""
                if got == _swapped(shape, split_dim, dp, tp, dp_rank):   # named beside the rest
                    msg += ("; or it " if msg else "that ") + "swaps dp and tp: " + (
                        "" if split_dim is None else
                        f"tensor parallelism cuts dim {split_dim} over tp = {tp}, then ") + (
                        f"FSDP2 cuts dim 0 over dp = {dp}")
                raise CheckFailed(f"{call} returned {tuple(got)}: "
                                  f"{msg or f'expected {tuple(want)}'}")
