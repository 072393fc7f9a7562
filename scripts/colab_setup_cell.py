"""Put the set-up cell at the top of notebooks, or bring it up to date (idempotent).

Usage: python scripts/colab_setup_cell.py [--check] [book/part1/x.ipynb ...]
(default: every notebook in _toc.yml). The cell, tagged `remove-cell` (the book hides it),
installs the course's `helpers` package wherever `import helpers` would fail: Colab, Kaggle,
SageMaker Studio Lab, a downloaded notebook in any Jupyter. It installs the release the notebook
belongs to: `pip install git+REPO@vX.Y.Z`, the tag of pyproject's
version (the one source of the version: CHANGELOG.md, "Releases"), from _config.yml's repository.
Where that tag does not exist yet (a version set but not tagged, a fork without tags), it installs
the repository's branch instead (_config.yml's repository.branch) and says so in one line. A
plain install, not a clone: the scripts the chapters run and the GPU reference run ship inside the
package (pyproject.toml, helpers.script_path), it lands in the environment's site-packages, so
the kernel imports it at once and every process a chapter starts (ranks, torchrun) finds it too.
Where helpers is importable (a checkout, Binder, nbval, the book build) the cell does nothing.
COURSE_REPO overrides the repository (a fork, or tests/test_colab.py's local one, offline).
`--check` changes nothing and exits 1 listing the notebooks whose cell is missing or stale.
"""
import argparse
import pathlib
import sys
import tomllib

import nbformat
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from book_files import toc_notebooks  # noqa: E402

CELL_ID = "course-setup"
TAGS = ["remove-cell"]

SOURCE = '''\
# Set-up: installs the course's `helpers` (release {tag}) where it is
# missing: Colab, Kaggle, SageMaker Studio Lab, a downloaded notebook.
# Where `import helpers` works already, this cell does nothing.
# Written by scripts/colab_setup_cell.py: edit that script, not this cell.
import importlib.util
import os
import subprocess
import sys

REPO = os.environ.get(
    "COURSE_REPO", "{url}")
RELEASE = "{tag}"  # this book's version (the branch {branch} if not tagged)
if importlib.util.find_spec("helpers") is None:
    tags = subprocess.run(["git", "ls-remote", "--tags", REPO, RELEASE],
                          capture_output=True, text=True)
    if tags.returncode:
        raise RuntimeError(f"cannot reach {{REPO}} (on Kaggle: turn Internet "
                           f"on in the notebook's settings): {{tags.stderr}}")
    ref = RELEASE if tags.stdout.strip() else "{branch}"
    if ref != RELEASE:
        print(f"{{REPO}} has no tag {{RELEASE}}: installing its branch {{ref}}")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    f"git+{{REPO}}@{{ref}}"], check=True)
'''


def release_tag(root=ROOT):
    """v<version> of pyproject.toml: the tag a release of the book gets (CHANGELOG.md)."""
    with open(pathlib.Path(root) / "pyproject.toml", "rb") as f:
        return "v" + tomllib.load(f)["project"]["version"]


def cell_source(config=None, tag=None):
    """The set-up cell's code for _config.yml's repository and pyproject's version."""
    config = config or yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = config["repository"]
    return SOURCE.format(url=repo["url"].rstrip("/"), branch=repo.get("branch", "main"),
                         tag=tag or release_tag())


def update(nb, source):
    """Insert or refresh the set-up cell as the first cell of `nb`; True if `nb` changed."""
    found = [i for i, c in enumerate(nb.cells) if c.get("id") == CELL_ID]
    cell = nbformat.v4.new_code_cell(source=source, metadata={"tags": list(TAGS)})
    cell["id"] = CELL_ID
    if found:
        old = nb.cells.pop(found[0])
        for extra in found[1:]:      # a duplicate (copied cells): keep one
            nb.cells.pop(extra - 1)
        if (found == [0] and old.source == source
                and old.metadata.get("tags") == TAGS and not old.get("outputs")):
            nb.cells.insert(0, old)
            return False
    nb.cells.insert(0, cell)
    return True


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
