"""Put the set-up cell under the title of notebooks, or bring it up to date (idempotent).

Usage: python scripts/colab_setup_cell.py [--check] [book/part1/x.ipynb ...]
(default: every notebook in _toc.yml). The cell sits right under the title cell, collapsed where
a notebook is read (Colab: `#@title` and `cellView: form`; JupyterLab and VS Code:
`jupyter.source_hidden`) and removed from the book (`remove-cell`). Where `import helpers` finds
nothing (Colab, Kaggle, SageMaker Studio Lab, a downloaded notebook in any Jupyter) it installs
the course's `helpers` package matching the notebook: `pip install git+REPO@REF`, from
_config.yml's repository, where REF is what the notebook was written with (release_ref):
- between releases pyproject's version is a development version (`0.2.0.dev0`, PEP 440) and
  the cells install the branch the notebooks are on (_config.yml's repository.branch): main's
  notebooks run main's helpers, never an older release's;
- a release's version (`0.2.0`) makes the cells install its tag `v0.2.0`, the commit those
  notebooks were released with (CHANGELOG.md, "Releases").
Where torch is installed already the package goes in with --no-deps and only its other
dependencies are installed: pip would otherwise replace a platform's older torch (the package
asks for torch>=2.11) with a multi-GB download built for another CUDA. A plain install, not a
clone: the scripts the chapters run and the GPU reference run ship inside the package
(pyproject.toml, helpers.script_path), in site-packages, so every process a chapter starts
(ranks, torchrun) imports it too. Then the cell imports `helpers` and checks the course's mark
(`helpers.__course__`): any other module of that name (a reader's helpers.py beside the notebook)
stops the notebook with one line naming the file and the fix. Where the course's helpers imports
(a checkout, Binder, nbval, the book build) nothing is installed.
COURSE_REPO overrides the repository (a fork, or tests/test_colab.py's local one, offline).
`--check` changes nothing and exits 1 listing the notebooks whose cell is missing or stale.
"""
import argparse
import copy
import pathlib
import re
import sys
import tomllib

import nbformat
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from book_files import toc_notebooks  # noqa: E402

CELL_ID = "course-setup"
TAGS = ["remove-cell"]
# Colab folds a `#@title` cell to its title (cellView: form); JupyterLab and VS Code fold
# source_hidden cells; the book removes the cell (its tag)
METADATA = {"tags": TAGS, "cellView": "form", "jupyter": {"source_hidden": True}}
MARK = "multigpu-course"   # helpers.__course__
NOT_TORCH = ("torch", "torchvision")   # the platform's own, never replaced

SOURCE = '''\
#@title Set-up: installs the course's `helpers` where it is missing
# (Colab, Kaggle, a downloaded notebook). Hidden in the book; written by
# scripts/colab_setup_cell.py: edit that script, not this cell.
import importlib.util
import os
import subprocess
import sys

REF = "{ref}"  # {ref_note}
REPO = os.environ.get(
    "COURSE_REPO", "{url}")
if importlib.util.find_spec("helpers") is None:
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    if importlib.util.find_spec("torch"):  # keep the platform's torch
        subprocess.run(pip + {deps}, check=True)
        pip.append("--no-deps")
    subprocess.run(pip + [f"git+{{REPO}}@{{REF}}"], check=True)
    importlib.invalidate_caches()
import helpers

if getattr(helpers, "__course__", None) != "{mark}":
    where = helpers.__file__ or next(iter(helpers.__path__))  # file, folder
    raise SystemExit(f"{{where}} is not the course's helpers: rename it, or "
                     "open the notebook from another folder")
'''


def version(root=ROOT):
    """pyproject.toml's [project] version: the one source of the version."""
    with open(pathlib.Path(root) / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def is_release(v):
    """A release's version (`0.2.0`), not a development one (`0.2.0.dev0`, PEP 440)."""
    return re.search(r"\.dev\d*$", v) is None


def release_tag(root=ROOT):
    """v<version> of pyproject.toml: the tag a release of the book gets (CHANGELOG.md)."""
    return "v" + version(root)


def release_ref(config=None, v=None):
    """What the notebooks install: a release's tag, or between releases the repository's branch."""
    config = config or yaml.safe_load((ROOT / "_config.yml").read_text())
    v = v or version()
    return f"v{v}" if is_release(v) else config["repository"].get("branch", "main")


def install_deps(root=ROOT):
    """pyproject's dependencies other than torch and torchvision (what --no-deps leaves out)."""
    with open(pathlib.Path(root) / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return [d for d in deps if re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0] not in NOT_TORCH]


def cell_source(config=None, v=None):
    """The set-up cell's code for _config.yml's repository and pyproject's version."""
    config = config or yaml.safe_load((ROOT / "_config.yml").read_text())
    v = v or version()
    ref = release_ref(config, v)
    note = (f"release {v}: its tag" if is_release(v) else
            f"version {v}, between releases: the branch")
    deps = "[" + ", ".join(f'"{d}"' for d in install_deps()) + "]"
    return SOURCE.format(url=config["repository"]["url"].rstrip("/"), ref=ref, ref_note=note,
                         deps=deps, mark=MARK)


def title_index(cells):
    """The index of the title cell (the first markdown cell with a `# ` heading); -1 if none."""
    for i, c in enumerate(cells):
        if c.cell_type == "markdown" and re.match(r"^# \S", c.source.lstrip()):
            return i
    return -1


def update(nb, source):
    """Insert or refresh the set-up cell right under the title of `nb`; True if `nb` changed."""
    found = [i for i, c in enumerate(nb.cells) if c.get("id") == CELL_ID]
    old = [nb.cells[i] for i in found]
    for i in reversed(found):   # a duplicate (copied cells): keep none, insert one
        nb.cells.pop(i)
    where = title_index(nb.cells) + 1
    fresh = (len(found) == 1 and found[0] == where and old[0].source == source
             and old[0].metadata == METADATA and not old[0].get("outputs")
             and old[0].get("execution_count") is None)
    cell = nbformat.v4.new_code_cell(source=source, metadata=copy.deepcopy(METADATA))
    cell["id"] = CELL_ID
    nb.cells.insert(where, old[0] if fresh else cell)
    return not fresh


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=pathlib.Path)
    ap.add_argument("--check", action="store_true", help="change nothing; list stale notebooks")
    args = ap.parse_args(argv)
    source = cell_source()
    stale = []
    for path in args.notebooks or toc_notebooks():
        nb = nbformat.read(path, as_version=4)
        if update(nb, source):
            stale.append(path)
            if not args.check:
                nbformat.validate(nb)
                # written whole, then renamed (a kill leaves the old notebook): by hand, not
                # helpers' atomic_write, since the pre-commit hook runs this script with
                # nbformat and pyyaml only (helpers imports torch)
                tmp = path.with_name(path.name + ".tmp")
                nbformat.write(nb, tmp)
                tmp.replace(path)
                print("set-up cell written:", path)
    if args.check and stale:
        print("set-up cell missing or stale (run scripts/colab_setup_cell.py):",
              *map(str, stale), sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
