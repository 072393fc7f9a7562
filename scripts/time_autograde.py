"""Time `nbgrader autograde` per submission for chapters, as a teacher runs it, and record it.

Usage: python scripts/time_autograde.py [--submissions N] book/part2/scratch.ipynb ...

For each chapter: builds its student edition into a fresh nbgrader course folder
(scripts/student_edition.py), hands in N copies of the handout with the worked solutions filled
in (a submission that runs every cell, as a finished one does), runs
`COURSE_QUICK=1 nbgrader autograde <assignment>` in that folder (the command of book/teachers.md)
and samples it as scripts/execute_notebooks.py samples a chapter (wall time, peak memory of the
whole process tree, the cores other work kept busy meanwhile). It checks that every check cell
scored, then writes the wall time divided by N, with the machine, the date and the command, to
book/_ext/grading_times.json (teachers_guide.GRADING_RECORD). The teacher's guide prints it per
chapter (`student_edition.py --update-teachers-guide`); a chapter not measured here shows its
quick-mode run time from book/_ext/runs.json, labelled as an estimate. Nobody types these
numbers.
"""
import argparse
import datetime
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import chapter_runs  # noqa: E402
import execute_notebooks as ex  # noqa: E402
import student_edition as se  # noqa: E402
import teachers_guide as tg  # noqa: E402

COMMAND = "COURSE_QUICK=1 nbgrader autograde {aid}"


def solved(source, released):
    """The released notebook with every solution cell's source taken from nbgrader's source
    (the worked solution), matched by grade id."""
    answers = {c.metadata.nbgrader["grade_id"]: c.source
               for c in nbformat.read(source, as_version=4).cells
               if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"}
    nb = nbformat.read(released, as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return nb


def measure(path, submissions=1):
    """Autograde `submissions` solved submissions of chapter `path`; its record entry."""
    import torch
    path = pathlib.Path(path).resolve()
    aid = se.assignment_id(path)
    with tempfile.TemporaryDirectory(prefix="time-autograde-") as tmp:
        course = pathlib.Path(tmp) / "course"
        se.build([path], out=pathlib.Path(tmp) / "student", course=course, quiet=True)
        nb = solved(course / "source" / aid / path.name, course / "release" / aid / path.name)
        students = [f"student{i + 1}" for i in range(submissions)]
        for student in students:
            target = course / "submitted" / student / aid / path.name
            target.parent.mkdir(parents=True)
            nbformat.write(nb, target)
        env = dict(os.environ, COURSE_QUICK="1", PYTHONPATH=str(ROOT), PATH=os.pathsep.join(
            [os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
        log = pathlib.Path(tmp) / "autograde.log"
        with open(log, "w") as out:
            t0 = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "nbgrader", "autograde", aid,
                                     "--force"], cwd=course, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
            sampler = ex.TreeSampler(proc.pid)
            sampler.start()
            try:
                rc = proc.wait()
            finally:
                sampler.stop()
            wall = time.monotonic() - t0
        if rc != 0:
            raise SystemExit(f"{aid}: nbgrader autograde failed:\n{log.read_text()[-3000:]}")
        from nbgrader.api import Gradebook
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
            for student in students:
                grades = gb.find_submission_notebook(path.stem, aid, student).grades
                checks = [g for g in grades if g.name.startswith("check-")]
                lost = [g.name for g in checks if g.score != g.max_score]
                if lost:
                    raise SystemExit(f"{aid}: the worked solutions lost {lost}: not a clean "
                                     f"run to time\n{log.read_text()[-3000:]}")
    where, _ = ex.machine()
    return dict(seconds=round(wall / submissions, 1), submissions=submissions,
                checks=len(checks), peak_bytes=sampler.peak_bytes, load=sampler.load(),
                others=sampler.other_cores(), machine=where, cores=ex.cpu_cores(),
                date=datetime.date.today().isoformat(), torch=torch.__version__.split("+")[0],
                command=COMMAND.format(aid=aid), by="scripts/time_autograde.py")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", help="chapter notebooks, e.g. book/part2/scratch.ipynb")
    ap.add_argument("--submissions", type=int, default=1, help="solved copies to grade (1)")
    ap.add_argument("--record", default=str(tg.GRADING_RECORD), help="the record to write")
    args = ap.parse_args(argv)
    for name in args.notebooks:
        path = pathlib.Path(name)
        entry = measure(path, args.submissions)
        doc = ex.docname(path)
        record = tg.grading_record(args.record)
        record[doc] = entry
        from helpers import write_json
        write_json(pathlib.Path(args.record), dict(sorted(record.items())))
        print(f"{doc}: {chapter_runs.run_text(entry)} per submission "
              f"({entry['submissions']} graded, {entry['checks']} check cells each)")


if __name__ == "__main__":
    main()
