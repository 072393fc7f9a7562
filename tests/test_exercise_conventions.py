"""Every chapter follows the exercise conventions (CONTRIBUTING.md): it has exercises, nothing
after an exercise uses its solution, solution cells are marked inside a function, check cells
store a pass, and every check of helpers.checks is called from a notebook."""
import ast
import re
import sys

import pytest
from book_files import ROOT
from nbformat.v4 import new_code_cell
from test_student import read, sample_notebook

import helpers.checks

sys.path.insert(0, str(ROOT / "scripts"))
import exercise_cells as ec
import teachers_guide as tg

# the chapters in _toc.yml whose notebook exists (tests/test_book.py fails for a missing one)
CHAPTERS = ec.chapters()
IDS = [str(p.relative_to(ROOT)) for p in CHAPTERS]


# --- the chapters follow the exercise conventions (CONTRIBUTING.md) -------------------------------
@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_chapter_has_exercises(path):
    nb = read(path)
    text = "\n".join(ec.source(c) for c in nb.cells if ec.is_text(c))
    assert re.search(r"^## Exercises\s*$", text, re.M), "the chapter needs a `## Exercises` section"
    found = tg.exercises(path)
    assert len(found) >= 3, f"{len(found)} `### Exercise N: title` headings; at least three"
    for ex in found:
        assert ex["level"] and ex["minutes"], (
            f"Exercise {ex['number']} ({ex['title']}) must state its level (warm-up, core, "
            "open-ended) and its time (e.g. '10 min') in its heading's cell")
    assert any(ec.is_check(c) for c in nb.cells), "at least one exercise with a check cell"


def _names(tree, kinds):
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, kinds)}


def _defined(tree):
    """Names a cell binds at its top level: functions, classes, assignments, imports."""
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            out |= _names(node, ast.Store)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def _catches_stub(tree):
    """The cell runs the reader's answer inside `try: ... except NotImplementedError:`."""
    return any(isinstance(h.type, ast.Name) and h.type.id == "NotImplementedError"
               for n in ast.walk(tree) if isinstance(n, ast.Try) for h in n.handlers)


def uses_of_solutions(nb):
    """(cell index, names, solution cells) for each later cell other than a check that reads a
    name a solution cell binds: in the student edition that solution is a stub that raises."""
    solved, found = {}, []   # name -> the solution cell that binds it
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or ec.is_prose(cell):
            continue
        try:
            tree = ast.parse("\n".join(line for line in ec.source(cell).splitlines()
                                       if not line.lstrip().startswith(("%", "!"))))
        except SyntaxError:
            continue
        if ec.is_solution(cell):
            solved.update(dict.fromkeys(_defined(tree), i))
            continue
        if ec.is_check(cell) or _catches_stub(tree):
            continue
        used = _names(tree, ast.Load) & set(solved)
        if used:
            found.append((i, sorted(used), sorted({solved[n] for n in used})))
        for name in _defined(tree):
            solved.pop(name, None)   # rebound here: later cells read this cell's value
    return found


def test_a_cell_that_uses_a_solution_is_found():
    nb = sample_notebook()
    assert uses_of_solutions(nb) == []
    nb.cells.append(new_code_cell("print(matmul_flops(3))"))
    nb.cells.append(new_code_cell("try:\n    matmul_flops(3)\nexcept NotImplementedError:\n"
                                  "    pass"))
    assert uses_of_solutions(nb) == [(len(nb.cells) - 2, ["matmul_flops"], [4])]


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_nothing_after_an_exercise_uses_its_solution(path):
    """A later cell other than a check that reads what a solution binds fails in the student
    edition (CONTRIBUTING, Exercises item 5). The cells that stay are the book's own, which
    nbval runs (make test-notebooks); `make test-student` runs the whole student edition."""
    found = uses_of_solutions(read(path))
    assert not found, [f"cell {i} uses {names} from solution cell(s) {cells}: the student "
                       "edition's stub raises there; compute it in the cell, or catch "
                       "NotImplementedError" for i, names, cells in found]


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_solution_cells_have_markers_inside_a_function(path):
    for i, cell in enumerate(read(path).cells):
        if not (ec.is_solution(cell) and cell.cell_type == "code" and not ec.is_prose(cell)):
            continue
        text = ec.source(cell)
        begin = [l for l in text.splitlines() if ec.BEGIN in l]
        end = [l for l in text.splitlines() if ec.END in l]
        assert len(begin) == len(end) >= 1, f"cell {i}: needs {ec.BEGIN} ... {ec.END}"
        assert text.index(ec.BEGIN) < text.index(ec.END), f"cell {i}: markers in the wrong order"
        assert all(l.startswith((" ", "\t")) for l in begin), \
            f"cell {i}: the markers go inside the function body, so the stub keeps the `def`"
        assert any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in ast.parse(text).body)
        assert "hide-input" in ec.tags(cell), f"cell {i}: tag it hide-input so the book folds it"


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_check_cells_store_a_pass(path):
    """nbval compares a check cell's stored output: stored as a pass, the book's test run proves
    that the reference solution passes its check."""
    for i, cell in enumerate(read(path).cells):
        if not ec.is_check(cell):
            continue
        assert "nbval-check-output" in ec.tags(cell), f"check cell {i}: tag it nbval-check-output"
        out = "".join(o.get("text", "") for o in cell.get("outputs", []))
        assert "✔ passed" in out and "failed" not in out and "not done" not in out, (
            f"check cell {i} stores {out!r}: the reference solution must pass "
            "(make outputs NB=...)")


def test_every_check_is_called_from_a_notebook():
    called = set()
    for path in CHAPTERS:
        for cell in read(path).cells:
            if ec.is_check(cell):
                called |= set(re.findall(r"\b(check_\w+)\s*\(", ec.source(cell)))
    listed = [str(p.relative_to(ROOT)) for p in CHAPTERS]
    missing = []
    for name in sorted(dir(helpers.checks)):
        if not (name.startswith("check_") and callable(getattr(helpers.checks, name))):
            continue
        module = getattr(helpers.checks, name).__module__.rsplit(".", 1)[-1]
        # a check module is named after its chapter: helpers/checks/<module>.py, <module>.ipynb
        chapter = next((ROOT / "book").rglob(f"{module}.ipynb"), None)
        in_toc = chapter is not None and str(chapter.relative_to(ROOT)) in listed
        if (in_toc or chapter is None) and name not in called:
            missing.append(f"{name} (helpers/checks/{module}.py)")
    assert not missing, f"no check cell calls {missing}: add its exercise or remove the check"
