"""The check framework (helpers/checks/_core.py): what a student sees, and what a grader sees."""
import pytest
import torch

from helpers.checks import CheckFailed, Result, expect, fresh_generator, run_check


def body(answer):
    expect(answer() == 42, f"answer() returned {answer()!r}, expected 42")


@pytest.fixture(autouse=True)
def not_grading(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)


def test_outcomes_print_one_line(capsys):
    assert run_check("answer", body, lambda: 42).status == "passed"
    assert capsys.readouterr().out == "answer: ✔ passed\n"
    r = run_check("answer", body, lambda: 41)
    assert r.status == "failed" and not r
    assert capsys.readouterr().out == "answer: ✘ failed: answer() returned 41, expected 42\n"


def test_stub_and_crash_do_not_raise(capsys):
    def stub():
        raise NotImplementedError()
    assert run_check("answer", body, stub).status == "not done"
    assert "answer: … not done yet" in capsys.readouterr().out
    r = run_check("answer", body, lambda: 1 / 0)
    assert r.status == "failed" and "your code raised ZeroDivisionError" in r.message


@pytest.mark.parametrize("env", ["NBGRADER_EXECUTION", "COURSE_GRADING"])
def test_grading_raises_unless_passed(monkeypatch, env):
    monkeypatch.setenv(env, "autograde" if env.startswith("NB") else "1")
    assert run_check("answer", body, lambda: 42)
    with pytest.raises(CheckFailed, match="answer: ✘ failed: answer\\(\\) returned 41"):
        run_check("answer", body, lambda: 41)
    with pytest.raises(CheckFailed, match="not done yet"):
        run_check("answer", body, lambda: (_ for _ in ()).throw(NotImplementedError()))


def test_result_is_shown_once_in_a_notebook():
    """run_check prints the line; IPython must not show the returned Result a second time."""
    r = Result("answer", "passed")
    assert r._ipython_display_() is None
    assert repr(r) == "answer: ✔ passed"


def test_fresh_generator_is_fresh_and_leaves_torch_alone():
    state = torch.get_rng_state()
    a = torch.rand(4, generator=fresh_generator())
    b = torch.rand(4, generator=fresh_generator())
    assert not torch.equal(a, b)
    assert torch.equal(state, torch.get_rng_state())
    assert torch.equal(torch.rand(3, generator=fresh_generator(7)),
                       torch.rand(3, generator=fresh_generator(7)))
