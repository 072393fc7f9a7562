"""The set-up cell (scripts/colab_setup_cell.py), the files a plain install ships
(helpers.script_path, helpers.paths.course_file), and notebooks run in an emulated Colab and Kaggle.

The emulations: a venv with only what those platforms preinstall (torch, torchvision, matplotlib,
ipywidgets, tqdm, ipykernel; nbclient/nbformat to run the notebook), no course package; the
platform's markers (Colab: the `google.colab` module imported at kernel start, its environment
variables, /content as the working folder; Kaggle: KAGGLE_KERNEL_RUN_TYPE and friends,
/kaggle/working); a fresh home folder whose ~/.cache/multigpu-course/data holds Fashion-MNIST
(where a plain install looks for it). The course's "repository" is a local git repository
(COURSE_REPO points the cell at it; no network: pip may not use an index, and builds without
isolation from the venv's setuptools) holding the package at the ref the set-up cell names:
the branch (this checkout's package: what the branch holds once it is committed), or a release's
tag (that tag's package from this repository's history; this checkout's only while the tag is
not made yet, a release commit being tested before `git tag`). One Colab session (one install,
one kernel) runs a Part I chapter whole, then one notebook of every Part its first cells
against that install; Kaggle runs the torchrun chapter through its first training run, whose
ranks are new interpreters started by torchrun: they import helpers only if the install is
visible to every process, and run the DDP scripts the package ships. The venv is cached in
_build/colab-venv (first run about a minute).
"""
import fcntl
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
from book_files import helpers_names, toc_notebooks, toc_parts

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
def test_setup_cell_is_inserted_once_under_the_title_and_updated(tmp_path):
    mod = _script()
    path = tmp_path / "nb.ipynb"
    shutil.copy(ROOT / "book" / "part1" / "data_parallel.ipynb", path)
    before = nbformat.read(path, as_version=4)
    assert mod.main([str(path)]) == 0
    once = path.read_text()
    assert mod.main([str(path)]) == 0 and path.read_text() == once, "not idempotent"
    assert mod.main(["--check", str(path)]) == 0
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), \
        "the title comes first"
    cell = nb.cells[1]
    assert cell.id == mod.CELL_ID and cell.cell_type == "code"
    assert cell.metadata["tags"] == ["remove-cell"], "the book must hide the set-up cell"
    assert cell.source.startswith("#@title ") and cell.metadata["cellView"] == "form", \
        "Colab folds it to its title"
    assert cell.metadata["jupyter"]["source_hidden"], "JupyterLab and VS Code fold it"
    others = [c.source for c in before.cells if c.get("id") != mod.CELL_ID]
    assert [c.source for c in nb.cells if c.get("id") != mod.CELL_ID] == others, \
        "the script changed other cells"
    assert all(len(line) <= 79 for line in cell.source.splitlines()), "notebook lines: 79 cols"
    # a stale copy (another ref, moved to the top, with outputs) becomes the fresh cell
    cell.source = cell.source.replace(f'REF = "{mod.release_ref()}"', 'REF = "v0.0.1"')
    cell.outputs = [nbformat.v4.new_output("stream", text="x")]
    nb.cells.insert(0, nb.cells.pop(1))
    nbformat.write(nb, path)
    assert mod.main(["--check", str(path)]) == 1
    assert mod.main([str(path)]) == 0 and path.read_text() == once


def test_setup_cell_installs_the_branch_between_releases_and_a_release_its_tag():
    """main's notebooks must never install an older release's helpers (a Part VII chapter
    failed on a tag made before Part VII): a development version installs the branch."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    mod = _script()
    url = config["repository"]["url"].rstrip("/")
    assert f'"{url}"' in mod.cell_source()
    version = _version()
    want = (f"v{version}" if mod.is_release(version) else config["repository"]["branch"])
    assert mod.release_ref() == want and f'REF = "{want}"' in mod.cell_source()
    assert mod.release_ref(v="0.3.0.dev0") == config["repository"]["branch"]
    assert mod.release_ref(v="0.3.0") == "v0.3.0"
    fork = {"repository": {"url": "https://github.com/someone/fork/", "branch": "dev"}}
    src = mod.cell_source(fork, v="1.2.0.dev1")
    assert '"https://github.com/someone/fork"' in src and 'REF = "dev"' in src
    assert 'REF = "v9.8.7"' in mod.cell_source(fork, v="9.8.7")


class _Recorder:
    """subprocess.run stand-in: records each command."""

    def __init__(self):
        self.calls = []

    def __call__(self, cmd, **kwargs):
        self.calls.append(cmd)
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")


def _run_cell(monkeypatch, recorder, missing=(), shadow=None):
    """Run the cell in this process; `missing`: modules find_spec must not find (as where they
    are not installed); `shadow`: a folder holding another helpers.py, first on sys.path."""
    source = _script().cell_source()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        None if name in missing else real(name, *a)))
    monkeypatch.setattr(subprocess, "run", recorder)
    monkeypatch.delenv("COURSE_REPO", raising=False)
    if shadow:
        monkeypatch.syspath_prepend(str(shadow))
        monkeypatch.delitem(sys.modules, "helpers")
    try:
        exec(source, {})
    finally:
        if shadow:   # monkeypatch puts the course's helpers back
            sys.modules.pop("helpers", None)


def test_setup_cell_does_nothing_where_helpers_imports(monkeypatch):
    """A checkout, Binder, nbval, the book build: helpers imports, nothing is installed."""
    recorder = _Recorder()
    _run_cell(monkeypatch, recorder)
    assert recorder.calls == []


def test_setup_cell_installs_what_it_names_keeping_the_platforms_torch(monkeypatch):
    mod = _script()
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    target = f"git+{url}@{mod.release_ref()}"
    platform = _Recorder()   # Colab, Kaggle: torch is there
    _run_cell(monkeypatch, platform, missing={"helpers"})
    deps, package = platform.calls
    assert deps[1:4] == ["-m", "pip", "install"] and set(mod.install_deps()) <= set(deps)
    assert not any(d.startswith(("torch", "git+")) for d in deps), deps
    assert package[-2:] == ["--no-deps", target], package
    bare = _Recorder()       # a Jupyter without torch: everything from the index
    _run_cell(monkeypatch, bare, missing={"helpers", "torch"})
    assert len(bare.calls) == 1 and bare.calls[0][-1] == target
    assert "--no-deps" not in bare.calls[0]


def test_setup_cell_stops_on_another_module_named_helpers(monkeypatch, tmp_path):
    """A reader's helpers.py beside the notebook: no install, no AttributeError three cells
    later, but one line naming the file and the fix."""
    (tmp_path / "helpers.py").write_text("def mine():\n    return 1\n")
    recorder = _Recorder()
    with pytest.raises(SystemExit) as stop:
        _run_cell(monkeypatch, recorder, shadow=tmp_path)
    text = str(stop.value)
    assert str(tmp_path / "helpers.py") in text and "rename it" in text and "\n" not in text
    assert recorder.calls == [], "a shadowing module is reported, not installed over"


def _fake_wheel(where, name, version, requires=()):
    """A wheel with metadata only (what pip's resolver reads), no code."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    path = where / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    files = {f"{info}/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
                 name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def test_pip_would_replace_an_older_torch_but_the_cell_keeps_it(monkeypatch, tmp_path):
    """The package asks for torch>=2.11. Where a platform has an older torch (Kaggle lags), a
    plain `pip install` of the package replaces it (a multi-GB download, maybe for another CUDA);
    the commands the cell runs leave it. pip resolves (--dry-run) against wheels that carry
    metadata only: an old torch installed, newer ones and the other dependencies on offer."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    old = _fake_wheel(wheels, "torch", "2.0.0")
    for name, version in [("torch", "99.0.0"), ("torchvision", "99.0.0"),
                          ("matplotlib", "99.0.0"), ("tqdm", "99.0.0")]:
        _fake_wheel(wheels, name, version)
    _fake_wheel(wheels, project["name"], project["version"], project["dependencies"])
    venv = tmp_path / "platform"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # pip as it comes: no machine's pip.conf, constraints or extra wheel folders
    env = {k: v for k, v in _clean_env().items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    offline = ["--no-index", "--find-links", str(wheels), "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--quiet", *offline, str(old)], check=True, env=env)

    def would_install(args):
        report = tmp_path / "report.json"
        subprocess.run([*pip, "install", "--quiet", "--dry-run", "--report", str(report),
                        *offline, *args], check=True, env=env)
        return {i["metadata"]["name"]: i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}

    assert would_install([project["name"]]).get("torch") == "99.0.0", \
        "a plain install no longer replaces an older torch: the cell's care may go"
    recorder = _Recorder()
    _run_cell(monkeypatch, recorder, missing={"helpers"})
    monkeypatch.undo()   # subprocess.run itself again
    replaced = {}
    for cmd in recorder.calls:   # the cell's commands, its package from the wheels here
        assert cmd[1:4] == ["-m", "pip", "install"], cmd
        args = [project["name"] if a.startswith("git+") else a for a in cmd[4:]
                if a != "--quiet"]
        replaced.update(would_install(args))
    assert project["name"] in replaced and "torch" not in replaced, replaced


# ---------------------------------------------------------------- files a plain install ships
def test_script_path_in_a_checkout():
    import helpers
    assert helpers.script_path("torchrun.py") == (ROOT / "scripts/ddp/torchrun.py").resolve()
    assert helpers.script_path("bench.py", folder="") == (ROOT / "scripts/bench.py").resolve()
    assert helpers.paths.course_file("gpu_reference.json") == \
        (ROOT / "reference/gpu_reference.json").resolve()
    with pytest.raises(FileNotFoundError, match="no_such_script.py"):
        helpers.script_path("no_such_script.py")


def _package_copy(dest, source=ROOT):
    """The files a plain install is built from, copied out of this checkout (or `source`)."""
    for rel in PACKAGE_FILES:
        src = source / rel
        if source != ROOT and not src.exists():   # an older release's layout
            continue
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
             "print(helpers.paths.course_file('gpu_reference.json')); "
             "print(helpers.data.data_dir())")
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
errors = [f"{c.metadata.get('from', 'cell')} {i}: {o.get('ename')}: {o.get('evalue')}"
          for i, c in enumerate(nb.cells) if c.cell_type == "code"
          for o in c.get("outputs", []) if o.get("output_type") == "error"
          and "raises-exception" not in c.metadata.get("tags", [])]
text = lambda c: "".join(o.get("text", "") for o in c.get("outputs", []))
setup = [text(c) for c in nb.cells if c.get("id") == "course-setup"]
print(json.dumps({"errors": errors, "setup": setup, "probe": text(nb.cells[-1])}))
"""

PROBE = ("import sys, helpers\nprint(sys.executable)\nprint(helpers.__file__)\n"
         "print(helpers.data.data_dir())\nprint('google.colab' in sys.modules)")

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
    """A venv with the platforms' stack only, cached under _build/ (rebuilt when it changes).
    Under a lock: two pytest workers (plain `-n 2` spreads this module's tests) would otherwise
    build it at once, one deleting what the other installs."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "colab-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _platform_venv_locked()


def _platform_venv_locked():
    py = VENV / "bin" / "python"
    stamp = VENV / ".stack"
    if not (py.exists() and stamp.exists() and stamp.read_text() == " ".join(PLATFORM_STACK)):
        shutil.rmtree(VENV, ignore_errors=True)
        # without ensurepip: its pip (an old one, byte-compiled as it installs) cost more CPU
        # than the stack. This interpreter's pip installs a current pip (the set-up cell's) and
        # the stack into the venv, in one resolution, uncompiled
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(VENV)], check=True)
        rest = [name for name in PLATFORM_STACK if name not in PREINSTALLED]
        subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet",
                        "--no-compile", "pip", *rest], check=True, env=_clean_env())
        _link_preinstalled(py)
        subprocess.run([str(py), "-m", "ipykernel", "install", "--sys-prefix", "--name",
                        "python3"], check=True, env=_clean_env(), capture_output=True)
        stamp.write_text(" ".join(PLATFORM_STACK))
    # as the platforms have it: no course package until the set-up cell installs one (pip runs
    # only where an earlier session left one: _run_emulated's probe fails on a leftover)
    if any(VENV.glob("lib/python*/site-packages/multigpu_course_helpers-*.dist-info")):
        subprocess.run([str(py), "-m", "pip", "uninstall", "--quiet", "-y",
                        "multigpu-course-helpers"], env=_clean_env(), capture_output=True)
    return py


def _git(repo, *args, **kwargs):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args],
                          check=True, env=_clean_env(), **kwargs)


def _course_repository(where, ref):
    """A git repository (the course on GitHub, offline) whose `ref` holds the package the set-up
    cell installs: a branch, this checkout's package files (what the branch holds once this is
    committed); a tag v<X.Y.Z>, that tag's package files from this repository's history, or this
    checkout's while the tag does not exist yet (a release commit tested before `git tag`)."""
    have = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "-q", "--verify",
                           f"refs/tags/{ref}"], capture_output=True, env=_clean_env())
    tagged = ref.startswith("v") and have.returncode == 0
    if tagged:   # the release's files, not this checkout's
        tree = where.parent / f"{where.name}-{ref}"
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True,
                                 capture_output=True, env=_clean_env()).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        repo = _package_copy(where, source=tree)
    else:
        repo = _package_copy(where)
    branch = ref if not ref.startswith("v") else "main"
    for args in (["init", "--quiet", "-b", branch], ["add", "-A"],
                 ["commit", "--quiet", "-m", "course"]):
        _git(repo, *args)
    if ref.startswith("v"):
        _git(repo, "tag", "-a", ref, "-m", ref)
    return repo


def _data_source():
    data = pathlib.Path(os.environ.get("COURSE_DATA") or ROOT / "data")
    if not (data / "FashionMNIST").is_dir():
        pytest.skip(f"no Fashion-MNIST in {data} (set COURSE_DATA)")
    return data


PLATFORMS = {
    # Colab: its kernel has imported google.colab; /content is the working folder
    "colab": dict(notebook="book/part1/data_parallel.ipynb", cwd="content",
                  env=dict(COLAB_RELEASE_TAG="release-colab-emulated", COLAB_GPU="",
                           COLAB_JUPYTER_IP="172.28.0.12")),
    # Kaggle: what its docker image sets; /kaggle/working is the working (and output) folder.
    # The chapter up to its first training run under torchrun and the load of the model it saved
    # (what a fresh interpreter per rank needs; the later sections launch the same way). Not
    # the launch of minimal.py, which imports torch alone (tests/test_distributed.py runs it):
    # it tests the platform's torch, not the install; nor single.py and spawn.py with the cell
    # that compares their logs: fresh interpreters running a script of the install by path, as
    # the torchrun launch does (about 10 s of CPU on a 2-core machine, 3 more processes)
    "kaggle": dict(notebook="book/part3/ddp_torchrun.ipynb", cwd="kaggle/working",
                   through="load_state_dict(torch.load(workdir",
                   skip=('str(SCRIPTS / "minimal.py"), "--steps"',
                         'for script, extra in (("single.py", [])',
                         'one, two = losses["single.py"], losses["spawn.py"]'),
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


def _chapter_cells(entry, cwd, through=None, first=None, label=None, skip=None):
    """`entry`'s cells as a reader opening it gets them: its set-up cell written by the script,
    then every cell up to the one holding `through` (or its first `first` code cells after the
    set-up cell), less the code cells holding each of `skip` (one cell each); `label`: names the
    cells' chapter in errors."""
    path = cwd / f"{pathlib.Path(entry).name}.ipynb"   # downloaded or opened alone: a lone file
    shutil.copy(ROOT / f"{entry}.ipynb", path)
    assert _script().main([str(path)]) == 0
    cells = nbformat.read(path, as_version=4).cells
    if through:
        last = [i for i, c in enumerate(cells) if c.cell_type == "code" and through in c.source]
        assert last, f"no cell of {entry} has {through!r}: update PLATFORMS"
        cells = cells[:last[0] + 1]
    for marker in skip or ():
        left = [c for c in cells if not (c.cell_type == "code" and marker in c.source)]
        assert len(left) == len(cells) - 1, \
            f"no one cell of {entry} has {marker!r}: update PLATFORMS"
        cells = left
    if first is not None:
        cells = [c for c in cells if c.cell_type == "code"]
        assert cells[0].get("id") == _script().CELL_ID
        cells = cells[:1 + first]
    if label:
        for c in cells:
            c.metadata["from"] = label
    return cells


def _run_emulated(platform, tmp_path, cells):
    """Run `cells` and a last probe cell in one kernel of an emulated `platform` whose course
    package is installed by the first set-up cell only. The run's result (errors, the set-up
    cell's output, the probe's), the platform's Python and the notebook's environment."""
    py = _platform_venv()
    spec, cwd, env = _emulate(platform, tmp_path)
    probe = subprocess.run([str(py), "-c", "import helpers"], env=env, cwd=cwd,
                           capture_output=True)
    assert probe.returncode != 0, "the venv already has helpers: the test would prove nothing"
    env["COURSE_REPO"] = _course_repository(tmp_path / "github",
                                            _script().release_ref()).as_uri()
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3",
                                                          "display_name": "Python 3"}})
    nb.cells = cells(cwd)
    nb.cells.append(nbformat.v4.new_code_cell(
        PROBE + "\nimport json, pkgutil\nprint(json.dumps(sorted(set(dir(helpers)) | {m.name for m "
        "in pkgutil.iter_modules(helpers.__path__)})))"))
    nb_path = cwd / "run.ipynb"
    nbformat.write(nb, nb_path)
    run = subprocess.run([str(py), "-c", RUNNER, str(nb_path), str(cwd)], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), py


def _assert_ran_on(platform, result, py, tmp_path):
    assert not result["errors"], f"on emulated {platform}:\n  " + "\n  ".join(result["errors"])
    kernel_python, helpers_file, data, colab = result["probe"].split("\n")[:4]
    assert pathlib.Path(kernel_python).parent == py.parent, \
        f"the notebook ran in {kernel_python}, not the emulated {platform}'s {py}"
    assert pathlib.Path(helpers_file).is_relative_to(VENV), \
        f"helpers came from {helpers_file}, not from the install into the environment"
    assert data == str(tmp_path / "home/.cache/multigpu-course/data")
    assert colab == str(platform == "colab"), "the platform's markers are not emulated"
    assert result["setup"] == [""], f"the set-up cell printed {result['setup']}"
    # a fresh interpreter of the platform finds it in the environment (the kernel imported it
    # above: finding it is enough, without importing torch once more)
    where = subprocess.run([str(py), "-c", "import importlib.util as u; "
                            "print(getattr(u.find_spec('helpers'), 'origin', None))"],
                           env=_clean_env(), cwd=tmp_path, capture_output=True, text=True)
    assert where.returncode == 0 and pathlib.Path(where.stdout.strip()).is_relative_to(VENV), \
        f"the set-up cell did not install helpers into the environment: {where.stdout}"


FIRST_CELLS = 2   # code cells of each Part's notebook after its set-up cell: imports, first use


def _one_notebook_per_part():
    """The first notebook of each Part of _toc.yml (where a reader of the Part starts)."""
    found = []
    for caption, entries in toc_parts():
        notebooks = [e for e in entries if (ROOT / f"{e}.ipynb").is_file()]
        if notebooks:
            found.append((caption, notebooks[0]))
    return found


@pytest.fixture(scope="module")
def colab_session(tmp_path_factory):
    """One emulated Colab session (one install, one kernel): the Part I chapter whole, its
    set-up cell installing helpers, then, as a reader opening one chapter after another, each
    Part's first notebook's set-up cell and first code cells."""
    tmp_path = tmp_path_factory.mktemp("colab")
    parts = _one_notebook_per_part()
    assert len(parts) >= 8, parts

    def cells(cwd):
        out = _chapter_cells(PLATFORMS["colab"]["notebook"].removesuffix(".ipynb"), cwd)
        for caption, entry in parts:
            for c in _chapter_cells(entry, cwd, first=FIRST_CELLS,
                                    label=f"{entry}.ipynb ({caption})"):
                c["id"] = f"{len(out)}-{c.get('id')}"[:64]   # unique in the one notebook
                out.append(c)
        return out
    result, py = _run_emulated("colab", tmp_path, cells)
    return result, py, tmp_path


def test_a_chapter_runs_on_colab_after_the_setup_cell(colab_session):
    result, py, tmp_path = colab_session
    _assert_ran_on("colab", result, py, tmp_path)


def test_a_chapter_runs_on_kaggle_after_the_setup_cell(tmp_path):
    spec = PLATFORMS["kaggle"]
    result, py = _run_emulated("kaggle", tmp_path, lambda cwd: _chapter_cells(
        spec["notebook"].removesuffix(".ipynb"), cwd, through=spec["through"], skip=spec["skip"]))
    _assert_ran_on("kaggle", result, py, tmp_path)


def test_one_notebook_of_every_part_runs_against_the_helpers_its_cell_installs(colab_session):
    """A notebook opened from the repository installs what its set-up cell names; a Part whose
    chapters use a name that helpers lacks there fails here (a Part VII chapter once met
    `AttributeError: module 'helpers' has no attribute 'rank_grid'` on an older tag). The
    Colab session runs, in turn, each Part's set-up cell and first code cells (as a reader
    opening one chapter after another), and every name any chapter takes from helpers
    (`helpers.X`, `from helpers import X`) must exist in that install: a name of the façade or
    a module of the package."""
    result, _, _ = colab_session
    assert not result["errors"], "on emulated Colab, with the helpers the cells install:\n  " + \
        "\n  ".join(result["errors"])
    lines = result["probe"].splitlines()
    assert pathlib.Path(lines[1]).is_relative_to(VENV), f"helpers came from {lines[1]}"
    have = set(json.loads(lines[-1]))
    lacking = {}
    for path in toc_notebooks():
        for name in helpers_names(nbformat.read(path, as_version=4)) - have:
            lacking.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    assert not lacking, f"the helpers the cells install lack {lacking}"


def test_the_names_check_sees_a_missing_name():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import helpers\nfrom helpers import (a, b)\n"
                                          "helpers.rank_grid((2, 2))\n%time x = 1")]
    assert helpers_names(nb) == {"a", "b", "rank_grid"}


def test_every_notebook_has_the_setup_cell():
    """Fails until `python scripts/colab_setup_cell.py` has been run over the notebooks (and
    after a change of the cell, of pyproject's version or of _config.yml's repository)."""
    assert _script().main(["--check"]) == 0, "run: python scripts/colab_setup_cell.py"
