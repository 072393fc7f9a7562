"""A chapter that prints a helpers function's source (`inspect.getsource`) stores what helpers
ships: a stored listing older than the code misleads the reader of the rendered book, who
cannot run the cell. Fails when helpers changes and the chapter was not re-stored."""
import contextlib
import inspect
import io
import re

import nbformat
import pytest
from book_files import ROOT, toc_notebooks

import helpers

CALL = re.compile(r"getsource\(([\w.]+)\)")


def _shipped(expr):
    """The helpers object a cell's `getsource(expr)` prints, or None (torch's own, or a name
    the notebook defines itself)."""
    head, *rest = expr.split(".")
    obj = helpers if head == "helpers" else getattr(helpers, head, None)
    for part in rest:
        obj = getattr(obj, part, None)
    module = inspect.getmodule(obj) if obj is not None else None
    return obj if module and module.__name__.startswith("helpers") else None


def _listings(path):
    """(cell index, what it lists, what it prints now, what it stored) for each cell that
    prints a helpers listing and needs nothing but helpers and inspect to run again."""
    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
        exprs = CALL.findall(cell.source) if cell.cell_type == "code" else []
        if not any(_shipped(e) is not None for e in exprs):
            continue
        stored = "".join(o.get("text", "") for o in cell.get("outputs", [])
                         if o.get("name") == "stdout")
        now = io.StringIO()
        try:
            with contextlib.redirect_stdout(now):
                exec(cell.source, {"helpers": helpers, "inspect": inspect})
        except NameError:   # it uses a name an earlier cell defines: not re-run here
            continue
        yield i, ", ".join(exprs), now.getvalue(), stored


NOTEBOOKS = toc_notebooks()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_printed_source_is_what_helpers_ships(path):
    stale = [f"cell {i} ({expr})" for i, expr, now, stored in _listings(path)
             if now != stored]
    assert not stale, (f"{path.relative_to(ROOT)} stores an old listing in {stale}: "
                       f"re-store it (make outputs NB={path.relative_to(ROOT)})")


def test_the_listings_are_found():
    """The chapters' listings are still found and re-run (a renamed call, or a cell that
    came to need an earlier cell's names, would make the test above pass on nothing)."""
    found = {expr for p in NOTEBOOKS for _, expr, _, _ in _listings(p)}
    assert {"helpers.exact_counts", "helpers.tp_plan", "helpers.MoE.forward"} <= found, found
