"""The one mesh builder (helpers.runtime.mesh): its groups by hand are init_device_mesh's."""
import launch_targets as lt
import pytest

from helpers import launch
from helpers.runtime import mesh


@pytest.mark.parametrize("shape,names", [((2, 2, 2), ("pp", "dp", "tp")),
                                         ((2, 3), ("dp", "ep")), ((4,), ("dp",))])
def test_the_groups_by_hand_are_init_device_meshs(shape, names):
    world = 1
    for s in shape:
        world *= s
    out = launch(lt.mesh_groups_both_ways, world,
                 dict(shape=shape, names=names), timeout=120)
    grid = mesh.rank_grid(shape, names)
    for rank, (by_hand, by_torch, coords) in enumerate(out):
        assert by_hand == by_torch, (rank, by_hand, by_torch)
        assert coords == mesh.coords_of(rank, shape, names)
        for name in names:
            assert by_hand[name] in grid[name] and rank in by_hand[name]


def test_rank_grid_lays_the_last_name_fastest():
    grid = mesh.rank_grid((2, 2, 2))
    assert grid["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.coords_of(5, (2, 2, 2)) == {"pp": 1, "dp": 0, "tp": 1}


@pytest.mark.parametrize("shape,names,error,match", [
    ((2, 2), ("dp",), ValueError, "2 dimension names"),
    ((2, 2), ("dp", "dp"), ValueError, "must differ"),
    ((2, 0), ("dp", "tp"), ValueError, "mesh dimension tp must be at least 1"),
    ((2, 2.0), ("dp", "tp"), TypeError, "mesh dimension tp must be a whole number")])
def test_a_mesh_that_cannot_be_laid_out_is_refused(shape, names, error, match):
    with pytest.raises(error, match=match):
        mesh.rank_grid(shape, names)


def test_a_mesh_that_does_not_hold_the_world_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(mesh.dist, "get_world_size", lambda: 6)
    for build in (mesh.new_groups, mesh.device_mesh):
        with pytest.raises(ValueError, match="the world has 6: choose dimensions whose "
                                             "product is 6"):
            build((2, 2), ("dp", "tp"))
