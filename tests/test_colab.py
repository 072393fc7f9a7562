"""Colab and plain installs: the set-up cell (scripts/colab_setup_cell.py), the scripts shipped as
package data (helpers.script_path), and a notebook run in an emulated Colab.

The emulation: a venv with only Colab's usual stack (torch, torchvision, matplotlib, ipywidgets,
ipykernel; nbclient/nbformat to run the notebook), no course packages; a notebook copied out of
the checkout gets the set-up cell, COURSE_SETUP_FROM points it at this checkout, and it runs top
to bottom in quick mode. The venv is cached in _build/colab-venv (first run about a minute).
"""
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import nbformat
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV = ROOT / "_build" / "colab-venv"
NOTEBOOK = ROOT / "book" / "part1" / "data_parallel.ipynb"
# Colab's stack, unpinned (the newest this machine offers), not the course's pins or lock
COLAB_STACK = ["torch", "torchvision", "matplotlib", "ipywidgets", "ipykernel",
               "nbclient", "nbformat"]


def _script():
    spec = importlib.util.spec_from_file_location("colab_setup_cell",
                                                  ROOT / "scripts" / "colab_setup_cell.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _clean_env(**extra):
    """The environment of a reader's machine: no course paths, quiet and small."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONNOUSERSITE="1", OMP_NUM_THREADS="1", TQDM_DISABLE="1", **extra)
    return env


# ---------------------------------------------------------------- the set-up cell script
def test_setup_cell_is_inserted_once_and_updated(tmp_path):
    mod = _script()
    path = tmp_path / "nb.ipynb"
    shutil.copy(NOTEBOOK, path)
    before = nbformat.read(path, as_version=4)
    assert mod.main([str(path)]) == 0
    once = path.read_text()
    assert mod.main([str(path)]) == 0 and path.read_text() == once, "not idempotent"
    assert mod.main(["--check", str(path)]) == 0
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.id == mod.CELL_ID and first.cell_type == "code"
    assert first.metadata["tags"] == ["remove-cell"], "the book must hide the set-up cell"
    # the committed notebooks carry the cell already: compare with the others
    others = [c.source for c in before.cells if c.get("id") != mod.CELL_ID]
    assert [c.source for c in nb.cells[1:]] == others, \
        "the script changed other cells"
    assert all(len(line) <= 79 for line in first.source.splitlines()), "notebook lines: 79 cols"
    # a stale copy (older URL, moved down, outputs) is replaced by one fresh cell on top
    first.source = first.source.replace("COURSE_BRANCH = ", "COURSE_BRANCH = 'old' or ")
    nb.cells.insert(3, nb.cells.pop(0))
    nbformat.write(nb, path)
    assert mod.main(["--check", str(path)]) == 1
    assert mod.main([str(path)]) == 0 and path.read_text() == once


def test_setup_cell_follows_the_repository_in_config():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    src = _script().cell_source()
    assert f'COURSE_REPO = "{config["repository"]["url"].rstrip("/")}"' in src
    other = {"repository": {"url": "https://github.com/someone/fork/", "branch": "dev"}}
    src = _script().cell_source(other)
    assert 'COURSE_REPO = "https://github.com/someone/fork"' in src and '"dev"' in src


def test_setup_cell_does_nothing_outside_colab(monkeypatch):
    monkeypatch.delenv("COURSE_SETUP_FROM", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)

    def no_run(*a, **k):
        raise AssertionError(f"the set-up cell ran {a} outside Colab")

    source = _script().cell_source()
    monkeypatch.setattr(subprocess, "run", no_run)
    path_before = list(sys.path)
    exec(source, {})
    assert sys.path == path_before


# ---------------------------------------------------------------- scripts as package data
def test_script_path_in_a_checkout():
    import helpers
    p = helpers.script_path("torchrun.py")
    assert p == (ROOT / "scripts" / "ddp" / "torchrun.py").resolve()
    with pytest.raises(FileNotFoundError, match="torchrun.py"):
        helpers.script_path("no_such_script.py")


def test_a_plain_install_ships_the_ddp_scripts(tmp_path):
    """A wheel (what `pip install git+...` builds) holds scripts/ddp/*.py, and script_path finds
    them there when no checkout is around."""
    src = tmp_path / "src"
    for rel in ("helpers", "scripts/ddp"):
        shutil.copytree(ROOT / rel, src / rel, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in ("pyproject.toml", "README.md", "LICENSE", "LICENSE-text.md"):
        shutil.copy(ROOT / rel, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, env=_clean_env())
    wheel, = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    want = sorted(f"helpers/_scripts/ddp/{p.name}" for p in (ROOT / "scripts/ddp").glob("*.py"))
    assert want and set(want) <= set(names), f"{wheel.name} lacks {set(want) - set(names)}"
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, env=_clean_env())
    out = subprocess.run([sys.executable, "-c", "import helpers; print(helpers.script_path("
                          "'torchrun.py'))"], cwd=tmp_path, env=_clean_env(PYTHONPATH=str(site)),
                         capture_output=True, text=True, check=True).stdout.strip()
    assert pathlib.Path(out) == (site / "helpers/_scripts/ddp/torchrun.py").resolve(), out


# ---------------------------------------------------------------- Colab, emulated
RUNNER = r"""
import json, sys
import nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
               resources={"metadata": {"path": sys.argv[2]}}).execute()
errors = [f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, c in enumerate(nb.cells)
          if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"
          and "raises-exception" not in c.metadata.get("tags", [])]
last = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
nbformat.write(nb, sys.argv[1])
print(json.dumps({"errors": errors, "probe": last}))
"""


# Colab ships torch and torchvision preinstalled. Installing them into the emulation costs minutes
# and 5 GB (the only pair on these machines is the CUDA build), so the venv gets links to this
# interpreter's copies of them and of what they need, made after pip has run there: no later pip
# call in the venv replaces them (the set-up cell's `pip install -e` finds torch satisfied).
PREINSTALLED = ("torch", "torchvision")


def _requirement_closure(names):
    """The installed distributions `names` need, themselves included (markers evaluated here)."""
    from importlib import metadata
    from packaging.requirements import Requirement
    seen, todo = {}, list(names)
    while todo:
        try:
            dist = metadata.distribution(todo.pop())
        except metadata.PackageNotFoundError:
            continue
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _link_preinstalled(py):
    """Symlink PREINSTALLED and their requirements into the venv, skipping what pip put there."""
    site = pathlib.Path(subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    have = subprocess.run([str(py), "-m", "pip", "list", "--format=freeze"], check=True,
                          capture_output=True, text=True, env=_clean_env()).stdout
    have = {line.split("==")[0].lower().replace("_", "-") for line in have.splitlines()}
    for key, dist in _requirement_closure(PREINSTALLED).items():
        if key in have:
            continue
        for top in {pathlib.PurePath(f).parts[0] for f in dist.files or []}:
            source = pathlib.Path(dist.locate_file(top))
            if top != ".." and source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)


def _colab_venv():
    """A venv with Colab's stack only, cached under _build/ (rebuilt when the stack changes)."""
    py = VENV / "bin" / "python"
    stamp = VENV / ".stack"
    if not (py.exists() and stamp.exists() and stamp.read_text() == " ".join(COLAB_STACK)):
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        rest = [name for name in COLAB_STACK if name not in PREINSTALLED]
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-compile", *rest],
                       check=True, env=_clean_env())
        _link_preinstalled(py)
        subprocess.run([str(py), "-m", "ipykernel", "install", "--sys-prefix", "--name",
                        "python3"], check=True, env=_clean_env(), capture_output=True)
        stamp.write_text(" ".join(COLAB_STACK))
    # as Colab has it: no course package until the set-up cell installs one
    subprocess.run([str(py), "-m", "pip", "uninstall", "--quiet", "-y", "multigpu-course-helpers"],
                   env=_clean_env(), capture_output=True)
    return py


def test_a_notebook_runs_in_an_emulated_colab(tmp_path):
    py = _colab_venv()
    probe = subprocess.run([str(py), "-c", "import helpers"], env=_clean_env(), cwd=tmp_path,
                           capture_output=True)
    assert probe.returncode != 0, "the Colab venv already has helpers: the test would prove nothing"
    nb_path = tmp_path / NOTEBOOK.name
    shutil.copy(NOTEBOOK, nb_path)
    assert _script().main([str(nb_path)]) == 0
    nb = nbformat.read(nb_path, as_version=4)   # a last cell: which Python and helpers ran it
    nb.cells.append(nbformat.v4.new_code_cell(
        "import sys, helpers; print(sys.executable); print(helpers.__file__)"))
    nbformat.write(nb, nb_path)
    env = _clean_env(COURSE_SETUP_FROM=str(ROOT), COURSE_QUICK="1",
                     PATH=f"{py.parent}{os.pathsep}{os.environ.get('PATH', '')}",
                     JUPYTER_PATH=str(VENV / "share" / "jupyter"))
    env.setdefault("COURSE_DATA", str(ROOT / "data"))
    run = subprocess.run([str(py), "-c", RUNNER, str(nb_path), str(tmp_path)], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    errors = result["errors"]
    assert not errors, f"{NOTEBOOK.name} in the emulated Colab:\n  " + "\n  ".join(errors)
    kernel_python, helpers_file = result["probe"].split()
    assert pathlib.Path(kernel_python).parent == py.parent, \
        f"the notebook ran in {kernel_python}, not the emulated Colab's {py}"
    assert pathlib.Path(helpers_file).resolve().is_relative_to(ROOT), helpers_file
    where = subprocess.run([str(py), "-c", "import helpers; print(helpers.__file__)"],
                           env=_clean_env(), cwd=tmp_path, capture_output=True, text=True)
    assert where.returncode == 0, "the set-up cell did not install helpers into the environment"
    assert pathlib.Path(where.stdout.strip()).resolve().is_relative_to(ROOT), where.stdout


def test_every_notebook_has_the_setup_cell():
    """Fails until `python scripts/colab_setup_cell.py` has been run over the notebooks (and
    after a change of the cell or of _config.yml's repository): it writes the missing cells."""
    assert _script().main(["--check"]) == 0, "run: python scripts/colab_setup_cell.py"
