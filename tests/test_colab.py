"""The set-up cell (scripts/colab_setup_cell.py), the files a plain install ships
(helpers.script_path, helpers.course_file), and notebooks run in an emulated Colab and Kaggle.

The emulations: a venv with only what those platforms preinstall (torch, torchvision, matplotlib,
ipywidgets, tqdm, ipykernel; nbclient/nbformat to run the notebook), no course package; the
platform's markers (Colab: the `google.colab` module imported at kernel start, its environment
variables, /content as the working folder; Kaggle: KAGGLE_KERNEL_RUN_TYPE and friends,
/kaggle/working); a fresh home folder whose ~/.cache/multigpu-course/data holds Fashion-MNIST
(where a plain install looks for it). The course's "repository" is a local git repository of
this checkout's package files (COURSE_REPO points the cell at it; no network: pip may not use an
index, and builds without isolation from the venv's setuptools), tagged with pyproject's version
for Colab and untagged for Kaggle (the cell falls back to the branch). Colab runs a Part I
chapter; Kaggle the torchrun chapter through its first training run, whose ranks are new
interpreters started by torchrun: they import helpers only if the install is visible to every
process, and run the DDP scripts the package ships. The venv is cached in _build/colab-venv
(first run about a minute).
"""
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib
import types
import zipfile

import nbformat
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV = ROOT / "_build" / "colab-venv"
# What Colab and Kaggle preinstall, unpinned (the newest this machine offers), not the course's
# pins; setuptools: the course's build backend (their pip would fetch it in an isolated build)
PLATFORM_STACK = ["torch", "torchvision", "matplotlib", "ipywidgets", "tqdm", "ipykernel",
                  "nbclient", "nbformat", "setuptools>=77"]
# What a plain install is built from: the files pyproject.toml packages (and its readme, licences)
PACKAGE_FILES = ["helpers", "scripts/ddp", "scripts/bench.py", "reference", "pyproject.toml",
                 "README.md", "LICENSE", "LICENSE-text.md"]


def _script():
    spec = importlib.util.spec_from_file_location("colab_setup_cell",
                                                  ROOT / "scripts" / "colab_setup_cell.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _version():
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def _clean_env(**extra):
    """The environment of a reader's machine: no course paths, quiet and small."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "COURSE_DATA", "COURSE_QUICK", "COURSE_FULL")}
    env.update(PYTHONNOUSERSITE="1", OMP_NUM_THREADS="1", TQDM_DISABLE="1", **extra)
    return env


# ---------------------------------------------------------------- the set-up cell script
def test_setup_cell_is_inserted_once_and_updated(tmp_path):
    mod = _script()
    path = tmp_path / "nb.ipynb"
    shutil.copy(ROOT / "book" / "part1" / "data_parallel.ipynb", path)
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
    # a stale copy (an older release, moved down, outputs) is replaced by one fresh cell on top
    first.source = first.source.replace(f'RELEASE = "v{_version()}"', 'RELEASE = "v0.0.1"')
    nb.cells.insert(3, nb.cells.pop(0))
    nbformat.write(nb, path)
    assert mod.main(["--check", str(path)]) == 1
    assert mod.main([str(path)]) == 0 and path.read_text() == once


def test_setup_cell_pins_the_release_of_pyproject_and_the_repository_of_config():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    mod = _script()
    src = mod.cell_source()
    assert f'"{config["repository"]["url"].rstrip("/")}"' in src
    assert mod.release_tag() == f"v{_version()}"
    assert f'RELEASE = "v{_version()}"' in src, "the cell must install the book's release"
    other = {"repository": {"url": "https://github.com/someone/fork/", "branch": "dev"}}
    src = mod.cell_source(other, tag="v9.8.7")
    assert '"https://github.com/someone/fork"' in src and 'else "dev"' in src
    assert 'RELEASE = "v9.8.7"' in src


class _Recorder:
    """subprocess.run stand-in: records each command, answers `git ls-remote` with `tags`."""

    def __init__(self, tags="", returncode=0):
        self.calls, self.tags, self.returncode = [], tags, returncode

    def __call__(self, cmd, **kwargs):
        self.calls.append(cmd)
        if cmd[:2] == ["git", "ls-remote"]:
            return types.SimpleNamespace(returncode=self.returncode, stdout=self.tags,
                                         stderr="fatal: unable to access")
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")


def _run_cell(monkeypatch, recorder, helpers_importable):
    source = _script().cell_source()
    path_before = list(sys.path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        real(name, *a) if helpers_importable or name != "helpers" else None))
    monkeypatch.setattr(subprocess, "run", recorder)
    monkeypatch.delenv("COURSE_REPO", raising=False)
    try:
        exec(source, {})
    finally:
        assert sys.path == path_before, "the cell changed this kernel's sys.path"


def test_setup_cell_does_nothing_where_helpers_imports(monkeypatch):
    """A checkout, Binder, nbval, the book build: helpers imports, nothing is installed."""
    recorder = _Recorder()
    _run_cell(monkeypatch, recorder, helpers_importable=True)
    assert recorder.calls == []


def test_setup_cell_installs_the_tag_else_the_branch(monkeypatch, capsys):
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    tag = f"v{_version()}"
    tagged = _Recorder(tags=f"0123abcd\trefs/tags/{tag}\n")
    _run_cell(monkeypatch, tagged, helpers_importable=False)
    assert tagged.calls[0] == ["git", "ls-remote", "--tags", url, tag]
    assert tagged.calls[1][1:4] == ["-m", "pip", "install"]
    assert tagged.calls[1][-1] == f"git+{url}@{tag}"
    assert capsys.readouterr().out == "", "the release installs silently"
    untagged = _Recorder(tags="")
    _run_cell(monkeypatch, untagged, helpers_importable=False)
    assert untagged.calls[1][-1] == f"git+{url}@main"
    assert f"no tag {tag}: installing its branch main" in capsys.readouterr().out
    offline = _Recorder(returncode=128)
    with pytest.raises(RuntimeError, match="cannot reach .*Kaggle: turn Internet on"):
        _run_cell(monkeypatch, offline, helpers_importable=False)
    assert len(offline.calls) == 1, "nothing is installed when the repository is unreachable"


# ---------------------------------------------------------------- files a plain install ships
def test_script_path_in_a_checkout():
    import helpers
    assert helpers.script_path("torchrun.py") == (ROOT / "scripts/ddp/torchrun.py").resolve()
    assert helpers.script_path("bench.py", folder="") == (ROOT / "scripts/bench.py").resolve()
    assert helpers.course_file("gpu_reference.json") == \
        (ROOT / "reference/gpu_reference.json").resolve()
    with pytest.raises(FileNotFoundError, match="no_such_script.py"):
        helpers.script_path("no_such_script.py")


def _package_copy(dest):
    """The files a plain install is built from, copied out of this checkout."""
    for rel in PACKAGE_FILES:
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dest / rel)
    return dest


def test_a_plain_install_ships_what_the_chapters_read(tmp_path):
    """A wheel (what `pip install git+...` builds) holds every package of helpers/, the scripts
    the chapters run and the GPU reference run; helpers finds them there, not in a checkout."""
    src = _package_copy(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, env=_clean_env())
    wheel, = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {p.relative_to(ROOT).as_posix() for p in (ROOT / "helpers").rglob("__init__.py")}
    want |= {f"helpers/_scripts/ddp/{p.name}" for p in (ROOT / "scripts/ddp").glob("*.py")}
    want |= {"helpers/_scripts/bench.py", "helpers/_reference/gpu_reference.json"}
    assert want <= names, f"{wheel.name} lacks {sorted(want - names)} (pyproject.toml)"
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, env=_clean_env())
    probe = ("import helpers; print(helpers.script_path('torchrun.py')); "
             "print(helpers.script_path('bench.py', folder='')); "
             "print(helpers.course_file('gpu_reference.json')); print(helpers.data_dir())")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, check=True, env=_clean_env(PYTHONPATH=str(site),
                                                               HOME=str(tmp_path))).stdout
    torchrun, bench, reference, data = map(pathlib.Path, out.split())
    assert torchrun == (site / "helpers/_scripts/ddp/torchrun.py").resolve()
    assert bench == (site / "helpers/_scripts/bench.py").resolve()
    assert reference == (site / "helpers/_reference/gpu_reference.json").resolve()
    assert data == tmp_path / ".cache/multigpu-course/data"


# ---------------------------------------------------------------- Colab and Kaggle, emulated
RUNNER = r"""
import json, sys
import nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=900, kernel_name="python3", allow_errors=True,
               resources={"metadata": {"path": sys.argv[2]}}).execute()
errors = [f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, c in enumerate(nb.cells)
          if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"
          and "raises-exception" not in c.metadata.get("tags", [])]
text = lambda c: "".join(o.get("text", "") for o in c.get("outputs", []))
print(json.dumps({"errors": errors, "setup": text(nb.cells[0]), "probe": text(nb.cells[-1])}))
"""

PROBE = ("import sys, helpers\nprint(sys.executable)\nprint(helpers.__file__)\n"
         "print(helpers.data_dir())\nprint('google.colab' in sys.modules)")

# Platforms ship torch and torchvision preinstalled. Installing them into the emulation costs
# minutes and 5 GB (the only pair on these machines is the CUDA build), so the venv gets links to
# this interpreter's copies of them and of what they need, made after pip has run there: no later
# pip call in the venv replaces them (the set-up cell's install finds torch satisfied).
PREINSTALLED = ("torch", "torchvision")


def _requirement_closure(names):
    """The installed distributions `names` need, themselves included (markers evaluated here,
    extras followed: torch needs `cuda-toolkit[cublas,...]`, whose extras need more)."""
    from importlib import metadata
    from packaging.requirements import Requirement
    seen, done, todo = {}, set(), [(n, ()) for n in names]
    while todo:
        name, extras = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = dist.metadata["Name"].lower().replace("_", "-")
        seen[key] = dist
        for extra in ("", *extras):
            if (key, extra) in done:
                continue
            done.add((key, extra))
            for line in dist.requires or []:
                req = Requirement(line)
                if req.marker is None or req.marker.evaluate({"extra": extra}):
                    todo.append((req.name, tuple(req.extras)))
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


def _platform_venv():
    """A venv with the platforms' stack only, cached under _build/ (rebuilt when it changes)."""
    py = VENV / "bin" / "python"
    stamp = VENV / ".stack"
    if not (py.exists() and stamp.exists() and stamp.read_text() == " ".join(PLATFORM_STACK)):
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        rest = [name for name in PLATFORM_STACK if name not in PREINSTALLED]
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-compile", *rest],
                       check=True, env=_clean_env())
        _link_preinstalled(py)
        subprocess.run([str(py), "-m", "ipykernel", "install", "--sys-prefix", "--name",
                        "python3"], check=True, env=_clean_env(), capture_output=True)
        stamp.write_text(" ".join(PLATFORM_STACK))
    # as the platforms have it: no course package until the set-up cell installs one
    subprocess.run([str(py), "-m", "pip", "uninstall", "--quiet", "-y", "multigpu-course-helpers"],
                   env=_clean_env(), capture_output=True)
    return py


def _course_repository(where, tagged):
    """A git repository of the package's files (the course on GitHub, offline), on branch main,
    tagged v<version> when `tagged`."""
    repo = _package_copy(where)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
           "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"]
    for args in (["init", "--quiet", "-b", "main"], ["add", "-A"],
                 ["commit", "--quiet", "-m", "release"]):
        subprocess.run([*git, *args], check=True, env=_clean_env())
    if tagged:
        subprocess.run([*git, "tag", "-a", f"v{_version()}", "-m", "release"], check=True,
                       env=_clean_env())
    return repo


def _data_source():
    data = pathlib.Path(os.environ.get("COURSE_DATA") or ROOT / "data")
    if not (data / "FashionMNIST").is_dir():
        pytest.skip(f"no Fashion-MNIST in {data} (set COURSE_DATA)")
    return data


PLATFORMS = {
    # Colab: its kernel has imported google.colab; /content is the working folder
    "colab": dict(notebook="book/part1/data_parallel.ipynb", cwd="content", tagged=True,
                  env=dict(COLAB_RELEASE_TAG="release-colab-emulated", COLAB_GPU="",
                           COLAB_JUPYTER_IP="172.28.0.12")),
    # Kaggle: what its docker image sets; /kaggle/working is the working (and output) folder.
    # The chapter up to its first training run under torchrun and the load of the model it saved
    # (what a fresh interpreter per rank needs; the later sections launch the same way)
    "kaggle": dict(notebook="book/part3/ddp_torchrun.ipynb", cwd="kaggle/working", tagged=False,
                   through="load_state_dict(torch.load(workdir",
                   env=dict(KAGGLE_KERNEL_RUN_TYPE="Interactive",
                            KAGGLE_URL_BASE="https://www.kaggle.com",
                            KAGGLE_DOCKER_IMAGE="gcr.io/kaggle-gpu-images/python",
                            KAGGLE_DATA_PROXY_PROJECT="kaggle-emulated")),
}


def _emulate(name, tmp_path):
    """Paths and environment of a fresh machine of platform `name`."""
    spec = PLATFORMS[name]
    home, cwd = tmp_path / "home", tmp_path / spec["cwd"]
    cwd.mkdir(parents=True)
    cache = home / ".cache" / "multigpu-course"
    cache.mkdir(parents=True)
    (cache / "data").symlink_to(_data_source())   # where a plain install keeps the data
    env = _clean_env(HOME=str(home), COURSE_QUICK="1", PIP_NO_INDEX="1",
                     PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1",
                     MPLCONFIGDIR=str(ROOT / "_build" / "colab-mpl"), **spec["env"],
                     PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                     JUPYTER_PATH=str(VENV / "share" / "jupyter"))
    if name == "colab":
        stub = tmp_path / "colab-env" / "google" / "colab"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text('"""Stands in for Colab\'s module."""\n')
        startup = home / ".ipython" / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-colab.py").write_text("import google.colab  # noqa: F401\n")
        env["PYTHONPATH"] = str(tmp_path / "colab-env")
    else:
        (tmp_path / "kaggle" / "input").mkdir()
    return spec, cwd, env


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_a_notebook_runs_after_the_setup_cell(platform, tmp_path):
    py = _platform_venv()
    spec, cwd, env = _emulate(platform, tmp_path)
    probe = subprocess.run([str(py), "-c", "import helpers"], env=env, cwd=cwd,
                           capture_output=True)
    assert probe.returncode != 0, "the venv already has helpers: the test would prove nothing"
    repo = _course_repository(tmp_path / "github", tagged=spec["tagged"])
    env["COURSE_REPO"] = repo.as_uri()
    source = ROOT / spec["notebook"]
    nb_path = cwd / source.name   # downloaded from the book or opened from GitHub: a lone file
    shutil.copy(source, nb_path)
    assert _script().main([str(nb_path)]) == 0
    nb = nbformat.read(nb_path, as_version=4)   # a last cell: which Python and helpers ran it
    if "through" in spec:
        last = [i for i, c in enumerate(nb.cells)
                if c.cell_type == "code" and spec["through"] in c.source]
        assert last, f"no cell of {source.name} has {spec['through']!r}: update PLATFORMS"
        nb.cells = nb.cells[:last[0] + 1]
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    nbformat.write(nb, nb_path)
    run = subprocess.run([str(py), "-c", RUNNER, str(nb_path), str(cwd)], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert not result["errors"], f"{source.name} on emulated {platform}:\n  " + \
        "\n  ".join(result["errors"])
    kernel_python, helpers_file, data, colab = result["probe"].split()
    assert pathlib.Path(kernel_python).parent == py.parent, \
        f"the notebook ran in {kernel_python}, not the emulated {platform}'s {py}"
    assert pathlib.Path(helpers_file).is_relative_to(VENV), \
        f"helpers came from {helpers_file}, not from the install into the environment"
    assert data == str(tmp_path / "home/.cache/multigpu-course/data")
    assert colab == str(platform == "colab"), "the platform's markers are not emulated"
    fallback = f"has no tag v{_version()}: installing its branch main"
    assert (fallback in result["setup"]) == (not spec["tagged"]), result["setup"]
    where = subprocess.run([str(py), "-c", "import helpers; print(helpers.__file__)"],
                           env=_clean_env(), cwd=tmp_path, capture_output=True, text=True)
    assert where.returncode == 0, "the set-up cell did not install helpers into the environment"


def test_every_notebook_has_the_setup_cell():
    """Fails until `python scripts/colab_setup_cell.py` has been run over the notebooks (and
    after a change of the cell, of pyproject's version or of _config.yml's repository)."""
    assert _script().main(["--check"]) == 0, "run: python scripts/colab_setup_cell.py"
