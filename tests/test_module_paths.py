"""book/ and scripts/ (shell scripts' Python included) name helpers.X, never a module path of
the package (helpers.runtime.files): the façade is what chapters and scripts use."""
import ast
import importlib
import json
import pathlib
import re

from test_layout import _shell_python

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "helpers"


# --- book/ and scripts/ (shell scripts' Python included) name helpers.X, never a module path --
_SH_IMPORT = re.compile(r"^[^#\n]*\b(?:from|import) (helpers\.[\w.]+)", re.M)


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
