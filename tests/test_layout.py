"""The package's shape: the flat façade exports every public name of every module, explicitly,
and the install ships every folder of helpers/."""
import ast
import importlib
import pathlib
import sys
import tomllib

import helpers

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "helpers"


def _modules():
    """Dotted names of helpers' modules (the checks excepted: helpers.checks is its own)."""
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] == "checks" or path.name == "__init__.py":
            continue
        yield "helpers." + ".".join(rel.with_suffix("").parts)


def test_the_facade_exports_every_public_name_of_every_module():
    missing, other = [], []
    for name in _modules():
        mod = importlib.import_module(name)
        assert hasattr(mod, "__all__"), f"{name} lists its public names in __all__"
        for attr in mod.__all__:
            if not hasattr(helpers, attr):
                missing.append(f"{name}.{attr}")
            elif getattr(helpers, attr) is not getattr(mod, attr):
                other.append(f"helpers.{attr} is not {name}.{attr}")
    assert not missing, f"add to helpers/__init__.py: {missing}"
    assert not other, other


def _shadowed(pkg):
    """Submodules of the package `pkg` (and of its subpackages) whose name the package binds to
    something else: `import pkg.name as m` then hands back that thing, not the module."""
    import pkgutil
    found = []
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        if getattr(pkg, info.name) is not mod:
            found.append(f"{pkg.__name__}.{info.name}")
        if info.ispkg:
            found += _shadowed(mod)
    return found


def test_no_facade_name_hides_a_module():
    """helpers.dp_vs_ddp was once both a module and the function the façade exported, so
    `import helpers.dp_vs_ddp as m` returned the function: a name is one or the other."""
    hidden = _shadowed(helpers)
    assert not hidden, f"these modules are hidden by a name of their package: {hidden}; rename one"


def test_the_shadow_scan_sees_a_hidden_module(tmp_path, monkeypatch):
    pkg = tmp_path / "shadowed_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .step import step\nfrom .other import x\n")
    (pkg / "step.py").write_text("def step():\n    pass\n")
    (pkg / "other.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _shadowed(importlib.import_module("shadowed_pkg")) == ["shadowed_pkg.step"]


def test_the_facade_is_explicit():
    tree = ast.parse((PKG / "__init__.py").read_text())
    stars = [n.module for n in tree.body
             if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)]
    assert not stars, f"star imports in helpers/__init__.py: {stars}; list the names"


def test_the_install_ships_every_folder_of_helpers():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    folders = {"helpers." + ".".join(p.parent.relative_to(PKG).parts) if p.parent != PKG
               else "helpers" for p in PKG.rglob("__init__.py")}
    assert folders <= listed, f"add to pyproject's packages: {sorted(folders - listed)}"


# --- the layers (scripts/package_layers.py) ---------------------------------------------------
sys.path.insert(0, str(ROOT / "scripts"))
import package_layers as layers  # noqa: E402


def test_the_layering_has_no_cycle_and_keeps_its_rules():
    deps = layers.graph()
    assert deps["runtime.launch"] >= {"runtime.group", "runtime.files"}, "the graph sees imports"
    assert not layers.broken_rules(deps)


def test_the_rules_catch_what_they_guard():
    """Each rule on a small made-up package: the check fails where it should."""
    ok = {"": {"runtime.launch", "data_parallel.scratch"}, "devices": set(),
          "runtime.launch": {"devices"}, "data_parallel.scratch": {"runtime.launch", "devices"},
          "sharding.zero": {"data_parallel.scratch"}, "checks": {"", "sharding.zero"}}
    assert layers.broken_rules(ok) == []
    bad = dict(ok, **{"runtime.launch": {"devices", "data_parallel.scratch"}})
    assert any("runtime.launch imports the split data_parallel" in b
               for b in layers.broken_rules(bad))
    assert any("import cycle" in b for b in layers.broken_rules(bad))
    bad = dict(ok, **{"pipeline_parallel.scratch": {"tensor_parallel.scratch"},
                      "tensor_parallel.scratch": set()})
    assert any("pipeline_parallel.scratch imports the split tensor_parallel" in b
               for b in layers.broken_rules(bad))
    bad = dict(ok, **{"devices": {"runtime.launch"}})               # top-level <-> runtime/
    assert any("cycle" in b for b in layers.broken_rules(bad))
    bad = dict(ok, **{"data_parallel.scratch": {""}})
    assert any("imports the façade" in b for b in layers.broken_rules(bad))


def test_contributing_shows_the_current_layers():
    assert layers.current_drawing() == layers.drawing(layers.graph()), (
        "CONTRIBUTING.md's drawing of the layers is stale: "
        "python scripts/package_layers.py --write")


def test_no_module_over_400_lines():
    """Every module of helpers, the grader's included, reads in a sitting."""
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these modules: {long}"


def test_helpers_tracks_only_sources():
    """A merge leftover (a `.orig` copy of an old check) once sat in helpers/, tracked, and
    read like code; helpers/ holds Python modules and their READMEs only."""
    import shutil
    import subprocess
    if not shutil.which("git") or not (ROOT / ".git").exists():
        import pytest
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "helpers"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    stray = [f for f in tracked if not f.endswith((".py", "README.md"))]
    assert tracked and not stray, f"not sources: {stray} (git rm them)"
