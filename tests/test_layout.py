"""The package's shape: the flat façade re-exports, explicitly, what notebooks, scripts and the
grader use (and nothing else: tests import the rest from its home module); no name hides a
module; the install ships every folder of helpers/; the layers hold; no module of helpers/ or
scripts/ runs over 400 lines."""
import ast
import importlib
import inspect
import json
import pathlib
import re
import sys
import textwrap
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


def _facade_imports():
    """{name: home module} of every name helpers/__init__.py imports from its modules."""
    tree = ast.parse((PKG / "__init__.py").read_text())
    return {a.asname or a.name: "helpers." + n.module for n in tree.body
            if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module for a in n.names}


def test_every_facade_name_is_its_modules_public_name():
    """Each module lists its public names in __all__; the façade re-exports some of them (the
    ones used outside helpers), each the very object of its home module."""
    for name in _modules():
        assert hasattr(importlib.import_module(name), "__all__"), \
            f"{name} lists its public names in __all__"
    wrong = [f"helpers.{attr} from {home}" for attr, home in _facade_imports().items()
             if attr not in importlib.import_module(home).__all__
             or getattr(helpers, attr) is not getattr(importlib.import_module(home), attr)]
    assert not wrong, f"not a public name of its module (add it to that __all__): {wrong}"


def test_every_module_of_the_checks_lists_its_public_names_too():
    """helpers/checks/ is its own package, but CONTRIBUTING's rule holds there as well: each
    module (an __init__ aside) assigns __all__ (read from its source)."""
    missing = [p.relative_to(ROOT).as_posix() for p in sorted((PKG / "checks").rglob("*.py"))
               if p.name != "__init__.py" and not any(
                   isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                     for t in n.targets)
                   for n in ast.parse(p.read_text()).body)]
    assert not missing, f"list the public names in __all__ in {missing}"


# --- what the façade holds: what book/, scripts/ and the grader use (not tests/) ---------------
_DOTTED = re.compile(r"\bhelpers\.([A-Za-z_]\w*)")


def _python_uses(src):
    """Names `src` takes from the façade: `from helpers import X`, `helpers.X`, `h.X` after
    `import helpers as h`."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return set()
    aliases, found = {"helpers"}, set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            aliases |= {a.asname for a in n.names if a.name == "helpers" and a.asname}
        elif isinstance(n, ast.ImportFrom) and n.module == "helpers" and n.level == 0:
            found |= {a.name for a in n.names}
    return found | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name) and n.value.id in aliases}


def _notebook_uses(text):
    """A notebook's uses. Not the names its code defines: a chapter's own copy of a function uses
    nothing (tests/test_notebook_sync.py finds the shipped one in its module)."""
    found = set()
    for cell in json.loads(text)["cells"]:
        src = "".join(cell["source"])
        found |= set(_DOTTED.findall(src))
        if cell["cell_type"] == "code":
            src = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!")))
            found |= _python_uses(src)
    return found


def _grader_uses(text):
    """The grader's: `from .. import X` (its only way into the façade) and the names its checks
    block with references=[...] (looked up in the façade)."""
    tree, found = ast.parse(text), set(_DOTTED.findall(text))
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module is None and n.level >= 2:
            found |= {a.name for a in n.names}
        if isinstance(n, ast.keyword) and n.arg == "references":
            found |= {e.value.split(".")[0] for e in ast.walk(n.value)
                      if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return found


def facade_uses(root=ROOT, grader=True):
    """Every façade name that book/, scripts/ (shell scripts' Python included) or
    helpers/checks/ use (prose included: a chapter that names `helpers.X` sends the reader
    there). Not tests/: a name only tests use stays in its module, and the tests import it from
    there. `grader=False`: the grader's uses left out, the teachers' guide's table of checks
    (generated from its REGISTRY) too."""
    found = set()
    for folder in ("book", "scripts"):
        for path in (root / folder).rglob("*"):
            if not path.is_file() or {"_build", "_vendor"} & set(path.parts):
                continue
            if path.suffix == ".ipynb":
                found |= _notebook_uses(path.read_text())
            elif path.suffix in (".py", ".md", ".sh"):
                text = path.read_text(errors="ignore")
                if not grader:
                    text = re.sub(r"<!-- checks-table: begin -->.*<!-- checks-table: end -->",
                                  "", text, flags=re.S)
                found |= set(_DOTTED.findall(text))
                found |= _python_uses(text) if path.suffix == ".py" else set()
                found |= set().union(*map(_python_uses, _shell_python(text))) \
                    if path.suffix == ".sh" else set()
    for path in (root / "helpers" / "checks").rglob("*.py") if grader else ():
        found |= _grader_uses(path.read_text())
    return found


def test_every_name_a_chapter_takes_from_helpers_exists():
    """helpers.X and `from helpers import X` in a chapter's code name something the package has
    (a façade name or a module): a name dropped from the façade breaks the chapter only when it
    runs (the Colab test checks the installed package too, much later in a run)."""
    import nbformat
    from book_files import helpers_names, toc_notebooks
    lacking = {}
    for path in toc_notebooks():
        for name in sorted(helpers_names(nbformat.read(path, as_version=4))):
            if not hasattr(helpers, name) and importlib.util.find_spec(f"helpers.{name}") is None:
                lacking.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    assert not lacking, f"chapters use names helpers lacks: {lacking}"


def test_the_facade_holds_only_what_is_used():
    """The façade is what notebooks, scripts and the grader use, and nothing else: a name
    nobody else uses (tests included) stays in its module (importable from there)."""
    unused = sorted(set(_facade_imports()) - facade_uses())
    assert not unused, (f"nothing uses helpers.{{{', '.join(unused)}}}: remove them from "
                        "helpers/__init__.py (they stay in their modules)")


def test_the_use_scan_sees_each_way_of_using_a_name(tmp_path):
    """Guard the guard: every way of reaching a façade name counts, and an unused one does not."""
    for folder in ("book/part9", "scripts", "tests", "helpers/checks"):
        (tmp_path / folder).mkdir(parents=True)
    cell = lambda kind, src: {"cell_type": kind, "source": [src], "metadata": {}}
    (tmp_path / "book/part9/x.ipynb").write_text(json.dumps({"cells": [
        cell("code", "%matplotlib inline\nimport helpers\nhelpers.a_dotted(1)\n"),
        cell("code", "def a_defined():\n    pass\n"),
        cell("markdown", "`helpers.a_in_prose` draws it"),
        cell("code", "from helpers import a_from\n")]}))
    (tmp_path / "scripts/s.py").write_text("import helpers as h\nh.an_alias()\n")
    (tmp_path / "scripts/r.sh").write_text("$PY - <<'EOF'\nfrom helpers import a_shell\nEOF\n")
    (tmp_path / "tests/t.py").write_text("from helpers import (a_test,\n    another)\n")
    (tmp_path / "helpers/checks/c.py").write_text(
        "from .. import a_grader\n@check('x', observes=[], references=['a_ref.method'])\n"
        "def c():\n    unused_name = 1\n")
    assert facade_uses(tmp_path) == {"a_dotted", "a_in_prose", "a_from", "an_alias", "a_shell",
                                     "a_grader", "a_ref"}   # tests and definitions do not count


# --- one name for one thing on the façade -----------------------------------------------------
def _forwarded(fn, facade):
    """What `fn` only hands its own parameters to, unchanged: a method of its own name
    (`def all_to_all(comm, x): return comm.all_to_all(x)`) or another façade function; None
    where it does anything else (adapts, checks, computes)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    if len(body) != 1 or not isinstance(body[0], ast.Return) \
            or not isinstance(call := body[0].value, ast.Call):
        return None
    params = {a.arg for a in (*tree.args.posonlyargs, *tree.args.args, *tree.args.kwonlyargs)}
    passed = [*call.args, *(k.value for k in call.keywords)]
    if not all(isinstance(a, ast.Name) and a.id in params for a in passed):
        return None
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == tree.name:
        return ast.unparse(f)
    if isinstance(f, ast.Name) and f.id != tree.name and f.id in facade:
        return f"helpers.{f.id}"
    return None


def facade_aliases(names, get):
    """Façade names that are another name's thing again: one object under two names, two names
    one underscore apart (ring_allreduce, ring_all_reduce), a function that only forwards."""
    found, seen, spelt = [], {}, {}
    for name in sorted(names):
        obj, bare = get(name), name.replace("_", "")
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and id(obj) in seen:
            found.append(f"{name} is {seen[id(obj)]}")
        if bare in spelt:
            found.append(f"{name} and {spelt[bare]} differ by underscores")
        seen.setdefault(id(obj), name)
        spelt.setdefault(bare, name)
        if inspect.isfunction(obj) and (to := _forwarded(obj, names)):
            found.append(f"{name} only calls {to}")
    return found


def test_no_facade_name_is_another_under_a_second_name():
    """One name per thing: `helpers.all_to_all(comm, ...)` once only returned
    `comm.all_to_all(...)`, and ring_allreduce sat beside ring_all_reduce: two names for a reader
    to tell apart where there is one operation."""
    found = facade_aliases(set(_facade_imports()), lambda n: getattr(helpers, n))
    assert not found, f"keep one name of each on helpers/__init__.py: {found}"


def test_the_alias_scan_sees_each_kind_of_second_name(tmp_path, monkeypatch):
    """Guard the guard: a forwarding wrapper (a method of its name, another façade function), a
    second binding, a spelling underscores apart are found; what adapts its call is not."""
    (tmp_path / "alias_mod.py").write_text(
        "def all_to_all(comm, x, splits, tag=3):\n    '''Doc.'''\n"
        "    return comm.all_to_all(x, splits, tag=tag)\n\n"
        "def ring_all_reduce(xs, log=None):\n    return sum(xs)\n\n"
        "def total(xs, log):\n    return ring_all_reduce(xs, log=log)\n\n"
        "def ring_allreduce(xs):\n    return ring_all_reduce(list(xs))\n\n"
        "def scaled(xs):\n    return ring_all_reduce(xs) * 2\n\n"
        "def send(comm, x):\n    return comm.send(x, 0)\n\n"
        "again = scaled\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("alias_mod")
    names = {"all_to_all", "ring_all_reduce", "total", "ring_allreduce", "scaled", "send",
             "again"}
    assert sorted(facade_aliases(names, lambda n: getattr(mod, n))) == [
        "all_to_all only calls comm.all_to_all",
        "ring_allreduce and ring_all_reduce differ by underscores", "scaled is again",
        "total only calls helpers.ring_all_reduce"]


# --- book/ and scripts/ (shell scripts' Python included) name helpers.X, never a module path --
_SH_PYTHON = (re.compile(r"<<-?'?(\w+)'?[^\n]*\n(.*?)\n\1\n", re.S),   # heredocs
              re.compile(r'-c "([^"$]*)"'))                              # python -c "..."
_SH_IMPORT = re.compile(r"^[^#\n]*\b(?:from|import) (helpers\.[\w.]+)", re.M)


def _shell_python(text):
    """The Python a shell script runs: its heredocs and `-c "..."` snippets."""
    return [m.group(2) for m in _SH_PYTHON[0].finditer(text)] + _SH_PYTHON[1].findall(text)


def _is_module(name):
    return importlib.util.find_spec(f"helpers.{name}") is not None


def _is_program(name):
    """A module that runs as a program (`python -m helpers.flight_recorder`): the code that
    starts it imports it as that module."""
    path = PKG / f"{name}.py"
    return path.is_file() and 'if __name__ == "__main__"' in path.read_text()


def module_paths(src):
    """The module paths Python source `src` names, as a set: `from helpers.m import x` and
    `import helpers.m` (helpers.m), `helpers.m.x`, and `from helpers import m` of a module that
    is no program (helpers.m). helpers.checks, the grader's own façade, is none."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return set()
    found = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module == "helpers":
            found |= {f"helpers.{a.name}" for a in n.names
                      if a.name != "checks" and _is_module(a.name) and not _is_program(a.name)}
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            found |= {n.module} if n.module.startswith("helpers.") else set()
        elif isinstance(n, ast.Import):
            found |= {a.name for a in n.names if a.name.startswith("helpers.")}
        elif (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
              and isinstance(n.value.value, ast.Name) and n.value.value.id == "helpers"
              and n.value.attr != "checks" and _is_module(n.value.attr)):
            found.add(f"helpers.{n.value.attr}.{n.attr}")
    return found - {"helpers.checks"}


def _shell_module_paths(text):
    """A shell script's: those of the Python it runs (heredocs, `-c` snippets), and any import
    of a module path on a line that is no comment (Python the patterns do not find)."""
    return set().union(*map(module_paths, _shell_python(text))) | (
        set(_SH_IMPORT.findall(text)) - {"helpers.checks"})


def outside_module_paths(root=ROOT):
    """{file: sorted module paths it names} over book/'s notebooks and scripts/ (.py, .sh)."""
    out = {}
    for folder in ("book", "scripts"):
        for path in sorted((root / folder).rglob("*")):
            if not path.is_file() or {"_build", "_vendor", "vendor"} & set(path.parts):
                continue
            if path.suffix == ".ipynb":
                found = set().union(*(module_paths("\n".join(
                    l for l in "".join(c["source"]).splitlines()
                    if not l.lstrip().startswith(("%", "!"))))
                    for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"))
            elif path.suffix == ".py":
                found = module_paths(path.read_text())
            elif path.suffix == ".sh":
                found = _shell_module_paths(path.read_text())
            else:
                continue
            if found:
                out[path.relative_to(root).as_posix()] = sorted(found)
    return out


def test_chapters_and_scripts_name_no_module_path():
    """Notebooks and scripts (the Python in shell scripts too) take helpers' names from the
    façade, so that code can move between modules without breaking them (CONTRIBUTING)."""
    found = outside_module_paths()
    assert not found, f"use helpers.X (X in helpers/__init__.py), not a module path: {found}"


def test_the_module_path_scan_sees_each_way_of_naming_a_module(tmp_path):
    """Guard the guard: each form of a module path is found, in a script, a shell script's
    heredoc and -c snippet, and a notebook; the façade, the grader's and a program are not."""
    assert module_paths(
        "import helpers\nfrom helpers.reference import add_gpu_path\nimport helpers.words\n"
        "helpers.config.full()\nfrom helpers import timing\n"
        "from helpers import plural, flight_recorder, checks\nfrom helpers.checks import REGISTRY\n"
        "import helpers.checks\nhelpers.checks.REGISTRY\nhelpers.plural(2, 'rank')\n") == {
        "helpers.reference", "helpers.words", "helpers.config.full", "helpers.timing"}
    for folder in ("book/part9", "scripts/tools"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "scripts/tools/a.py").write_text("from helpers.runtime.files import atomic_write\n")
    (tmp_path / "scripts/b.sh").write_text(
        "# from helpers.words import plural (a comment)\n"
        "$PY - <<'EOF'\nimport helpers\nhelpers.devices.unsynced_timings()\nEOF\n"
        '$PY -c "from helpers.reference import gpu_runner_cli; gpu_runner_cli()" env\n'
        "python - <<'PY'\nx = (\nfrom helpers.prose import formatted\nPY\n")
    (tmp_path / "scripts/ok.sh").write_text(
        "# helpers.devices.unsynced_timings, in a comment\n"
        "$PY - <<'EOF'\nimport helpers\nhelpers.add_gpu_path(1, 2, 3)\nEOF\n"
        '$PY -c "import helpers; helpers.gpu_runner_cli()" env\n')
    cell = {"cell_type": "code", "metadata": {},
            "source": ["%matplotlib inline\n", "import helpers\n", "helpers.words.plural(2, 'x')"]}
    (tmp_path / "book/part9/x.ipynb").write_text(json.dumps({"cells": [cell]}))
    assert outside_module_paths(tmp_path) == {
        "book/part9/x.ipynb": ["helpers.words.plural"],
        "scripts/b.sh": ["helpers.devices.unsynced_timings", "helpers.prose", "helpers.reference"],
        "scripts/tools/a.py": ["helpers.runtime.files"]}


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
    """Every module of helpers (the grader's included) and of scripts/ (its subfolders too)
    reads in a sitting."""
    long = {str(p.relative_to(ROOT)): n for folder in (PKG, ROOT / "scripts")
            for p in folder.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
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


def test_no_test_imports_the_tests_folder_as_a_package():
    """Tests import their neighbours by module name (pytest puts tests/ on the path); `from
    tests.x import` works only where the checkout itself is importable, and failed in CI."""
    bad = [f"{p.name}:{n}" for p in sorted((ROOT / "tests").rglob("*.py"))
           for n, line in enumerate(p.read_text().splitlines(), 1)
           if re.match(r"\s*(from tests[.\s]|import tests\b)", line)]
    assert not bad, bad


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


# --- the façade's table -------------------------------------------------------------------------
def _facade_table():
    """[(home modules, names)] of the façade docstring's table, a row's continuation lines
    joined: the home column ends at column 28, the names begin at column 65."""
    lines = helpers.__doc__.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("home module"))
    rows = []
    for line in lines[top + 1:]:
        if not line.strip():
            break
        home, names = line[:28].strip(), line[65:]
        if home:
            rows.append((home, names))
        else:
            rows[-1] = (rows[-1][0], rows[-1][1] + " " + names)
    return [([h.strip() for h in home.split(",")],
             [n.strip() for n in names.split(",") if n.strip() not in ("", "...", "-")])
            for home, names in rows]


def test_the_facade_table_names_what_the_facade_exports_from_each_home():
    """Every name in the table's last column is helpers.X (helpers.checks.X in the checks row),
    imported by the façade from a module of its row (a reader following it finds it there)."""
    homes, wrong = _facade_imports(), []
    table = _facade_table()
    assert len(table) > 30 and any("runtime.launch" in h for h, _ in table)
    for patterns, names in table:
        for name in names:
            if patterns == ["checks"]:
                import helpers.checks
                ok = hasattr(helpers.checks, name)
            else:
                home = homes.get(name, "").removeprefix("helpers.")
                ok = any(_in_row(home, p) for p in patterns)
            if not ok:
                wrong.append(f"{name} ({', '.join(patterns)})")
    assert not wrong, f"the façade's table names what it does not export there: {wrong}"


def _in_row(home, pattern):
    """Whether a home module (without `helpers.`) is one a table row names: `ring`, every module
    of a package (`sharding.*`), or any module whose name ends so (`*schematics`)."""
    return (home == pattern or (pattern.endswith(".*") and home.startswith(pattern[:-1]))
            or (pattern.startswith("*") and home.endswith(pattern[1:])))


def test_the_facade_imports_each_module_once_in_the_tables_order():
    """One import line per home module, in the order of the table's rows (a module's row: the
    last that names it, so `*schematics` gathers the pictures after the splits), and every
    module the façade imports has a row: the table is the map of the import lines."""
    tree = ast.parse((PKG / "__init__.py").read_text())
    modules = [n.module or n.names[0].name for n in tree.body
               if isinstance(n, ast.ImportFrom) and n.level == 1]
    repeated = sorted({m for m in modules if modules.count(m) > 1})
    assert not repeated, f"one import line per module in helpers/__init__.py: {repeated}"
    table = _facade_table()
    rows = {m: max((i for i, (patterns, _) in enumerate(table)
                    if any(_in_row(m, p) for p in patterns)), default=None) for m in modules}
    missing = [m for m, row in rows.items() if row is None]
    assert not missing, f"no row of the façade's table names {missing}"
    late = [f"{a} (row {rows[a]}) before {b} (row {rows[b]})"
            for a, b in zip(modules, modules[1:]) if rows[a] > rows[b]]
    assert not late, f"helpers/__init__.py imports out of the table's order: {late}"


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
