"""The package's shape: the flat façade exports every public name of every module, explicitly,
and the install ships every folder of helpers/."""
import ast
import importlib
import pathlib
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
