"""The classroom: a student edition without the solutions (the exercise conventions:
test_exercise_conventions.py; the teachers' guide: test_teachers_guide.py).

Builds the student edition (scripts/student_edition.py, nbgrader) of every chapter in _toc.yml
and of a small sample notebook into a temporary folder; nothing is executed here (`make
test-student` runs the student notebooks under nbval).
"""
import re
import sys

import nbformat
import pytest
from book_files import ROOT
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

sys.path.insert(0, str(ROOT / "scripts"))
import exercise_cells as ec
import student_edition as se
import teachers_guide as tg

# the chapters in _toc.yml whose notebook exists (tests/test_book.py fails for a missing one)
CHAPTERS = ec.chapters()
IDS = [str(p.relative_to(ROOT)) for p in CHAPTERS]


def read(path):
    return nbformat.read(path, as_version=4)


def lines(text):
    return {line.strip() for line in text.splitlines()}


def nontrivial(line):
    """A line that gives something away: not blank, not only punctuation, not a bare keyword."""
    return (len(line) >= 6 and not line.startswith("#") and re.search(r"[A-Za-z0-9]", line)
            and line not in {"return", "else:", "continue", "break", "pass", ":::", "```"})


def solution_lines(nb):
    """The non-trivial lines of the solutions (marked code, worked answers) that the chapter
    does not also show outside them."""
    secret, public = set(), set()
    for cell in nb.cells:
        text = ec.source(cell)
        if not ec.is_solution(cell):
            public |= lines(text)
        elif ec.is_text(cell):
            secret |= lines(text)
        else:
            inside = False
            for line in text.splitlines():
                if ec.BEGIN in line or ec.END in line:
                    inside = ec.BEGIN in line
                    continue
                (secret if inside else public).add(line.strip())
    return {line for line in secret - public if nontrivial(line)}


def sample_notebook():
    """A chapter in miniature: a code cell with a checked output, two code exercises (solution
    cell, check cell with its stored pass), an open-ended one with a worked answer."""
    def code(src, tags, text=None):
        cell = new_code_cell(src, metadata={"tags": tags})
        if text:
            cell.outputs = [new_output("stream", name="stdout", text=text)]
        return cell

    cells = [
        new_markdown_cell("# A sample chapter"),
        code("import torch\nfrom helpers.checks import check_matmul_flops, check_shard_sizes\n"
             "print(torch.ones(2).shape)", ["nbval-check-output"], "torch.Size([2])\n"),
        new_code_cell('helpers.say(r"""A paragraph with {n} numbers.""")',
                      metadata={"course": {"prose": True, "glued": ["n"]}},
                      outputs=[new_output("display_data",
                                          data={"text/markdown": "A paragraph with 3 numbers."})]),
        new_markdown_cell("## Exercises\n\n### Exercise 1: Count the work\n*Warm-up, 5 min.*"),
        code('def matmul_flops(n):\n    """Operations of an n×n by n×n product."""\n'
             "    ### BEGIN SOLUTION\n    flops_per_entry = 2 * n   # SECRET ONE\n"
             "    return flops_per_entry * n * n\n    ### END SOLUTION",
             ["solution", "hide-input"]),
        code("check_matmul_flops(matmul_flops)", ["check", "nbval-check-output"],
             "matmul_flops: ✔ passed\n"),
        new_markdown_cell("### Exercise 2: Shard sizes (core, 10–15 minutes)"),
        code("def shard_sizes(n, k):\n    ### BEGIN SOLUTION\n    if n < k:\n"
             '        raise ValueError("SECRET TWO")\n    q, r = divmod(n, k)\n'
             "    return [q + 1] * r + [q] * (k - r)\n    ### END SOLUTION",
             ["solution", "hide-input"]),
        code("check_shard_sizes(shard_sizes)", ["check", "nbval-check-output"],
             "shard_sizes: ✔ passed\n"),
        new_markdown_cell("### Exercise 3: Why? (open-ended, 1 h)"),
        new_markdown_cell(":::{dropdown} A worked answer\nBecause of SECRET PROSE.\n:::",
                          metadata={"tags": ["solution"]}),
        new_code_cell('helpers.say(r"""<details><summary>A worked answer with numbers'
                      '</summary>\n\nBecause of SECRET NUMBERS.\n</details>""")',
                      metadata={"tags": ["solution", "remove-input"],
                                "course": {"prose": True, "glued": []}}),
        code('print("after the exercises")', []),
    ]
    return new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    """The student edition of the sample and of every chapter, built once (nbgrader)."""
    base = tmp_path_factory.mktemp("classroom")
    sample = base / "sample.ipynb"
    nbformat.write(sample_notebook(), sample)
    out = base / "student"
    se.build([sample] + CHAPTERS, out=out, course=base / "course", quiet=True, gradebook=False)
    return {"out": out, "sample": sample, "course": base / "course"}


def student_copy(edition, path):
    return read(se.student_path(path, edition["out"]))


# --- the student edition, on a sample and on every chapter -------------------------------------
def test_sample_edition(edition):
    original, student = read(edition["sample"]), student_copy(edition, edition["sample"])
    text = "\n".join(ec.source(c) for c in student.cells)
    assert solution_lines(original) >= {"flops_per_entry = 2 * n   # SECRET ONE",
                                        'raise ValueError("SECRET TWO")',
                                        "Because of SECRET PROSE.",
                                        "Because of SECRET NUMBERS."}
    assert "SECRET" not in text and "BEGIN SOLUTION" not in text
    stubs = [ec.source(c) for c in student.cells if ec.is_solution(c)]
    assert len(stubs) == 2 and all(s.rstrip().endswith(ec.STUB) for s in stubs)
    assert stubs[0].startswith('def matmul_flops(n):\n'
                               '    """Operations of an n×n by n×n product."""')
    assert [ec.source(c) for c in student.cells if ec.is_check(c)] == [
        "check_matmul_flops(matmul_flops)", "check_shard_sizes(shard_sizes)"]
    assert not any("nbval-check-output" in ec.tags(c) for c in student.cells)
    kept = [c for c in student.cells if c.get("outputs")]
    assert [c.outputs[0]["data"]["text/markdown"] for c in kept] == [
        "A paragraph with 3 numbers."], "only the prose keeps its stored text"
    assert ec.source(student.cells[-1]) == 'print("after the exercises")'
    grade = [c.metadata["nbgrader"] for c in student.cells if ec.is_check(c)]
    assert all(g["grade"] and g["locked"] and g["points"] == 1 for g in grade)
    answer, = [c for c in student.cells if c.metadata.get("nbgrader", {}).get("grade")
               and c.cell_type == "markdown"]
    assert answer.metadata["nbgrader"]["solution"] and not answer.metadata["nbgrader"]["locked"]
    assert answer.metadata["nbgrader"]["grade_id"] == "answer-exercise3"
    assert ec.source(answer) == "YOUR ANSWER HERE", "nbgrader's stub for a written answer"
    assert student.cells.index(answer) == student.cells.index(kept[0]) + 8
    assert (edition["course"] / "source" / "sample" / "sample.ipynb").exists()


def test_gradebook_for_autograding(tmp_path):
    """With the gradebook (what `make student` does), nbgrader knows every check cell of the
    assignment, ready for `nbgrader autograde`."""
    from nbgrader.api import Gradebook

    nbformat.write(sample_notebook(), tmp_path / "sample.ipynb")
    course = tmp_path / "course"
    se.build([tmp_path / "sample.ipynb"], out=tmp_path / "student", course=course, quiet=True)
    assert (course / "nbgrader_config.py").exists()
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        cells = gb.find_notebook("sample", "sample").grade_cells
        assert sorted(c.name for c in cells) == ["answer-exercise3", "check-check_matmul_flops",
                                                  "check-check_shard_sizes"]
        assert gb.find_assignment("sample").max_score == 3   # two checks, one written answer


def test_sample_exercise_table(edition):
    table = tg.exercise_table([edition["sample"]])
    assert ("| A sample chapter | 1. Count the work | warm-up | 5 min | "
            "`check_matmul_flops` |") in table
    assert "|  | 2. Shard sizes | core | 15 min | `check_shard_sizes` |" in table
    assert "|  | 3. Why? | open-ended | 60 min | worked answer |" in table
    assert "In all: 3 exercises, about 1.3 hours." in table


def test_solutions_must_be_marked():
    nb = sample_notebook()
    nb.cells[4].source = "def matmul_flops(n):\n    return 2 * n**3"
    with pytest.raises(ec.EditionError, match="no `### BEGIN SOLUTION`"):
        ec.nbgrader_source(nb)
    nb = sample_notebook()
    nb.cells[4].metadata["tags"] = []
    with pytest.raises(ec.EditionError, match="is not tagged `solution`"):
        ec.nbgrader_source(nb)


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_no_solution_in_student_edition(path, edition):
    secret = solution_lines(read(path))
    student_file = se.student_path(path, edition["out"])
    student = read(student_file)
    shown = set().union(*(lines(ec.source(c)) for c in student.cells))
    leaked = sorted(secret & shown)
    assert not leaked, f"{student_file.name} gives solutions away: {leaked}"
    assert "BEGIN SOLUTION" not in student_file.read_text()


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_student_edition_keeps_checks_and_drops_prose(path, edition):
    original, student = read(path), student_copy(edition, path)
    assert [ec.source(c) for c in student.cells if ec.is_check(c)] == \
        [ec.source(c) for c in original.cells if ec.is_check(c)], "every check cell is kept"
    assert not [c for c in student.cells if ec.is_solution(c) and ec.is_text(c)]
    for cell in student.cells:
        if ec.is_solution(cell):
            assert ec.STUB in ec.source(cell)
        if ec.is_prose(cell):
            assert all(o["output_type"] == "display_data" for o in cell.outputs)
        else:
            assert not cell.get("outputs"), "outputs are cleared, but for the prose's text"
        assert "nbval-check-output" not in ec.tags(cell), \
            "outputs are cleared: nbval has nothing to compare"
    prose = [c for c in original.cells if ec.is_prose(c) and not ec.is_solution(c)]
    assert [c.outputs for c in student.cells if ec.is_prose(c)] == [
        [o for o in c.outputs if o["output_type"] == "display_data"] for c in prose]
    kept = [c for c in original.cells if not (ec.is_solution(c) and ec.is_text(c))]
    answers = [c for c in student.cells if c.cell_type == "markdown"
               and c.metadata.get("nbgrader", {}).get("grade")]
    open_ended = [e for e in tg.exercises(path) if e["written"]]     # checked or not
    assert [c.metadata["nbgrader"]["grade_id"] for c in answers] == [
        f"answer-exercise{e['number']}" for e in open_ended], \
        "an answer cell for every exercise the teacher grades by hand"
    assert len(student.cells) == len(kept) + len(answers)


def test_a_checked_exercise_with_a_written_question_gets_an_answer_cell():
    """gpus' Exercise 3 is checked and also asks a written question (its worked answer): the
    handout has a graded place for the written half, after the check cell."""
    path = next(p for p in CHAPTERS if p.stem == "gpus")
    ex3 = next(e for e in tg.exercises(path) if e["number"] == 3)
    assert ex3["written"] and ex3["check"].startswith("`check_") and \
        ex3["check"].endswith(" and a worked answer")
    nb = ec.nbgrader_source(read(path), "gpus")
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    at = ids.index("answer-exercise3")
    head = max(i for i, c in enumerate(nb.cells[:at]) if ec.is_text(c)
               and not ec.is_solution(c) and ec.EXERCISE.search(ec.source(c)))
    assert ec.EXERCISE.search(ec.source(nb.cells[head])).group(1) == "3"
    assert any(ec.is_check(c) for c in nb.cells[head:at]), \
        "the answer cell follows the exercise's check cell"


# --- the edition never deletes what it did not write (a teacher's own notebooks) ---------------
def test_an_out_folder_with_other_notebooks_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "teaching"
    mine = out / "week1" / "my_lesson.ipynb"
    mine.parent.mkdir(parents=True)
    nbformat.write(sample_notebook(), mine)
    with pytest.raises(SystemExit) as stop:
        se.main(["--out", str(out), "--course", str(tmp_path / "course")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "week1/my_lesson.ipynb" in err and "empty" in err
    assert mine.exists() and not (tmp_path / "course").exists()


def test_a_rebuild_removes_only_what_the_manifest_lists(tmp_path):
    out = tmp_path / "student"
    ours, theirs = out / "part9" / "gone.ipynb", out / "notes.ipynb"
    ours.parent.mkdir(parents=True)
    nbformat.write(sample_notebook(), ours)
    (out / se.MANIFEST).write_text("part9/gone.ipynb\n")
    assert se._stale(out, None) == [ours]   # a chapter an earlier build wrote: cleaned
    nbformat.write(sample_notebook(), theirs)
    with pytest.raises(ValueError, match="notes.ipynb"):
        se._stale(out, None)
    chapter = se.student_path(CHAPTERS[0], out)   # one chapter asked for, over a foreign file
    chapter.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(sample_notebook(), chapter)
    with pytest.raises(ValueError, match="did not write"):
        se._stale(out, [CHAPTERS[0]])


def test_the_manifest_lists_what_a_build_wrote(tmp_path, edition):
    out = edition["out"]
    written = sorted(out.rglob("*.ipynb"))
    se._record(out, written)
    listed = (out / se.MANIFEST).read_text().split()
    assert sorted(out / name for name in listed) == written


@pytest.mark.parametrize("bad", [["--out", "{file}"], ["book/nowhere.ipynb"], ["README.md"]])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys, bad):
    afile = tmp_path / "a_file"
    afile.write_text("x")
    argv = [a.format(file=afile) for a in bad]
    with pytest.raises(SystemExit) as stop:
        se.main(argv + ["--course", str(tmp_path / "course")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not (tmp_path / "course").exists()
