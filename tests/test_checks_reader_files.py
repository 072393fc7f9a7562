"""Whose file is it: the harness's verdict on a code object's file (run.is_reader_code) is cached
and read at any moment, also while an answer runs with builtins of its own; a verdict made then
must be the one made with torch's and Python's originals, or a cached "the reader's" for a
harness file refuses every later right answer in the process."""
import builtins
import os
import pathlib

import pytest
import torch

from helpers.checks._core import run

HARNESS = pathlib.Path(run.__file__).resolve()


def test_files_are_judged_by_their_folders(tmp_path, monkeypatch):
    """The course's files, torch's and the standard library's are not the reader's; a cell, a
    script elsewhere, a relative name resolved from the working folder are judged by folder."""
    run._reader_file.cache_clear()
    assert not run.is_reader_code(str(HARNESS))
    assert not run.is_reader_code(torch.__file__)
    assert not run.is_reader_code(os.__file__)
    assert not run.is_reader_code("<frozen importlib._bootstrap>")
    assert run.is_reader_code("<ipython-input-1-abc>")
    assert run.is_reader_code(str(tmp_path / "answer.py"))
    assert run.is_reader_code("/answer.py")
    assert run.is_reader_code("bad\x00name.py")
    monkeypatch.chdir(HARNESS.parent)
    assert not run.is_reader_code(HARNESS.name)
    monkeypatch.chdir(tmp_path)
    assert run.is_reader_code("answer.py")


def test_a_symlinked_folder_is_the_folder_it_points_to(tmp_path):
    """A worktree's `.venv` link to the venv: torch's files through the link are torch's."""
    link = tmp_path / "venv-link"
    link.symlink_to(pathlib.Path(torch.__file__).parent)
    run._reader_file.cache_clear()
    assert not run.is_reader_code(str(link / "__init__.py"))


@pytest.mark.parametrize("name, fake", [
    ("any", lambda items: False),
    ("len", lambda obj: 0),
    ("map", lambda fn, *its: iter(())),
    ("isinstance", lambda obj, kind: False),
])
def test_builtins_replaced_while_judging_leave_no_wrong_verdict(name, fake, monkeypatch):
    """An answer's replaced builtin, in place when a harness file is first judged, changes
    neither that verdict nor the cached one after it is put back."""
    run._reader_file.cache_clear()
    with monkeypatch.context() as patch:
        patch.setattr(builtins, name, fake)
        during = run.is_reader_code(str(HARNESS))
    after = run.is_reader_code(str(HARNESS))
    assert (during, after) == (False, False)
