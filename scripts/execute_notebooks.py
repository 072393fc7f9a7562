"""Execute notebooks in place (default: every notebook in _toc.yml), storing their outputs.

Usage: COURSE_QUICK=1 python scripts/execute_notebooks.py [book/part2/scratch.ipynb ...]
The stored outputs are what nbval compares on cells tagged `nbval-check-output`.
"""
import pathlib
import sys

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from book_files import toc_notebooks  # noqa: E402


def main(paths):
    for path in paths or toc_notebooks():
        path = pathlib.Path(path)
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=1800, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        nbformat.write(nb, path)
        print("executed", path)


if __name__ == "__main__":
    main(sys.argv[1:])
