"""The gpus chapter's disclosure of the GPU run's failed cells: what a failed cell checked is
named only for the commit the run recorded: all by content, or by number and then
what those the names cover held."""
import json

import helpers


def _reference_failing_cell_22(tmp_path):
    """A GPU reference file (at commit abc1234) whose nbval step failed gpus' cell 22."""
    ref = {"exists": True, "gpu": "G", "torch": "t", "date": "d", "command": "c",
           "commit": "abc1234", "steps": {"nbval": {"failed": ["book.gpus.ipynb::Cell 22"]}}}
    path = tmp_path / "gpu_reference.json"
    path.write_text(json.dumps(ref))
    return path


def test_a_failed_cell_is_named_by_what_it_checked_at_the_runs_commit(tmp_path):
    path = _reference_failing_cell_22(tmp_path)
    ref = json.loads(path.read_text())
    checked = {"abc1234": {22: "the check that the timer reads too small"}}
    said = helpers.failed_cells_words("book/gpus.ipynb", str(path), names=checked)
    assert "1 of them failed there: the check that the timer reads too small (in the notebook "\
        "at commit abc1234" in said and "23rd" not in said
    # one failed cell is "it", several are "them"
    assert said.endswith("until a GPU run passes it, what that cell computes is not checked on "
                         "a GPU.")
    two = dict(ref, steps={"nbval": {"failed": ["book.gpus.ipynb::Cell 22",
                                                "book.gpus.ipynb::Cell 30"]}})
    path.write_text(json.dumps(two))
    some = helpers.failed_cells_words("book/gpus.ipynb", str(path), names=checked)
    assert "(the 23rd and 31st code cells" in some
    assert "until a GPU run passes them, what those cells compute is not checked" in some
    assert some.endswith("not checked on a GPU. At that commit the 23rd code cell was the "
                         "check that the timer reads too small.")
    path.write_text(json.dumps(ref))
    # another commit's cell numbers name other cells: nothing is named
    other = helpers.failed_cells_words("book/gpus.ipynb", str(path),
                                       names={"0000000": checked["abc1234"]})
    assert "(the 23rd code cell of" in other and "too small" not in other
    assert "too small" not in helpers.failed_cells_words("book/gpus.ipynb", str(path))
    # the sentence opens with the run as the text names it
    named = helpers.failed_cells_words("book/gpus.ipynb", str(path), who="The GPU run (G, d)")
    assert named.startswith(" The GPU run (G, d) executed this notebook's code cells")


def test_the_readers_note_names_what_failed_without_commit_or_cell_number(tmp_path):
    path = _reference_failing_cell_22(tmp_path)
    ref = json.loads(path.read_text())
    checked = {"abc1234": {22: "the unsynchronised timer above"}}
    note = helpers.failed_cells_note("book/gpus.ipynb", str(path), names=checked)
    assert note == (" The GPU reference run (G, d) executed this chapter, and the cell of the "
                    "unsynchronised timer above failed there (it stopped with an error or a "
                    "check of the text that did not hold; the run stores which cells failed, not "
                    "why, nor the figures they print): what the chapter says a GPU shows there "
                    "is a prediction until a GPU run records it.")
    # another commit's numbers name nothing; the count alone, no number or commit
    other = helpers.failed_cells_note("book/gpus.ipynb", str(path), names={"0000000": {22: "x"}})
    assert other.startswith(" The GPU reference run (G, d) executed this chapter, and one of its "
                            "cells failed there (")
    two = dict(ref, steps={"nbval": {"failed": ["book.gpus.ipynb::Cell 22",
                                                "book.gpus.ipynb::Cell 30"]}})
    path.write_text(json.dumps(two))
    some = helpers.failed_cells_note("book/gpus.ipynb", str(path), names=checked)
    assert "and 2 of its cells failed there" in some
    for said in (note, other, some):
        assert "abc1234" not in said and "22" not in said and "23rd" not in said
        assert "nbval" not in said
    # none of this notebook's cells failed: nothing to say
    assert helpers.failed_cells_note("book/part4/fixes.ipynb", str(path)) == ""


def test_the_readers_note_says_a_changed_cell_failed_at_its_earlier_version(tmp_path):
    path = _reference_failing_cell_22(tmp_path)
    ref = json.loads(path.read_text())
    changed = {"abc1234": {22: ("the timer", "timed a much smaller product",
                                "times a 4096x4096 product")}}
    note = helpers.failed_cells_note("book/gpus.ipynb", str(path), names=changed)
    assert note == (" The GPU reference run (G, d) executed an earlier version of the timer, "
                    "which timed a much smaller product, and that cell failed there (it stopped "
                    "with an error or a check of the text that did not hold; the run stores which "
                    "cells failed, not why, nor the figures they print). This version times a "
                    "4096x4096 product, and no GPU run has recorded it yet: what this section "
                    "says a GPU shows is a prediction.")
    assert "not yet passed" not in note and "abc1234" not in note and "22" not in note
    # a run with no failed cell of this notebook: nothing, whatever the names
    ok = dict(ref, steps={"nbval": {"failed": []}})
    path.write_text(json.dumps(ok))
    assert helpers.failed_cells_note("book/gpus.ipynb", str(path), names=changed) == ""
