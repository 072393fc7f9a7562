"""Install metadata agrees with itself: the Python floor (pyproject, README, CI, Makefile, lock),
the install groups (pyproject extras, requirements/*.txt), and the lock (every pin of
requirements/*.txt at the same version, with hashes)."""
import pathlib
import re
import sys
import tomllib

import pytest
import yaml

from helpers.torch_floor import TORCH_FLOOR, validate_torch_version

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
GROUPS = ("reader", "book", "test", "teacher")


def _floor():
    m = re.fullmatch(r">=\s*3\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert m, "requires-python should be a plain floor, >=3.N"
    return f"3.{m.group(1)}"


def _pins(path, seen=None):
    """{name: version} of a requirements file, following -r includes."""
    seen = seen if seen is not None else {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            _pins(path.parent / line[3:].strip(), seen)
        elif "==" in line and not line.startswith("-"):
            name, version = line.split(";")[0].rstrip("\\ ").split("==")
            seen[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.strip()
    return seen


def test_python_floor_is_the_same_everywhere():
    floor = _floor()
    assert sys.version_info >= tuple(map(int, floor.split("."))), "this interpreter is below it"
    assert f"Python {floor} or newer" in (ROOT / "README.md").read_text()
    ci = yaml.safe_load((ROOT / ".github/workflows/ci.yml").read_text())
    assert floor in ci["jobs"]["test"]["strategy"]["matrix"]["python-version"], "CI tests the floor"
    make = (ROOT / "Makefile").read_text()
    assert f"--python-version {floor}" in make, "make lock resolves for the floor"
    assert f"sys.version_info < ({floor.replace('.', ', ')})" in make, "make venv checks the floor"
    assert f"Programming Language :: Python :: {floor}" in PYPROJECT["project"]["classifiers"]
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == f"python-{floor}"


def test_install_groups_exist_as_extras_and_files():
    extras = PYPROJECT["project"]["optional-dependencies"]
    for group in GROUPS:
        assert group in extras, f"pyproject has no extra {group!r}"
        assert (ROOT / "requirements" / f"{group}.txt").is_file()
    everything = _pins(ROOT / "requirements.txt")
    for group in GROUPS:
        assert _pins(ROOT / "requirements" / f"{group}.txt").items() <= everything.items()
    for name in ("jupyter-book", "torch", "nbgrader", "pytest"):
        assert name in everything
    reader = _pins(ROOT / "requirements" / "reader.txt")
    assert not {"jupyter-book", "nbgrader", "playwright", "sphinx"} & set(reader), \
        "a reader installs only what running the notebooks needs"


def test_the_lock_pins_every_requirement_with_hashes():
    lock_text = (ROOT / "requirements" / "lock.txt").read_text()
    lock = _pins(ROOT / "requirements" / "lock.txt")
    wanted = _pins(ROOT / "requirements.txt")
    stale = {n: (v, lock.get(n)) for n, v in wanted.items() if lock.get(n) != v}
    assert not stale, f"requirements/lock.txt is stale (run `make lock`): {stale}"
    blocks = re.split(r"\n(?=[A-Za-z0-9])", lock_text.split("\n", 3)[-1])
    unhashed = [b.split()[0] for b in blocks if "==" in b and "--hash=sha256:" not in b]
    assert not unhashed, f"pinned without a hash: {unhashed}"
    # the pins book/_ext depends on: exact
    for name in ("sphinx", "pydata-sphinx-theme", "sphinx-book-theme", "sphinx-thebe", "docutils",
                 "myst-nb", "sphinxcontrib-bibtex"):
        assert name in wanted, f"pin {name} in requirements/book.txt (book/_ext depends on it)"


def test_the_installer_is_pinned_with_hashes():
    """make installs the venvs with uv from requirements/uv.txt: one exact version, a hash for
    each of its wheels (pip --require-hashes refuses it otherwise), and make runs no other uv."""
    text = (ROOT / "requirements" / "uv.txt").read_text()
    pins = _pins(ROOT / "requirements" / "uv.txt")
    assert list(pins) == ["uv"], pins
    assert text.count("--hash=sha256:") >= 10, "a hash for every platform's wheel of uv"
    make = (ROOT / "Makefile").read_text()
    assert "--require-hashes -r requirements/uv.txt" in make
    assert not re.search(r"pip install[^\n]*\buv\b(?!\.txt)", make), "uv only from uv.txt"


def test_binder_is_slim_and_cpu():
    text = (ROOT / "binder" / "requirements.txt").read_text()
    assert "download.pytorch.org/whl/cpu" in text
    binder = _pins(ROOT / "binder" / "requirements.txt")
    assert not {"jupyter-book", "nbgrader", "playwright", "pytest"} & set(binder)
    course = _pins(ROOT / "requirements" / "course.txt")
    assert {n: v for n, v in binder.items() if n in course} == course, \
        "Binder runs the course's pinned versions"
    assert (ROOT / "binder" / "postBuild").stat().st_mode & 0o111, "postBuild must be executable"


def test_package_metadata_is_complete():
    p = PYPROJECT["project"]
    for key in ("license", "authors", "readme", "urls", "classifiers", "license-files"):
        assert p.get(key), f"pyproject [project] lacks {key}"
    for f in p["license-files"]:
        assert (ROOT / f).is_file()
    assert "Creative Commons Attribution-ShareAlike 4.0" in (ROOT / "LICENSE-text.md").read_text()
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] and cff["title"] and cff["authors"]


def test_helpers_refuse_a_torch_below_the_floor(tmp_path):
    """The set-up cell installs helpers with --no-deps beside the reader's torch: `import
    helpers` checks pyproject's floor itself and names the fix."""
    import subprocess

    dep = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch>="))
    assert TORCH_FLOOR == tuple(map(int, dep.removeprefix("torch>=").split(".")))
    floor = ".".join(map(str, TORCH_FLOOR))
    major, minor = TORCH_FLOOR
    for ok in (f"{floor}.0", f"{floor}.0a0+git1", f"{major}.{minor + 3}.1+cu126",
               f"{major + 1}.0.0"):
        validate_torch_version(ok)
    old = f"{major}.{minor - 1}.1+cu121"
    with pytest.raises(ImportError, match=rf"needs torch {floor} or newer, this Python has "
                                          rf"{re.escape(old)}: run pip install -U "
                                          rf"'torch>={floor}'"):
        validate_torch_version(old)
    fake = tmp_path / "torch"          # an old torch first on the path: import helpers stops
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "2.4.0"\n')
    run = subprocess.run([sys.executable, "-c", "import helpers"], capture_output=True,
                         text=True, env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": ""})
    assert run.returncode == 1 and "this Python has 2.4.0" in run.stderr.splitlines()[-1]
