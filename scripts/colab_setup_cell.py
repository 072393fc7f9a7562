"""Put the Colab set-up cell at the top of notebooks, or bring it up to date (idempotent).

Usage: python scripts/colab_setup_cell.py [--check] [book/part1/x.ipynb ...]
(default: every notebook in _toc.yml). The cell, tagged `remove-cell` (the book hides it), does
something only in Colab ("google.colab" imported) or when COURSE_SETUP_FROM names a local
checkout (tests/test_colab.py): it clones the course from _config.yml's repository (once) and
installs `helpers` from it, with no pins of the packages Colab already has. Everywhere else
(a checkout, Binder, nbval, the book build) it does nothing. `--check` changes nothing and
exits 1 listing the notebooks whose cell is missing or stale.
"""
import argparse
import pathlib
import sys

import nbformat
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from book_files import toc_notebooks  # noqa: E402

CELL_ID = "course-setup"
TAGS = ["remove-cell"]

SOURCE = '''\
# Colab: fetch the course and install its `helpers` package (nothing is
# pinned: Colab's own torch stays). Elsewhere this cell does nothing.
# Written by scripts/colab_setup_cell.py: edit that script, not this cell.
import os
import subprocess
import sys

COURSE_REPO = "{url}"
COURSE_BRANCH = "{branch}"
if "google.colab" in sys.modules or os.environ.get("COURSE_SETUP_FROM"):
    course = os.environ.get("COURSE_SETUP_FROM") or "/content/course"
    if not os.path.isdir(course):
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch",
                        COURSE_BRANCH, COURSE_REPO, course], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    "-e", course], check=True)
    sys.path.insert(0, course)  # this kernel; new processes read PYTHONPATH
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (course, os.environ.get("PYTHONPATH")) if p)
'''


def cell_source(config=None):
    """The set-up cell's code for the repository and branch of _config.yml."""
    config = config or yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = config["repository"]
    return SOURCE.format(url=repo["url"].rstrip("/"), branch=repo.get("branch", "main"))


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
