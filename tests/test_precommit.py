"""The pre-commit hooks run from a fresh copy of the repository with nothing activated.

Every hook of .pre-commit-config.yaml is `language: python` with pinned packages, so pre-commit
builds its environments from PyPI alone. The run: the tracked files copied into a new git
repository, PATH without any venv, pre-commit from this interpreter; every hook must pass on the
committed tree. The hook environments are cached in _build/pre-commit (first run: about a
minute to build them from the registry; then seconds).
"""
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CACHE = ROOT / "_build" / "pre-commit"


def _git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)


def test_hooks_pass_from_a_fresh_clone(tmp_path):
    pytest = __import__("pytest")
    try:
        import pre_commit  # noqa: F401
    except ImportError:
        pytest.fail("pre-commit is missing: it is pinned in requirements/test.txt (make venv)")
    files = _git("ls-files", "-z", cwd=ROOT).stdout.split("\0")
    repo = tmp_path / "clone"
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / rel)
    _git("init", "-q", cwd=repo)
    _git("add", "-A", cwd=repo)
    python_dir = str(pathlib.Path(shutil.which("python3") or sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=os.pathsep.join(dict.fromkeys(["/usr/bin", "/bin", python_dir])),
               PRE_COMMIT_HOME=str(CACHE), GIT_CONFIG_NOSYSTEM="1")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if not p.startswith(str(pathlib.Path(sys.prefix))))
    run = subprocess.run([sys.executable, "-m", "pre_commit", "run", "--all-files",
                          "--show-diff-on-failure", "--color", "never"],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "Passed" in run.stdout and "Failed" not in run.stdout, run.stdout
