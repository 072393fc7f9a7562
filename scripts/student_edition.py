"""Build the student edition of the course: `make student` (or run this script).

    python scripts/student_edition.py [--out student] [--course _build/nbgrader] [NOTEBOOK ...]

For every chapter notebook in _toc.yml (or the ones given) it writes `<out>/<path under book/>`:
solution code replaced by `raise NotImplementedError()`, solution prose removed, outputs cleared,
every check cell kept. The work is nbgrader's (`nbgrader generate_assignment`); this script only
turns the course's cell tags into nbgrader's cell metadata first:

    code cell tagged `solution`      -> nbgrader solution cell (the `### BEGIN/END SOLUTION`
                                        region becomes the stub)
    markdown cell tagged `solution`  -> removed (a worked answer, the book folds it in a dropdown);
                                        so is a prose cell (helpers.say) tagged `solution`. The
                                        exercise (checked or not) gets an answer cell in its
                                        place: nbgrader's manually graded answer, 1 point
    prose cell (helpers.say)         -> keeps its stored text: the handout reads whole before
                                        anything runs (nbgrader clears every other output)
    code cell tagged `check`         -> nbgrader autograder test cell, 1 point, locked
    tag `nbval-check-output`         -> removed (outputs are cleared, nothing left to compare)

Each chapter becomes one nbgrader assignment (`gpus`, `part2_scratch`, ...) in an nbgrader course
folder (`--course`, default `_build/nbgrader`): `source/` holds the tagged notebooks, `release/`
nbgrader's student versions and `gradebook.db` the test cells, so the teacher can go on with
`nbgrader collect` / `nbgrader autograde` / `nbgrader generate_feedback` in that folder (see
book/teachers.md).
"""
import argparse
import ast
import copy
import logging
import os
import pathlib
import re
import shutil
import sys

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import chapter_runs  # noqa: E402
from book_files import toc_entries  # noqa: E402

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = "raise NotImplementedError()"
MANIFEST = ".student-edition"   # what a build wrote into --out: all it may delete later
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


NBGRADER_CONFIG = f"""\
# Written by scripts/student_edition.py: run nbgrader's commands in this folder (book/teachers.md).
c = get_config()  # noqa: F821
import os
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "multigpu-course"
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\n{STUB}"}}
c.Execute.timeout = 1800   # per cell, as the book build allows; quick mode needs seconds
# an untouched check cell gets its hidden lines back without a checksum warning; an edited one
# is still reported (released_checksums.py, beside this file)
import sys
sys.path.insert(0, c.CourseDirectory.root)
import released_checksums
c.Autograde.sanitize_preprocessors = released_checksums.sanitize_preprocessors()
"""
RELEASED_CHECKSUMS = "released_checksums.py"   # copied into the course folder on every build


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


def _relative(path):
    """A chapter's path under book/ (a notebook elsewhere, e.g. a test's, keeps its name)."""
    path = pathlib.Path(path).resolve()
    try:
        return path.relative_to(ROOT / "book")
    except ValueError:
        return pathlib.Path(path.name)


def assignment_id(path):
    """`book/part2/scratch.ipynb` -> `part2_scratch` (nbgrader ids are plain names)."""
    return "_".join(_relative(path).with_suffix("").parts)


def student_path(path, out):
    """`book/part2/scratch.ipynb` -> `<out>/part2/scratch.ipynb`."""
    return pathlib.Path(out) / _relative(path)


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


# --- the exercise table of the teacher's guide ------------------------------------------------
EXERCISE = re.compile(r"^###\s+Exercise\s+(\d+)\s*[:.]?\s*(.*?)\s*$", re.M)
LEVEL = re.compile(r"\b(warm[- ]?up|core|open[- ]ended|stretch|challenge)\b", re.I)
TIME = re.compile(r"(\d+)(?:\s*(?:-|–|to)\s*(\d+))?\s*(min(?:ute)?s?|h(?:ours?)?)\b", re.I)
TABLE_BEGIN, TABLE_END = "<!-- exercise-table: begin -->", "<!-- exercise-table: end -->"
TEACHERS = ROOT / "book" / "teachers.md"


def chapter_title(nb, path):
    for cell in nb.cells:
        m = is_text(cell) and re.search(r"^#\s+(.+)$", source(cell), re.M)
        if m:
            return m.group(1).strip()
    return pathlib.Path(path).stem


def exercises(path):
    """The exercises of a chapter notebook, in order: dicts with number, title, level, minutes
    (the upper bound of the time the heading's cell states), check (the check function(s) its
    check cells call, or "worked answer")."""
    nb = nbformat.read(path, as_version=4)
    found = []
    for index, cell in enumerate(nb.cells):
        text = source(cell)
        if is_text(cell) and not is_solution(cell):
            heads = list(EXERCISE.finditer(text))
            for i, m in enumerate(heads):
                part = text[m.start():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
                after = nb.cells[index + 1] if index + 1 < len(nb.cells) else None
                if i == len(heads) - 1 and after is not None and is_prose(after):
                    part += "\n" + source(after)   # reader_markup put the text after a heading
                level, time = LEVEL.search(part), TIME.search(part)
                minutes = None
                if time:
                    minutes = int(time.group(2) or time.group(1))
                    minutes *= 60 if time.group(3).lower().startswith("h") else 1
                title = re.sub(r"\s*[(\[][^)\]]*(?:min|warm|core|open)[^)\]]*[)\]]", "",
                               m.group(2), flags=re.I).strip(" .:*_")
                found.append(dict(number=int(m.group(1)), title=title.replace("|", "\\|"),
                                  level=level.group(1).lower().replace(" ", "-") if level else None,
                                  minutes=minutes, checks=[], worked=False))
        elif found and is_check(cell):
            found[-1]["checks"] += re.findall(r"\b(check_\w+)\s*\(", text)
        elif found and is_solution(cell) and is_text(cell):
            found[-1]["worked"] = True
    for ex in found:
        checks = ", ".join(f"`{c}`" for c in ex.pop("checks"))
        ex["written"] = ex.pop("worked")      # a worked answer: the handout's answer cell
        ex["check"] = (checks + (" and a worked answer" if ex["written"] else "") if checks else
                       "worked answer" if ex["written"] else "—")
    return found


def exercise_table(notebooks=None):
    """The Markdown table of every chapter's exercises, for book/teachers.md."""
    rows, total = [], 0
    for path in chapters() if notebooks is None else notebooks:
        nb = nbformat.read(path, as_version=4)
        title = chapter_title(nb, path)
        for ex in exercises(path):
            total += ex["minutes"] or 0
            minutes = f"{ex['minutes']} min" if ex["minutes"] else "?"
            rows.append(f"| {title} | {ex['number']}. {ex['title']} | {ex['level'] or '?'} | "
                        f"{minutes} | {ex['check']} |")
            title = ""   # the chapter's name once, on its first row
    head = ["| Chapter | Exercise | Level | Time | Checked by |",
            "|---|---|---|---|---|"]
    summary = (f"\n\nIn all: {len(rows)} exercises, about {total / 60:.1f} hours."
               if rows else "")
    return "\n".join(head + rows) + summary


CHECKS_BEGIN, CHECKS_END = "<!-- checks-table: begin -->", "<!-- checks-table: end -->"


def checks_table():
    """The Markdown list of what every check observes, from the checks' own declarations
    (@check in helpers/checks): complete by construction. A list, not a table: on a phone a
    three-column table squeezed the long check names into a letter column."""
    import helpers.checks
    from helpers.checks import REGISTRY
    rows = []
    for name in sorted(n for n in dir(helpers.checks) if n.startswith("check_")):
        info = REGISTRY.get(name)
        if info is None:
            rows.append(f"- **`{name}`**: not yet on the harness: judges what it returns and "
                        "what it logs.")
            continue
        observes = "; ".join(info.observes)
        refs = ", ".join(f"`helpers.{r}`" for r in info.references if not r.startswith("torch."))
        torch_refs = ", ".join(f"`{r}`" for r in info.references if r.startswith("torch."))
        refused = " and ".join(([f"the course's own {refs}"] if refs else [])
                               + ([f"torch's {torch_refs}"] if torch_refs else []))
        rows.append(f"- **`{name}`** observes {observes}." + (
            f" It refuses {refused}." if refused else ""))
    return "\n".join(rows)


# --- the grading time of the teacher's guide ---------------------------------------------------
GRADING_BEGIN, GRADING_END = "<!-- grading-time: begin -->", "<!-- grading-time: end -->"
GRADING_RECORD = ROOT / "book" / "_ext" / "grading_times.json"   # scripts/time_autograde.py
GRADING_FIELDS = ("seconds", "submissions", "machine", "date", "command", "by")


def grading_record(path=None):
    """{docname: entry} of the measured autograde times (scripts/time_autograde.py); {} when
    none is recorded yet."""
    import json
    path = pathlib.Path(path or GRADING_RECORD)
    if not path.exists():
        return {}
    record = json.loads(path.read_text())
    for doc, entry in record.items():
        missing = [f for f in GRADING_FIELDS if f not in entry]
        if missing:
            raise ValueError(f"{path}: {doc}: missing {missing}; rewrite it with "
                             "scripts/time_autograde.py")
    return record


def _where_when(entry):
    """'2 CPU cores, no GPU, 2026-12-04', and what other work kept busy when the machine was
    shared (such a run is slower than it would be alone)."""
    text = f"{entry['machine']}, {entry['date']}"
    if chapter_runs.busy(entry) and entry.get("others") is not None:
        text += f", busy (other work: {entry['others']:.1f} cores)"
    elif chapter_runs.busy(entry):
        text += f", busy (load {entry['load']:g})"
    return text


def grading_time(doc, record=None, runs=None):
    """(time, how it is known) of grading one submission of chapter `doc`: measured by
    scripts/time_autograde.py where it has been, else the chapter's quick-mode run
    (book/_ext/runs.json), an estimate; ("?", why) when neither is recorded."""
    record = grading_record() if record is None else record
    runs = chapter_runs.load() if runs is None else runs
    if doc in record:
        entry = record[doc]
        n = entry["submissions"]
        return (chapter_runs.fmt_seconds(entry["seconds"]),
                f"measured: `{entry['command']}` on {n} solved submission{'s' if n != 1 else ''}, "
                f"{_where_when(entry)}")
    quick = chapter_runs.run_of(runs, doc, "quick")
    if quick:
        return (f"about {chapter_runs.fmt_seconds(quick['seconds'])}",
                f"estimate: the quick-mode run, {_where_when(quick)}")
    return "?", "no quick-mode run recorded"


def grading_table(notebooks=None, record=None, runs=None):
    """The Markdown table of the time `nbgrader autograde` takes per submission, per chapter."""
    rows = []
    for path in chapters() if notebooks is None else notebooks:
        nb = nbformat.read(path, as_version=4)
        doc = pathlib.Path(path).resolve().relative_to(ROOT).with_suffix("").as_posix()
        time, how = grading_time(doc, record, runs)
        rows.append(f"| {chapter_title(nb, path)} | {time} | {how} |")
    return "\n".join(["| Chapter | Per submission | How it is known |", "|---|---|---|"] + rows)


def _between(text, begin, end, table):
    b, e = text.index(begin) + len(begin), text.index(end)
    return text[:b] + "\n" + table + "\n" + text[e:]


def update_teachers_guide(path=TEACHERS, notebooks=None):
    """Rewrite the tables between the exercise-table, checks-table and grading-time markers of
    the teacher's guide; return whether the file changed."""
    text = pathlib.Path(path).read_text()
    new = _between(text, TABLE_BEGIN, TABLE_END, exercise_table(notebooks))
    new = _between(new, CHECKS_BEGIN, CHECKS_END, checks_table())
    new = _between(new, GRADING_BEGIN, GRADING_END, grading_table(notebooks))
    if new != text:
        sys.path.insert(0, str(ROOT))
        from helpers import atomic_write  # a kill leaves the old guide whole
        atomic_write(pathlib.Path(path), lambda f: f.write(new), mode="w")
    return new != text


def _quiet_nbgrader():
    for name in ("NbGraderAPI", "GenerateAssignment", "traitlets", "nbgrader"):
        logging.getLogger(name).setLevel(logging.ERROR)


def build(notebooks=None, out=ROOT / "student", course=ROOT / "_build" / "nbgrader", quiet=False,
          gradebook=True):
    """Write the student edition of `notebooks` (default: every chapter in _toc.yml) into `out`;
    return the paths written. `gradebook=False` skips nbgrader's database (faster; nothing to
    autograde against), as `nbgrader generate_assignment --no-db` does."""
    from nbgrader.apps import NbGraderAPI  # imported here: ~1 s, and only this command needs it
    from traitlets.config import Config

    # nbgrader runs the `alembic` command (its gradebook's migrations): find it beside this Python
    # even when the venv is not activated (`.venv/bin/python scripts/student_edition.py`)
    os.environ["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent),
                                          os.environ.get("PATH", "")])
    notebooks = [pathlib.Path(p).resolve()
                 for p in (chapters() if notebooks is None else notebooks)]
    out, course = pathlib.Path(out).resolve(), pathlib.Path(course).resolve()
    config = Config()
    config.CourseDirectory.root = str(course)
    config.CourseDirectory.course_id = "multigpu-course"
    config.ClearSolutions.code_stub = {"python": f"# YOUR CODE HERE\n{STUB}"}
    if not gradebook:
        config.GenerateAssignment.no_database = True
        config.SaveCells.enabled = False
    course.mkdir(parents=True, exist_ok=True)
    config_file = course / "nbgrader_config.py"
    if not config_file.exists():   # so `nbgrader ...` works inside the folder
        config_file.write_text(NBGRADER_CONFIG)
    elif "released_checksums" not in config_file.read_text():   # a teacher's (or an older) one
        print(f"warning: {config_file} does not load {RELEASED_CHECKSUMS}, so `nbgrader autograde` "
              "will report every check cell as changed: add the last four lines of "
              "student_edition.NBGRADER_CONFIG to it (book/teachers.md)", file=sys.stderr)
    shutil.copyfile(ROOT / "scripts" / RELEASED_CHECKSUMS, course / RELEASED_CHECKSUMS)
    api = NbGraderAPI(config=config)
    _quiet_nbgrader()
    written = []
    for path in notebooks:
        aid = assignment_id(path)
        nb = nbformat.read(path, as_version=4)
        src_dir = course / "source" / aid
        if src_dir.exists():
            shutil.rmtree(src_dir)
        src_dir.mkdir(parents=True)
        nbformat.write(nbgrader_source(nb, name=str(_relative(path))), src_dir / path.name)
        result = api.generate_assignment(aid, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader generate_assignment {aid} failed:\n"
                               f"{result.get('error', '')}\n{result.get('log', '')}")
        released = course / "release" / aid / path.name
        _keep_prose(nb, released)
        target = student_path(path, out)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(released, target)
        written.append(target)
        if not quiet:
            print(f"{_relative(path)} -> {target}  (nbgrader assignment {aid!r})")
    return written


def _keep_prose(original, released):
    """Put the stored text of the prose cells (helpers.say) back into the released notebook:
    nbgrader clears every output, and these outputs are the chapter's paragraphs."""
    texts = [c.get("outputs", []) for c in original.cells
             if is_prose(c) and not is_solution(c)]
    nb = nbformat.read(released, as_version=4)
    prose = [c for c in nb.cells if is_prose(c)]
    if len(prose) != len(texts):
        raise EditionError(f"{released.name}: {len(prose)} prose cells after nbgrader, "
                           f"{len(texts)} before")
    for cell, outputs in zip(prose, texts):
        cell.outputs = [o for o in copy.deepcopy(outputs) if o.get("output_type") == "display_data"]
    sys.path.insert(0, str(ROOT))
    from helpers import atomic_write
    atomic_write(released, lambda f: nbformat.write(nb, f), mode="w")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="chapter notebooks (default: all in _toc.yml)")
    parser.add_argument("--out", default=str(ROOT / "student"), help="where the handout goes")
    parser.add_argument("--course", default=str(ROOT / "_build" / "nbgrader"),
                        help="the nbgrader course folder (source/, release/, gradebook.db)")
    parser.add_argument("--update-teachers-guide", action="store_true",
                        help="only rewrite book/teachers.md's exercise table from the notebooks")
    args = parser.parse_args(argv)
    if args.update_teachers_guide:
        changed = update_teachers_guide(notebooks=args.notebooks or None)
        print(f"{TEACHERS.relative_to(ROOT)}: " + ("table updated" if changed else "up to date"))
        return
    out = pathlib.Path(args.out)
    try:
        notebooks = _given(args.notebooks)
        stale = _stale(out, notebooks)
    except ValueError as err:
        print(f"student_edition.py: {err}", file=sys.stderr)
        sys.exit(2)
    for path in stale:   # a full build leaves no stale chapter behind (only what we wrote)
        path.unlink()
    written = build(notebooks, out, args.course)
    _record(out, written)
    print(f"student edition: {len(written)} notebook(s) in {out}/; "
          f"nbgrader course in {args.course}/")


def _given(notebooks):
    """The chapters asked for (None: all), each an existing notebook, checked before any work."""
    for name in notebooks:
        path = pathlib.Path(name)
        if path.suffix != ".ipynb" or not path.is_file():
            raise ValueError(f"{name} is not a notebook file: give chapter notebooks such as "
                             "book/part2/scratch.ipynb, or none for every chapter")
    return notebooks or None


def _written_before(out):
    """The notebooks an earlier build wrote into `out` (its manifest), as paths."""
    manifest = out / MANIFEST
    if not manifest.is_file():
        return set()
    return {out / line for line in manifest.read_text().splitlines() if line.strip()}


def _stale(out, notebooks):
    """What a build may delete or overwrite in `out`: only notebooks an earlier build of this
    script wrote (its manifest). Refuses, before any work, an `out` that is a file or that holds
    other notebooks where this build would write or clean: a teacher's own are never lost."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: give a folder (it is created if missing)")
    ours = _written_before(out)
    targets = [student_path(p, out) for p in (notebooks or chapters())]
    present = set(out.rglob("*.ipynb")) if (out.is_dir() and not notebooks) else \
        {t for t in targets if t.exists()}
    foreign = sorted(str(p.relative_to(out)) for p in present - ours)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3
                                          else "")
        raise ValueError(f"--out {out} holds notebooks this script did not write ({shown}): "
                         "give an empty or new folder, or move them out first")
    return sorted(present) if not notebooks else []


def _record(out, written):
    """Add what this build wrote to `out`'s manifest (written atomically)."""
    sys.path.insert(0, str(ROOT))
    from helpers import atomic_write
    names = {str(p.relative_to(out)) for p in _written_before(out) if p.exists()}
    names |= {str(pathlib.Path(p).resolve().relative_to(out.resolve())) for p in written}
    text = "".join(f"{n}\n" for n in sorted(names))
    atomic_write(out / MANIFEST, lambda f: f.write(text), mode="w")


if __name__ == "__main__":
    main()
