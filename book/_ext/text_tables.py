"""Column-aligned text outputs keep their columns: on a phone they scroll sideways, not wrap.

The course's CSS wraps text outputs at the column (a long "Running ... at reduced size" line
stays readable on a phone), which turns a table printed with padded columns, or code a cell
prints, into noise at 390 px. Such an output (two or more lines with a gap of two spaces or more
between words, or indented like code) gets the class `text-table`; book/_css/course.css keeps
it as printed, in a box that scrolls sideways (pydata-sphinx-theme gives a scrolling box a tab
stop). tests/browser (check_text_tables) finds a wrapped one at phone width.
"""
import re

from docutils import nodes

GAP = re.compile(r"\S {2,}\S")
INDENTED = re.compile(r"^(?: {4}|\t)\S")
OUTPUT_KINDS = {"stream", "text_plain"}   # myst-nb's classes of text outputs


def aligned(text):
    """True for text whose columns or indentation carry meaning (a table, code)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (sum(bool(GAP.search(ln)) for ln in lines) >= 2
            or sum(bool(INDENTED.match(ln)) for ln in lines) >= 2)


def mark_tables(app, doctree, docname):
    for node in doctree.findall(nodes.literal_block):
        classes = node.get("classes", [])
        if "output" in classes and OUTPUT_KINDS & set(classes) and aligned(node.astext()):
            node["classes"] = [*classes, "text-table"]


def setup(app):
    app.connect("doctree-resolved", mark_tables)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
