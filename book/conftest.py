"""nbval over the chapters: keep what each notebook printed in this run.

With `--executed-into DIR`, each notebook nbval ran is written under DIR
(same relative path), its code cells holding this run's outputs instead of
the stored ones. `make test-book-fresh` builds the book from those copies,
so a fresh run that would break the book (an output Sphinx cannot place, a
duplicated figure label) fails CI, as it would fail `make book`.
"""
import copy
import pathlib

import nbformat


def pytest_addoption(parser):
    parser.addoption(
        "--executed-into", default=None, metavar="DIR",
        help="write each notebook nbval ran, with this run's outputs, "
             "under DIR")


def pytest_runtest_teardown(item, nextitem):
    into = item.config.getoption("--executed-into")
    if not into or not hasattr(item, "test_outputs"):
        return
    fresh = getattr(item.parent, "_fresh_outputs", {})
    item.parent._fresh_outputs = fresh
    if item.test_outputs is not None:   # None: skipped (nbval-skip)
        fresh[item.cell_num] = copy.deepcopy(item.test_outputs)
    if nextitem is None or nextitem.parent is not item.parent:
        _write(item.parent, fresh, pathlib.Path(into))


def _silenced(source):
    """True when the cell's last line ends with `;`: IPython shows no result
    for it where the book executes it, but nbval records one all the same
    (seen here: a figure cell's `<Axes ...>` beside its picture)."""
    lines = [ln.split("#", 1)[0].rstrip()
             for ln in source.rstrip().splitlines()]
    return bool(lines) and lines[-1].endswith(";")


def _write(nbfile, fresh, into):
    """The notebook with this run's outputs, written atomically at
    into/<its path relative to the rootdir>."""
    nb = nbformat.read(str(nbfile.fspath), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        if i in fresh:
            cell.outputs = [nbformat.from_dict(o) for o in fresh[i]
                            if not (o.get("output_type") == "execute_result"
                                    and _silenced(cell.source))]
    path = pathlib.Path(str(nbfile.fspath)).resolve()
    out = into / path.relative_to(nbfile.config.rootpath)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    nbformat.write(nb, str(tmp))
    tmp.replace(out)
