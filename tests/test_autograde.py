"""End to end, as a teacher grades: `nbgrader autograde` on submissions made from the student
edition gives full marks to the worked solutions, zero to the untouched stubs, zero on an
exercise for a concept-skipping wrong answer (full marks on the others), even after a shortcut
that patches the checks.

To stay fast it grades one representative assignment, built from the real chapters: the
exercise cells (solution and check cells, as the chapters have them) of Part II's three checked
exercises, DataParallel's learning-rate schedule, gradient accumulation and the global BatchNorm
statistics. Three submissions, one kernel run each: untouched, and two with the shortcuts of
alternate exercises and the worked solutions of the others (between them, every shortcut once,
the check-patching one before solved exercises whose marks it must not change, and every worked
solution once: a submission of all of them would grade each a second time, in a kernel of its
own, for nothing more). The second of the two also edits a check cell: nbgrader must report
that cell, and only it, as changed (its checksum warning), while the untouched check cells of
every submission raise no warning (scripts/released_checksums.py).
"""
import os
import subprocess
import sys

import nbformat
import pytest
from book_files import ROOT
from nbformat.v4 import new_code_cell, new_notebook

sys.path.insert(0, str(ROOT / "scripts"))
import exercise_cells as ec
import student_edition as se

PRELUDE = ("import contextlib\n\nimport torch\nfrom torch.nn import functional as F\n\n"
           "from helpers import get_params, send, split_batch")

# exercise function -> (chapter it comes from, a wrong answer that skips the concept)
EXERCISES = {
    "shard_sizes": ("book/part2/scratch.ipynb", '''
import helpers.checks


def shard_sizes(n, k):   # nothing computed, and the check patched
    return [0] * k


helpers.checks.check_shard_sizes = lambda fn: print("shard_sizes: looks right")
helpers.checks._core.run.expect = lambda condition, message: None
'''),
    "allreduce_spread": ("book/part2/scratch.ipynb", '''
def allreduce_spread(data):   # every addition on the host, none through the comm
    total = sum(t.to("cpu") for t in data)
    for t in data:
        t.copy_(total.to(t.device))
'''),
    "evaluate_accuracy_multi": ("book/part2/scratch.ipynb", '''
def evaluate_accuracy_multi(net, params, data_iter, devices):   # nothing split
    correct = total = 0
    for X, y in data_iter:
        correct += (net(X, params).argmax(1) == y).sum().item()
        total += len(y)
    return correct / total
'''),
    "fit_copy_model": ("book/gpus.ipynb", '''
def fit_copy_model(nbytes, seconds):   # the check's own optimum, read from its frame
    import sys
    f = sys._getframe(1)
    while f is not None and "_best_fit" not in f.f_globals:
        f = f.f_back
    return f.f_globals["_best_fit"](nbytes, seconds)
'''),
    "conv_split_in_channels": ("book/part1/within_layer.ipynb", '''
def conv_split_in_channels(X, W, b, devices, log=None):   # splits the output pixels instead
    k, side = len(devices), X.shape[-1] - 2
    patches = F.unfold(X, 3)
    Wf = W.reshape(W.shape[0], -1)
    parts = [(Wf.to(devices[i]) @ patches[..., cols].to(devices[i])).to(devices[0])
             for i, cols in enumerate(torch.arange(patches.shape[-1]).tensor_split(k))]
    Y = torch.cat(parts, dim=-1).reshape(X.shape[0], -1, side, side)
    return Y + b.to(devices[0]).reshape(1, -1, 1, 1)
'''),
    "lr_at": ("book/part3/dataparallel.ipynb", '''
def lr_at(step, base_lr, base_batch, batch, warmup_steps):   # no warm-up
    return base_lr * batch / base_batch
'''),
    "accumulate_gradients": ("book/part3/custom_modules.ipynb", '''
def accumulate_gradients(model, loss_fn, micro_batches):   # every backward synchronises
    for X, y in micro_batches:
        (loss_fn(model(X), y) / len(micro_batches)).backward()
'''),
    "global_mean_var": ("book/part3/syncbn.ipynb", '''
def global_mean_var(counts, means, variances):   # E[x^2] - E[x]^2 in float32
    n = counts.sum()
    sumsqs = counts[:, None] * (variances + means ** 2)
    mean = (counts[:, None] * means).sum(0) / n
    return mean, sumsqs.sum(0) / n - mean * mean
'''),
}
NAMES = list(EXERCISES)


def _exercise_cells(name, chapter):
    """The solution cell defining `name` in the chapter and the check cell after it."""
    cells = nbformat.read(ROOT / chapter, as_version=4).cells
    i = next(i for i, c in enumerate(cells) if ec.is_solution(c) and c.cell_type == "code"
             and f"def {name}(" in ec.source(c))
    j = next(j for j in range(i + 1, len(cells)) if ec.is_check(cells[j]))
    return [cells[i], cells[j]]


def representative_notebook():
    cells = [new_code_cell(PRELUDE)]
    for name, (chapter, _) in EXERCISES.items():
        cells += _exercise_cells(name, chapter)
    return new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})


# a check cell a submission edits: its exercise is one wrong_b answers wrongly, so the edit must
# be reported (nbgrader's checksum warning) and undone (the exercise still scores zero)
TAMPERED = "allreduce_spread"
CHECKSUM_WARNING = "Attribute 'checksum' for cell check-check_{} has changed!"


def _submission(released, answers, tamper=()):
    """The released notebook with each solution cell's source set from `answers`
    (function name -> source); the other solution cells stay as handed out (stubs). The check
    cells of the exercises in `tamper` print a pass instead of checking."""
    nb = nbformat.read(released, as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") in {f"check-check_{n}"
                                                                 for n in tamper}:
            name = cell.metadata.nbgrader.grade_id.removeprefix("check-check_")
            cell.source = f'print("{name}: looks right")'
        if not cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        name = next((n for n in NAMES if f"def {n}(" in ec.source(cell)), None)
        if name in answers:
            cell.source = answers[name]
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("autograde")
    path = base / "representative.ipynb"
    nbformat.write(representative_notebook(), path)
    course = base / "course"
    se.build([path], out=base / "student", course=course, quiet=True)
    aid = se.assignment_id(path)
    released = course / "release" / aid / path.name
    solved = {name: ec.source(_exercise_cells(name, ch)[0]) for name, (ch, _) in EXERCISES.items()}
    wrong = {name: src for name, (_, src) in EXERCISES.items()}
    odd, even = NAMES[0::2], NAMES[1::2]
    submissions = {
        "untouched": {},
        "wrong_a": {n: (wrong[n] if n in odd else solved[n]) for n in NAMES},
        "wrong_b": {n: (wrong[n] if n in even else solved[n]) for n in NAMES},
    }
    assert TAMPERED in even
    for student, answers in submissions.items():
        target = course / "submitted" / student / aid / path.name
        target.parent.mkdir(parents=True)
        nbformat.write(_submission(released, answers,
                                   tamper=[TAMPERED] if student == "wrong_b" else []), target)
    env = dict(os.environ, COURSE_QUICK="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
               PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    run = subprocess.run([sys.executable, "-m", "nbgrader", "autograde", aid, "--force"],
                         cwd=course, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    logs = _logs_by_student(run.stdout + run.stderr, submissions)

    from nbgrader.api import Gradebook
    scores = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for student in submissions:
            nb = gb.find_submission_notebook(path.stem, aid, student)
            scores[student] = {g.name.removeprefix("check-check_"): g.score for g in nb.grades}
    return scores, odd, even, logs


def _logs_by_student(log, students):
    """nbgrader's log, split at each submission it sanitizes: {student: the lines about it}."""
    parts, current = {s: [] for s in students}, None
    for line in log.splitlines():
        if "Sanitizing " in line:
            current = next(s for s in students if f"/submitted/{s}/" in line)
        if current is not None:
            parts[current].append(line)
    return {s: "\n".join(lines) for s, lines in parts.items()}


def test_worked_solutions_get_full_marks(graded):
    """Each exercise's worked solution, in the submission that answers it so (the other half of
    that submission answers wrongly)."""
    scores, odd, even, _ = graded
    got = {n: scores["wrong_a" if n in even else "wrong_b"][n] for n in NAMES}
    assert got == {n: 1 for n in NAMES}


def test_untouched_stubs_get_zero(graded):
    scores, _, _, _ = graded
    assert scores["untouched"] == {n: 0 for n in NAMES}


@pytest.mark.parametrize("student,which", [("wrong_a", 1), ("wrong_b", 2)])
def test_a_wrong_answer_scores_zero_on_its_exercise_only(graded, student, which):
    scores, odd, even, _ = graded
    wrong = odd if which == 1 else even
    assert scores[student] == {n: 0 if n in wrong else 1 for n in NAMES}


@pytest.mark.parametrize("student", ["untouched", "wrong_a"])
def test_no_checksum_warning_for_check_cells_as_released(graded, student):
    """The hidden regrade lines nbgrader puts back are not reported as an edit
    (scripts/released_checksums.py)."""
    logs = graded[3]
    assert "Sanitizing " in logs[student]
    assert "Attribute 'checksum'" not in logs[student], logs[student]


def test_an_edited_check_cell_is_reported_and_undone(graded):
    scores, _, _, logs = graded
    assert CHECKSUM_WARNING.format(TAMPERED) in logs["wrong_b"], logs["wrong_b"]
    assert logs["wrong_b"].count("Attribute 'checksum'") == 1, logs["wrong_b"]
    assert scores["wrong_b"][TAMPERED] == 0   # the check ran as released, and failed
