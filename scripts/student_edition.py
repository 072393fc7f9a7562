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
book/teachers.md). The cell conventions are exercise_cells.py's, the guide's tables
teachers_guide.py's; this script builds the edition and keeps its output folder.
"""
import argparse
import copy
import logging
import os
import pathlib
import shutil
import sys

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from exercise_cells import (  # noqa: E402
    STUB,
    EditionError,
    chapters,
    is_prose,
    is_solution,
    nbgrader_source,
)
from teachers_guide import TEACHERS, update_teachers_guide  # noqa: E402

MANIFEST = ".student-edition"   # what a build wrote into --out: all it may delete later


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
