"""The teachers' guide (book/teachers.md, scripts/teachers_guide.py): its table matches the
notebooks, and its grading times match their records (a measured one names its machine, date
and command; an unmeasured chapter shows its quick run as an estimate)."""
import re
import sys

from book_files import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import exercise_cells as ec
import teachers_guide as tg

# the chapters in _toc.yml whose notebook exists (tests/test_book.py fails for a missing one)
CHAPTERS = ec.chapters()


def test_teachers_guide_table_matches_the_notebooks():
    text = tg.TEACHERS.read_text()
    begin = text.index(tg.TABLE_BEGIN) + len(tg.TABLE_BEGIN)
    table = text[begin:text.index(tg.TABLE_END)].strip()
    assert table == tg.exercise_table(CHAPTERS), (
        "book/teachers.md's exercise table is out of date: run "
        ".venv/bin/python scripts/student_edition.py --update-teachers-guide")


def test_teachers_guide_grading_times_match_their_records():
    """The guide's time per submission is printed from the records (book/_ext/grading_times.json,
    book/_ext/runs.json), never typed."""
    text = tg.TEACHERS.read_text()
    begin = text.index(tg.GRADING_BEGIN) + len(tg.GRADING_BEGIN)
    table = text[begin:text.index(tg.GRADING_END)].strip()
    assert table == tg.grading_table(CHAPTERS), (
        "book/teachers.md's grading-time table is out of date: run "
        ".venv/bin/python scripts/student_edition.py --update-teachers-guide")
    assert len(table.splitlines()) == 2 + len(CHAPTERS)


def test_a_measured_grading_time_names_its_machine_date_and_command():
    record = tg.grading_record()
    assert record, "no chapter's autograde time is measured: run scripts/time_autograde.py"
    docs = {p.resolve().relative_to(ROOT).with_suffix("").as_posix() for p in CHAPTERS}
    for doc, entry in record.items():
        assert doc in docs, f"{doc} is not a chapter"
        assert entry["command"].startswith("COURSE_QUICK=1 nbgrader autograde ")
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["date"]) and "CPU cores" in entry["machine"]
        assert entry["seconds"] > 0 and entry["submissions"] >= 1


def test_an_unmeasured_chapter_shows_its_quick_run_as_an_estimate():
    quick = {"seconds": 95, "peak_bytes": 1, "processes": 1, "machine": "2 CPU cores, no GPU",
             "date": "2026-01-02", "others": 1.6}
    runs = {"book/x": {"quick": quick}}
    measured = {"book/y": dict(quick, seconds=80, submissions=1, others=0.1,
                               command="COURSE_QUICK=1 nbgrader autograde y")}
    time, how = tg.grading_time("book/x", measured, runs)
    assert time == "about 1 min 35 s" and how.startswith("estimate: the quick-mode run")
    assert "2026-01-02" in how and "busy (other work: 1.6 cores)" in how
    time, how = tg.grading_time("book/y", measured, runs)
    assert time == "1 min 20 s"
    assert how.startswith("measured: `COURSE_QUICK=1 nbgrader autograde y`")
    assert "busy" not in how
    assert tg.grading_time("book/z", measured, runs)[0] == "?"
