"""Execute notebooks in place (default: every notebook in _toc.yml), storing their outputs.

Usage: python scripts/execute_notebooks.py [book/part2/scratch.ipynb ...]   (`make outputs`)
Runs at the CPU default size: refuses COURSE_QUICK (the stored outputs are what the published
pages show, and what nbval compares on cells tagged `nbval-check-output`). Stderr streams are
dropped (warnings and progress bars are not part of the lesson); a notebook with an error output
in a cell not tagged `raises-exception` fails and is left unchanged. Written atomically.
"""
import os
import pathlib
import sys

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from book_files import toc_notebooks  # noqa: E402


def clean(nb):
    """Drop stderr streams; return the error outputs of cells not meant to raise, one line each."""
    errors = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        cell.outputs = [o for o in cell.get("outputs", [])
                        if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
        if "raises-exception" in cell.get("metadata", {}).get("tags", []):
            continue
        for o in cell.outputs:
            if o.get("output_type") == "error":
                errors.append(f"cell {i} ({cell.get('id', '?')}): {o.get('ename')}: "
                              f"{o.get('evalue', '')[:200]}")
    return errors


def execute(path):
    path = pathlib.Path(path)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=1800, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = clean(nb)
    if errors:
        raise SystemExit(f"{path}: stored outputs not updated, errors:\n  " + "\n  ".join(errors))
    import helpers   # the one atomic writer: a kill mid-write keeps the old notebook whole
    helpers.atomic_write(path, lambda f: nbformat.write(nb, f), mode="w")
    print("executed", path)


def main(paths):
    if os.environ.get("COURSE_QUICK", "").strip().lower() not in ("", "0", "false", "no"):
        raise SystemExit("COURSE_QUICK is set: stored outputs come from the CPU default size. "
                         "Unset it (`make outputs` does).")
    for path in paths or toc_notebooks():
        execute(path)


if __name__ == "__main__":
    main(sys.argv[1:])
