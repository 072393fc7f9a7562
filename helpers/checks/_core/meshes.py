"""torch's `init_device_mesh`, played by a World's threads: the course builds its meshes with it
(helpers.device_mesh, Parts VI and VII), and torch's own DeviceMesh starts a real process group
(env:// rendezvous), which a thread rank has none of. So while a world runs, the function's code
(bound however early, as dist_bound.py routes torch.distributed's) hands a call from a rank thread
to `SimulatedMesh`: init_device_mesh's row-major layout, whose `get_group` gives the world's
groups (groups.py's, made for every rank as init_device_mesh makes them), with the DeviceMesh
calls an answer asks a mesh for (size, get_group, get_local_rank, get_coordinate, get_rank,
mesh[name]). Anything else (a DTensor or fully_shard
handed the mesh) raises an AttributeError naming what the world plays; from any other thread
torch's own code runs."""
import contextlib
import math

import torch
from torch.distributed import device_mesh as _device_mesh

from .groups import Group
from .stubs import codes_routed
from .whose import forwarding_code

__all__ = ["meshes_played", "SimulatedMesh"]

_PLAYED = ("the check's simulated world plays a DeviceMesh's groups and coordinates "
           "(mesh.get_group(name), mesh.size(), mesh.get_local_rank(name), "
           "mesh.get_coordinate(), mesh.get_rank(), mesh[name], mesh.mesh, mesh.mesh_dim_names), "
           "not DTensor or fully_shard on it (they need a real process group)")
_ROUTED = {}       # key -> the call init_device_mesh's code hands over to (meshes_played)


class SimulatedMesh:
    """A DeviceMesh of the simulated world, seen from one rank: `mesh` the ranks laid out
    row-major (init_device_mesh's layout), `mesh_dim_names` its names or None."""

    def __init__(self, device_type, mesh, names, rank):
        self.device_type, self.mesh, self.mesh_dim_names = device_type, mesh, names
        self._rank = rank

    @property
    def ndim(self):
        return self.mesh.dim()

    @property
    def shape(self):
        return tuple(self.mesh.shape)

    def _dim(self, mesh_dim):
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError(f"a {self.ndim}-D mesh needs a mesh_dim (a name of "
                                   f"{self.mesh_dim_names} or an index)")
            return 0
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"mesh dimension {mesh_dim!r} is not one of "
                               f"{self.mesh_dim_names}: init_device_mesh(..., "
                               "mesh_dim_names=...) names them")
            return self.mesh_dim_names.index(mesh_dim)
        return int(mesh_dim)

    def get_coordinate(self):
        found = (self.mesh == self._rank).nonzero()
        return [int(c) for c in found[0]] if len(found) else None

    def _line(self, d):
        """The ranks of this rank's group along dimension d."""
        index = list(self.get_coordinate())
        index[d] = slice(None)
        return [int(r) for r in self.mesh[tuple(index)]]

    def get_group(self, mesh_dim=None):
        """This rank's group along `mesh_dim`: init_device_mesh made every group on every rank
        (a get_group on one rank alone is right), so no new_group meeting is played here."""
        return Group(self._line(self._dim(mesh_dim)))

    def get_all_groups(self):
        return [self.get_group(d) for d in range(self.ndim)]

    def size(self, mesh_dim=None):
        return self.mesh.numel() if mesh_dim is None else self.mesh.shape[self._dim(mesh_dim)]

    def get_local_rank(self, mesh_dim=None):
        return self.get_coordinate()[self._dim(mesh_dim)]

    def get_rank(self):
        return self._rank

    def __getitem__(self, names):
        names = (names,) if isinstance(names, str) else tuple(names)
        dims = [self._dim(n) for n in names]
        index = [slice(None) if d in dims else c for d, c in enumerate(self.get_coordinate())]
        sub = self.mesh[tuple(index)]             # the kept dimensions in the mesh's order
        sub = sub.permute(*[sorted(dims).index(d) for d in dims])
        return SimulatedMesh(self.device_type, sub, names, self._rank)

    def __getattr__(self, name):
        """An attribute the simulated mesh lacks: an AttributeError (hasattr says False)
        naming what the world plays."""
        raise AttributeError(f"the DeviceMesh has no {name!r} here: {_PLAYED}")

    def __repr__(self):
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"


def _init(world, own):
    """init_device_mesh from a rank thread of `world`: a SimulatedMesh of the world's ranks."""
    def call(device_type, mesh_shape, *, mesh_dim_names=None, backend_override=None):
        if world.rank is None:
            return own(device_type, mesh_shape, mesh_dim_names=mesh_dim_names,
                       backend_override=backend_override)
        shape = tuple(int(s) for s in mesh_shape)
        if math.prod(shape) != world.size:
            raise RuntimeError(f"init_device_mesh: a mesh of shape {shape} holds "
                               f"{math.prod(shape)} ranks, the world has {world.size}")
        names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
        if names is not None and len(names) != len(shape):
            raise RuntimeError(f"init_device_mesh: {len(names)} names {names} for a mesh of "
                               f"{len(shape)} dimensions")
        mesh = torch.arange(world.size).view(shape)
        return SimulatedMesh(device_type, mesh, names, world.rank)
    return call


def _hit(key, args, kwargs, *, _ROUTED=_ROUTED):
    return _ROUTED[key](*args, **kwargs)


@contextlib.contextmanager
def meshes_played(world, *, _ROUTED=_ROUTED):
    """While `world` runs: torch's init_device_mesh, however bound, gives a rank thread a
    SimulatedMesh of the world (torch's own code from any other thread)."""
    fn = _device_mesh.init_device_mesh
    key = f"{id(fn)}:init_device_mesh"
    code = forwarding_code(len(fn.__code__.co_freevars), "init_device_mesh", __name__, "_hit",
                           key, __file__)
    with codes_routed({fn: code}) as own:
        _ROUTED[key] = _init(world, own[fn])
        try:
            yield
        finally:
            _ROUTED.pop(key, None)


del _ROUTED
