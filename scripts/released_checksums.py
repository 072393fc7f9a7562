"""nbgrader's tamper check, measured against the check cell as released.

`scripts/student_edition.py` copies this file into the nbgrader course folder and its
`nbgrader_config.py` puts `OverwriteCellsAsReleased` in place of nbgrader's `OverwriteCells` for
`nbgrader autograde` (book/teachers.md, "Autograding with nbgrader").

Why: each check cell of the nbgrader source ends in a `### BEGIN/END HIDDEN TESTS` block (the
check run again from a fresh import of the course). `nbgrader generate_assignment` stores the
cell's checksum in the gradebook *before* `ClearHiddenTests` strips that block from the handout,
so stock `OverwriteCells` finds every untouched check cell of every submission "changed" and logs
"Attribute 'checksum' for cell check-... has changed!" (jupyter/nbgrader#1961): the warning that
should mean tampering says nothing. Here a locked cell whose source is exactly the released one
(the gradebook's source with the hidden block removed, by nbgrader's own `ClearHiddenTests`) gets
the hidden block back silently; any other edit goes on to stock `OverwriteCells`, which logs the
warning and restores the cell as before.
"""
from nbformat import NotebookNode
from nbgrader.api import MissingEntry
from nbgrader.converters import Autograde
from nbgrader.preprocessors import ClearHiddenTests, OverwriteCells


def released_source(source, parent=None):
    """What `nbgrader generate_assignment` hands out of a cell whose source (hidden tests
    included) is `source`."""
    cell = NotebookNode(source=source)
    ClearHiddenTests(parent=parent)._remove_hidden_test_region(cell)
    return cell.source


class OverwriteCellsAsReleased(OverwriteCells):
    """`OverwriteCells`, with a locked cell compared to its released form: an untouched check
    cell is restored without a warning, an edited one is reported (and restored) as nbgrader
    always does."""

    def preprocess_cell(self, cell, resources, cell_index):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id is not None:
            try:
                source_cell = self.gradebook.find_source_cell(
                    grade_id, self.notebook_id, self.assignment_id)
            except MissingEntry:
                source_cell = None   # stock OverwriteCells warns and drops the id
            if (source_cell is not None and source_cell.locked
                    and cell.cell_type == source_cell.cell_type
                    and cell.source == released_source(source_cell.source, parent=self)):
                cell.source = source_cell.source   # the hidden block back: nothing was edited
        return super().preprocess_cell(cell, resources, cell_index)


def sanitize_preprocessors():
    """nbgrader's default `Autograde.sanitize_preprocessors`, `OverwriteCells` replaced."""
    default = Autograde.class_traits()["sanitize_preprocessors"].default()
    return [OverwriteCellsAsReleased if p is OverwriteCells else p for p in default]
