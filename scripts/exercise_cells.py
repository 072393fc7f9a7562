"""The course's exercise conventions in a chapter notebook (solution, check and prose cells,
exercise headings), and those tags as nbgrader's cell metadata: the student edition's source."""
import ast
import copy
import pathlib
import re
import sys

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from book_files import toc_entries  # noqa: E402

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = "raise NotImplementedError()"
DROP_TAGS = {"nbval-check-output", "hide-input"}   # the stub is the student's to see and edit
ANSWER_POINTS = 1   # an open-ended answer, graded by hand, weighs what a check cell does
# Appended to every check cell of the nbgrader source, hidden from the handout and restored by
# `nbgrader autograde`: the check runs again from a fresh import of the course, loaded by path,
# so a cell that patched helpers.checks (or the harness) cannot score (checks/_core/fresh.py).
REGRADE = """
### BEGIN HIDDEN TESTS
import importlib.util as _u
_s = _u.spec_from_file_location("_course_regrade", _u.find_spec("helpers")
                                .submodule_search_locations[0] + "/checks/_core/fresh.py")
_m = _u.module_from_spec(_s)
_s.loader.exec_module(_m)
{calls}
### END HIDDEN TESTS"""
CHECK_CALL = re.compile(r"^\s*(check_\w+)\((\w+)\)", re.M)
EXERCISE = re.compile(r"^###\s+Exercise\s+(\d+)\s*[:.]?\s*(.*?)\s*$", re.M)


class EditionError(ValueError):
    """A notebook does not follow the exercise conventions (CONTRIBUTING.md)."""


def chapters():
    """The chapter notebooks of _toc.yml, in its order. An entry with no file yet (a chapter
    being written) is left out with a warning; tests/test_book.py fails for it."""
    found = []
    for entry in toc_entries():
        path = ROOT / (entry + ".ipynb")
        if path.exists():
            found.append(path)
        elif not (ROOT / (entry + ".md")).exists():
            print(f"warning: _toc.yml lists {entry}, which does not exist yet", file=sys.stderr)
    return found


def tags(cell):
    return cell.get("metadata", {}).get("tags", [])


def is_solution(cell):
    return "solution" in tags(cell)


def is_prose(cell):
    """A code cell that displays prose (helpers.say, written by scripts/reader_markup.py): a
    paragraph with this run's numbers, read as the markdown cell it replaces."""
    return cell["cell_type"] == "code" and bool(
        cell.get("metadata", {}).get("course", {}).get("prose"))


def is_text(cell):
    return cell["cell_type"] == "markdown" or is_prose(cell)


def is_check(cell):
    return cell["cell_type"] == "code" and "check" in tags(cell)


def source(cell):
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def _grade_id(kind, cell, index, taken):
    """A stable id for the gradebook: the function the cell defines (solution) or the check it
    calls (check), else the cell's position."""
    name = None
    try:
        tree = ast.parse(source(cell))
        if kind == "solution":
            name = next((n.name for n in tree.body
                         if isinstance(n, (ast.FunctionDef, ast.ClassDef))), None)
        else:
            name = next((n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)
                         and isinstance(n.func, ast.Name) and n.func.id.startswith("check")), None)
    except SyntaxError:
        pass
    grade_id = f"{kind}-{name}" if name else f"{kind}-cell{index}"
    while grade_id in taken:
        grade_id += "-2"
    taken.add(grade_id)
    return grade_id


def open_ended(nb):
    """{cell index: exercise number} of the first worked answer (a solution-tagged prose cell)
    of each exercise, checked or not: where the handout gets an answer cell for the teacher to
    grade by hand (a checked exercise may ask a written question too)."""
    first, current = {}, None
    for index, cell in enumerate(nb.cells):
        if is_text(cell) and not is_solution(cell):
            heads = EXERCISE.findall(source(cell))
            if heads:
                current = int(heads[-1][0])
        elif current is not None and is_solution(cell) and is_text(cell):
            first.setdefault(current, index)
    return {index: number for number, index in first.items()}


def answer_cell(number):
    """A markdown cell nbgrader hands out as "YOUR ANSWER HERE" and grades by hand (formgrader)."""
    cell = nbformat.v4.new_markdown_cell(f"Your answer to Exercise {number}.")
    cell.metadata["nbgrader"] = dict(
        solution=True, grade=True, locked=False, task=False, points=ANSWER_POINTS,
        schema_version=3, grade_id=f"answer-exercise{number}")
    return cell


def nbgrader_source(nb, name="notebook"):
    """A copy of `nb` with the course's tags turned into nbgrader's cell metadata."""
    nb = copy.deepcopy(nb)
    cells, taken, answers = [], set(), open_ended(nb)
    for index, cell in enumerate(nb.cells):
        if is_solution(cell) and is_text(cell):
            if index in answers:
                cells.append(answer_cell(answers[index]))
            continue
        cell.metadata.pop("nbgrader", None)
        if is_solution(cell):
            if cell.cell_type != "code":
                raise EditionError(f"{name}: cell {index} is tagged `solution` but is a "
                                   f"{cell.cell_type} cell")
            text = source(cell)
            if BEGIN not in text or END not in text:
                raise EditionError(f"{name}: solution cell {index} has no `{BEGIN}` / `{END}` "
                                   "markers, so the whole cell would be replaced: put the markers "
                                   "around the function body")
            cell.metadata["nbgrader"] = dict(
                solution=True, grade=False, locked=False, task=False, schema_version=3,
                grade_id=_grade_id("solution", cell, index, taken))
        elif is_check(cell):
            calls = CHECK_CALL.findall(source(cell))
            if calls:
                cell.source = source(cell).rstrip() + REGRADE.format(calls="\n".join(
                    f"_m.regrade({name!r}, {answer})" for name, answer in calls))
            cell.metadata["nbgrader"] = dict(
                solution=False, grade=True, locked=True, task=False, points=1, schema_version=3,
                grade_id=_grade_id("check", cell, index, taken))
        elif BEGIN in source(cell):
            raise EditionError(f"{name}: cell {index} has `{BEGIN}` but is not tagged `solution`: "
                               "its solution would be handed out")
        for key in ("execution", "ExecuteTime"):   # run timestamps of the book's last execution
            cell.metadata.pop(key, None)
        kept = [t for t in tags(cell) if t not in DROP_TAGS]
        if kept:
            cell.metadata["tags"] = kept
        else:
            cell.metadata.pop("tags", None)
        cells.append(cell)
    nb.cells = cells
    return nb
