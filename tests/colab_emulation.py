"""What the Colab tests share: the set-up cell script, a reader's clean environment, the files a
plain install is built from, the emulated platform's venv (what Colab and Kaggle preinstall,
cached in _build/colab-venv; first build about a minute) and the course's repository as a
local git repository at the ref the set-up cell names (test_colab.py's docstring)."""
import fcntl
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib

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
