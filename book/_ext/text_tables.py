"""Text outputs whose lines rely on alignment keep it: on a phone they scroll sideways, not wrap.

The course's CSS wraps text outputs at the column (a long "Running ... at reduced size" line
stays readable on a phone), which turns a table printed with padded columns, or code a cell
prints, into noise at 390 px. An output of two or more lines of which any one is indented (code
from `inspect.getsource`, an `nn.Module` or tensor repr, right-aligned labels padded on the
left, an indented detail under its heading) or has a gap of two spaces or more between words
(padded columns, labels padded to a common colon) relies on its alignment: it gets the class
`text-table`; book/_css/course.css keeps it as printed, in a box that scrolls sideways
(pydata-sphinx-theme gives a scrolling box a tab stop). tests/browser (check_text_tables, on
every page) finds such an output wrapped at phone width, by the same test in JavaScript.
"""
import re

from docutils import nodes

LEADING = re.compile(r"^[ \t]+\S")   # indented: code, a repr, a right-aligned label
GAP = re.compile(r"\S(?: {2,}|\t)\S")  # padded: columns, labels padded to a common colon
OUTPUT_KINDS = {"stream", "text_plain"}   # myst-nb's classes of text outputs


def aligned(text):
    """True for text whose lines rely on leading or inner alignment (a table, code, a repr)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return len(lines) >= 2 and any(LEADING.match(ln) or GAP.search(ln) for ln in lines)


def mark_tables(app, doctree, docname):
    for node in doctree.findall(nodes.literal_block):
        classes = node.get("classes", [])
        if "output" in classes and OUTPUT_KINDS & set(classes) and aligned(node.astext()):
            node["classes"] = [*classes, "text-table"]


def setup(app):
    app.connect("doctree-resolved", mark_tables)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
