"""Outside the book a notebook shows a figure's image alone: scripts/reader_markup.py writes its
caption and alt text (myst-nb metadata of the figure cell) in a Markdown cell under it, which the
book removes (scripts/figure_captions.py). Every notebook is checked converted by
tests/test_reader_markup.py::test_every_notebook_is_converted; here, what a cell holds."""
import importlib.util
import json

import nbformat
import pytest
from book_files import ROOT, toc_notebooks


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _figure(caption, alt, cell_id="f1"):
    cell = nbformat.v4.new_code_cell("plot()", metadata={"mystnb": {
        "figure": {"caption": caption, "name": "fig-a"}, "image": {"alt": alt}}})
    cell["id"] = cell_id
    return cell


def test_a_caption_cell_follows_each_figure_and_is_rebuilt_not_added_again():
    fc = _script("figure_captions")
    cells = [nbformat.v4.new_markdown_cell("# T"), _figure("Loss over steps.", "A falling curve"),
             nbformat.v4.new_code_cell("x = 1")]
    once = fc.with_captions(cells)
    assert [c.cell_type for c in once] == ["markdown", "code", "markdown", "code"]
    cap = once[2]
    assert cap.source == "**Figure.** Loss over steps.\n\n*The image:* A falling curve."
    assert cap.metadata["tags"] == ["remove-cell"] and cap["id"] == "f1-caption"
    once[1].metadata["mystnb"]["figure"]["caption"] = "Loss over steps, smoothed."
    twice = fc.with_captions(once)
    assert len(twice) == 4 and twice[2].source.startswith("**Figure.** Loss over steps, smoothed.")
    assert fc.with_captions(twice) == twice


def test_the_caption_comes_after_the_bookkeeping_under_the_figure():
    """A bookkeeping cell right under a figure may glue what its caption shows."""
    fc = _script("figure_captions")
    glue = nbformat.v4.new_code_cell("glue('x', 1)", metadata={"tags": ["remove-cell"]})
    cells = fc.with_captions([_figure("C.", "A"), glue, nbformat.v4.new_markdown_cell("Text")])
    assert [fc.is_caption(c) for c in cells] == [False, False, True, False]
    assert cells[1] is glue


def test_a_long_caption_is_wrapped_and_a_cell_without_one_gets_none():
    fc = _script("figure_captions")
    text = fc.caption_text(_figure("word " * 40, "").metadata)
    assert "*The image:*" not in text and max(map(len, text.splitlines())) <= fc.WIDTH
    assert fc.caption_text({"mystnb": {"figure": {"name": "fig-b"}}}) is None


def test_the_converter_writes_them(monkeypatch):
    rm = _script("reader_markup")
    nb = nbformat.v4.new_notebook(cells=[_figure("Caption with a {term}`rank`.", "Bars")])
    new, problems = rm.convert(nb, ROOT / "book" / "part1" / "x.ipynb")
    assert not problems and len(new.cells) == 2
    assert new.cells[1].source.startswith("**Figure.** Caption with a [rank](")
    assert "{term}" not in new.cells[1].source


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: p.stem)
def test_every_figure_has_its_caption_cell(path):
    cells = json.loads(path.read_text())["cells"]
    kept = [c for c in cells if "remove-cell" not in c.get("metadata", {}).get("tags", [])
            or c.get("metadata", {}).get("course", {}).get("figure_caption")
            or c["cell_type"] != "code"]    # what a reader sees, bookkeeping folded
    for i, cell in enumerate(kept):
        if cell.get("metadata", {}).get("mystnb", {}).get("figure"):
            nxt = kept[i + 1] if i + 1 < len(kept) else {}
            assert nxt.get("metadata", {}).get("course", {}).get("figure_caption") == \
                cell.get("id"), f"{path.name} cell {i}: no caption cell under the figure " \
                "(run scripts/reader_markup.py)"


def test_a_caption_with_a_glued_value_stays_a_shown_caption_and_is_not_added_again():
    """A caption that shows a glued value becomes a say cell; it keeps its caption mark, so the
    next conversion rebuilds it instead of adding a second one, and it is not folded like glue."""
    rm = _script("reader_markup")
    glue = nbformat.v4.new_code_cell("import helpers\nhelpers.glue('src', 'a run', display=False)",
                                     metadata={"tags": ["remove-cell"]})
    glue["id"] = "g1"
    glue.outputs = [nbformat.v4.new_output("display_data", data={
        "application/papermill.record/text/plain": "'a run'"}, metadata={"scrapbook": {
            "name": "src", "mime_prefix": "application/papermill.record/"}})]
    nb = nbformat.v4.new_notebook(cells=[glue, _figure("Roofs from {glue:text}`src`.", "Lines")])
    path = ROOT / "book" / "part1" / "x.ipynb"
    once, problems = rm.convert(nb, path)
    assert not problems
    caps = [c for c in once.cells if c.metadata.get("course", {}).get("figure_caption")]
    said = [c for c in caps if c.cell_type == "code"]     # the alt text stays Markdown
    assert len(said) == 1 and "helpers.say" in said[0].source
    assert not said[0].metadata.get("jupyter", {}).get("outputs_hidden"), "folded like glue"
    said[0].execution_count = 7                         # as `make outputs` leaves it
    twice, _ = rm.convert(once, path)
    assert [c.source for c in twice.cells] == [c.source for c in once.cells]
    again = [c for c in twice.cells if c.get("id") == said[0].get("id")]
    assert again[0].execution_count == 7, "a rebuilt caption lost its run (nbval refuses it)"
