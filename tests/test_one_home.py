"""One home for each thing helpers does one way: meshes are built by runtime.mesh.device_mesh,
profiles taken by profiling.quiet_profile, torch.distributed rebound by runtime.intercept
only, new groups made by runtime.mesh or an allowed lesson."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "helpers"


# --- one mesh builder -------------------------------------------------------------------------
def _names_of(tree, name):
    """Lines where `tree` names `name` in code (a bare name, an attribute, an import, aliased or
    not), not in a string."""
    return sorted({n.lineno for n in ast.walk(tree)
                   if getattr(n, "id", None) == name or getattr(n, "attr", None) == name
                   or isinstance(n, ast.alias) and n.name.rsplit(".", 1)[-1] == name})


def _mesh_builders():
    """(path under helpers/, line) of each place in helpers (the grader's aside) that names
    torch's init_device_mesh."""
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] != "checks":
            for line in _names_of(ast.parse(path.read_text()), "init_device_mesh"):
                yield rel.as_posix(), line


def test_meshes_are_built_by_runtime_mesh_device_mesh():
    """runtime.mesh.device_mesh is the one place helpers builds a DeviceMesh (init_device_mesh,
    after a check that the shape holds the world); the chapters print it to show torch's call."""
    places = list(_mesh_builders())
    assert any(path == "runtime/mesh.py" for path, _ in places), "the scan sees the builder"
    stray = [f"helpers/{path}:{line}" for path, line in places if path != "runtime/mesh.py"]
    assert not stray, f"build the mesh with helpers.runtime.mesh.device_mesh at {stray}"


def test_the_mesh_scan_sees_each_way_of_naming_init_device_mesh():
    """Guard the guard: a from-import, an aliased one, an attribute call are seen; a docstring
    or a comment that only mentions it is not."""
    seen = _names_of(ast.parse(
        '"""init_device_mesh, in words."""\n'                                  # 1: no
        "from torch.distributed.device_mesh import init_device_mesh\n"         # 2
        "from torch.distributed.device_mesh import init_device_mesh as m\n"    # 3
        "import torch.distributed.device_mesh as dm\n"                         # 4: no
        "mesh = dm.init_device_mesh('cpu', (2,))  # init_device_mesh\n"        # 5
        "mesh = init_device_mesh('cpu', (2,))\n"), "init_device_mesh")         # 6
    assert seen == [2, 3, 5, 6], seen


def test_profiles_are_taken_by_profiling_quiet_profile():
    """profiling.quiet_profile is the one set-up of torch.profiler in helpers (kineto's log level
    and file descriptor 2 quietened): no other module opens a profile or sets the level."""
    stray = []
    for path in PKG.rglob("*.py"):
        src = path.read_text()
        opens = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call) and (
            getattr(n.func, "attr", None) == "profile" or getattr(n.func, "id", None) == "profile")]
        if path.name != "profiling.py" and (opens or "KINETO_LOG_LEVEL" in src):
            stray.append(str(path.relative_to(ROOT)))
    assert not stray, f"open the profile with helpers.profiling.quiet_profile in {stray}"



# --- one rebinding of torch.distributed ---------------------------------------------------------
def _dist_rebinds(tree):
    """Lines where `tree` assigns to an attribute of torch.distributed: `setattr(d, ...)`,
    `d.x = ...` (a tuple's target, `+=` and `del` too), d being torch.distributed under any name
    it was imported as, or `torch.distributed` itself."""
    names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names if a.name == "torch.distributed" and a.asname}
    names |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
              and n.module == "torch" for a in n.names if a.name == "distributed"}

    def is_dist(node):
        return (isinstance(node, ast.Name) and node.id in names
                or isinstance(node, ast.Attribute) and node.attr == "distributed"
                and isinstance(node.value, ast.Name) and node.value.id == "torch")
    lines = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("setattr", "delattr") \
                and n.args and is_dist(n.args[0]):
            lines.add(n.lineno)
        targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else \
            [n.target] if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for leaf in ast.walk(t):
                if isinstance(leaf, ast.Attribute) and isinstance(leaf.ctx, (ast.Store, ast.Del)) \
                        and is_dist(leaf.value):
                    lines.add(leaf.lineno)
    return sorted(lines)


def test_torch_distributed_is_rebound_only_by_runtime_intercept():
    """runtime.intercept.intercept is the one place helpers rebinds torch.distributed's
    functions (process-wide: it refuses thread ranks and restores on leaving, nested or not);
    the grader's stand-in for torch.distributed (helpers/checks/) is its own."""
    stray = [f"helpers/{p.relative_to(PKG).as_posix()}:{line}" for p in sorted(PKG.rglob("*.py"))
             if p.relative_to(PKG).parts[0] != "checks"
             and p.relative_to(PKG).as_posix() != "runtime/intercept.py"
             for line in _dist_rebinds(ast.parse(p.read_text()))]
    assert not stray, f"wrap torch.distributed with helpers.runtime.intercept.intercept: {stray}"
    assert _dist_rebinds(ast.parse((PKG / "runtime/intercept.py").read_text())), \
        "the scan sees intercept's own setattr"


def test_the_rebinding_scan_sees_each_way_of_assigning_to_torch_distributed():
    """Guard the guard: setattr, an attribute assigned (alone, in a tuple, augmented, deleted)
    under each import's name is seen; reading, calling, or another module's attribute is not."""
    seen = _dist_rebinds(ast.parse(
        "import torch\nimport torch.distributed as dist\n"                      # 1, 2
        "from torch import distributed as d2\n"                                 # 3
        "setattr(dist, 'all_reduce', f)\n"                                      # 4
        "dist.all_gather, dist.all_reduce = g, r\n"                             # 5
        "d2.broadcast = b\n"                                                    # 6
        "torch.distributed.barrier = b\n"                                       # 7
        "dist.x += 1\n"                                                         # 8
        "del dist.x\n"                                                          # 9
        "y = dist.all_reduce\ndist.all_reduce(t)\nother.all_reduce = r\n"       # 10-12: no
        "setattr(other, 'all_reduce', r)\n"))                                   # 13: no
    assert seen == [4, 5, 6, 7, 8, 9], seen


# --- process groups beside the mesh -----------------------------------------------------------
NEW_GROUP_AT = {"data_parallel/syncbn_experiments.py", "data_parallel/speed_experiments.py",
                "data_parallel/scratch_experiments.py", "runtime/mesh.py"}


def test_new_groups_are_built_by_runtime_mesh_or_an_allowed_lesson():
    """Process groups come from runtime.mesh; the three that are no mesh dimension (one rank
    alone, the first k ranks, a group with its own timeout: CONTRIBUTING.md) are allowed."""
    places = {p.relative_to(PKG).as_posix(): _names_of(ast.parse(p.read_text()), "new_group")
              for p in sorted(PKG.rglob("*.py")) if p.relative_to(PKG).parts[0] != "checks"}
    places = {p: lines for p, lines in places.items() if lines}
    assert "runtime/mesh.py" in places, "the scan sees the builder"
    stray = [f"helpers/{p}:{lines}" for p, lines in places.items() if p not in NEW_GROUP_AT]
    assert not stray, f"build process groups with helpers.runtime.mesh at {stray}"
