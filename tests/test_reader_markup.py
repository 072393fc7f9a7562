"""The notebooks read well outside the book: scripts/reader_markup.py rewrites MyST into Markdown
(numbers through helpers.say), and a notebook rendered by nbconvert (what GitHub and JupyterLab
show, without Sphinx) has no raw role or directive left.

Until the integrator applies the converter to book/ (see its report), the rendering test runs on
the converter's output of the current notebooks, in memory; afterwards it checks them as they
are (READER_MARKUP_APPLIED below)."""
import copy
import functools
import importlib.util
import re
import sys

import nbformat
import pytest
from book_files import ROOT, toc_notebooks

import helpers
from helpers.prose import ClaimFailed, formatted

sys.path.insert(0, str(ROOT / "scripts"))
import book_links as links
import glued_prose as glued
import myst_markdown as myst

READER_MARKUP_APPLIED = True    # the integrator flips this once book/ is converted
# in rendered HTML a role's backticks have become <code>, a directive's fence a code block
RAW = re.compile(r"\{(?:glue(?::text)?|term|cite(?::[pt])?|numref|doc)\}|language-\{[\w-]+\}|"
                 r"(?:```|:::)\{[\w-]+\}")


@functools.lru_cache(maxsize=1)
def _script():
    spec = importlib.util.spec_from_file_location("reader_markup",
                                                  ROOT / "scripts" / "reader_markup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _notebook():
    nb = nbformat.v4.new_notebook(metadata={"course": {"gpus": 2}})
    glue = nbformat.v4.new_code_cell("import helpers\nhelpers.glue('x', 0.5, display=False)")
    glue.outputs = [nbformat.v4.new_output(
        "display_data", data={"application/papermill.record/text/plain": "0.5"},
        metadata={"scrapbook": {"name": "x", "mime_prefix": "application/papermill.record/"}})]
    fig = nbformat.v4.new_code_cell("plot()", metadata={"mystnb": {"figure": {"name": "fig-a"}}})
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Title\n\n```{runs-on} cpu gpus\n```\n\nA {term}`rank` "
                                      "and {cite:p}`li2020ddp`; {term}`rank`s, [a page]"
                                      "(../part2/scratch.ipynb#sec)."),
        glue,
        nbformat.v4.new_markdown_cell("## Result\n\nIt took {glue:text}`x:.2f` s, $\\frac{a}{b}$"
                                      " ({numref}`fig-a`).\n\nNo number here."),
        fig,
        _bookkeeping("helpers.claim(True, 'it holds')", "True"),
        nbformat.v4.new_markdown_cell("```{dropdown} Answer\nIt is {glue:text}`x:.0%`.\n```",
                                      metadata={"tags": ["solution"]}),
        nbformat.v4.new_markdown_cell("```{note}\nSee {doc}`../glossary`.\n```"),
    ]
    return nb


def _bookkeeping(source, result):
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["remove-cell"]})
    cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": result},
                                           execution_count=1)]
    return cell


RUN = dict(seconds=45.0, peak_bytes=3 * 2 ** 29, processes=3, machine="2 CPU cores, no GPU",
           date="2026-12-01")


@pytest.fixture
def recorded(monkeypatch):
    """The test notebook's run in the record (book/part1/x has none in runs.json)."""
    mod = _script()
    monkeypatch.setattr(myst.chapter_runs, "load", lambda path=None: {"book/part1/x":
                                                                      {"small": RUN}})
    return mod


def test_the_converter_writes_plain_markdown_and_say_cells(recorded):
    mod = recorded
    path = ROOT / "book" / "part1" / "x.ipynb"   # where the links are relative from
    new, problems = mod.convert(_notebook(), path)
    assert problems == []
    assert myst.raw_markup(new) == []
    md = [c.source for c in new.cells if c.cell_type == "markdown"]
    text = "\n".join(md)
    runs = myst.chapter_runs.notebook_line({"book/part1/x": {"small": RUN}}, "book/part1/x", 2)
    assert f"*Runs on: CPU, several GPUs.* {runs}" in text and "45 s" in runs, \
        "the run time and needs under the title, as the book's badge says them"
    assert "[ranks](" in text, "a plural is inside its link"
    assert f"[a page]({links.book_url()}book/part2/scratch.html#sec)" in text, "links absolute"
    kept = [c for c in new.cells if "helpers.claim" in c.source]
    assert kept[0].source.startswith(mod.BOOKKEEPING + "\n"), "bookkeeping folds in Colab"
    assert kept[0].metadata["cellView"] == "form" and kept[0].metadata["jupyter"][
        "source_hidden"], "and in JupyterLab and VS Code"
    assert kept[0].outputs == [], "no stray True under a claim"
    assert kept[0].metadata["jupyter"]["outputs_hidden"] and kept[0].metadata["collapsed"], \
        "a glue's record folded too (VS Code: 'No renderer could be found')"
    assert not first_code(new).metadata.get("jupyter", {}).get("outputs_hidden"), \
        "a teaching cell's outputs stay open"
    assert "book/glossary.html#term-rank)" in text and "[rank](" in text
    assert "[[Li et al., 2020](" in text and "bibliography.html#cite-li2020ddp" in text
    assert "> **Note.**" in text and "[Glossary](" in text
    assert "## Result" in md, "headings stay markdown (the page's table of contents)"
    says = [c for c in new.cells if c.get("metadata", {}).get("course", {}).get("prose")]
    assert len(says) == 2
    first = says[0]
    assert first.source.startswith("#@title") and 'helpers.say(r"""' in first.source
    assert "{x:.2f}" in first.source and "\\frac{{a}}{{b}}" in first.source
    assert "[the figure below]({book}book/part1/x.html#fig-a)" in " ".join(first.source.split()), \
        "a figure linked on the published page (an in-page #fig-a does nothing in a notebook)"
    assert first.metadata["tags"] == ["remove-input"]
    assert first.metadata["jupyter"]["source_hidden"] and first.metadata["cellView"] == "form"
    out = first.outputs[0]["data"]["text/markdown"]
    assert "It took 0.50 s, $\\frac{a}{b}$" in out, out
    assert says[1].metadata["tags"] == ["remove-input", "solution"]
    assert "<details>" in says[1].source and "It is 50%." in says[1].outputs[0]["data"][
        "text/markdown"]
    assert all(len(ln) <= 79 for c in says for ln in c.source.splitlines())
    again, _ = mod.convert(new, path)
    assert [c.source for c in again.cells] == [c.source for c in new.cells], "not idempotent"


def first_code(nb):
    return next(c for c in nb.cells if c.cell_type == "code")


def test_a_figure_named_at_a_sentence_start_is_capitalised(recorded):
    """{numref} becomes "the figure above"; where it starts a sentence (in prose converted now,
    in prose converted before, and in a say() cell's text and stored Markdown), "The"."""
    mod = recorded
    path = ROOT / "book" / "part1" / "x.ipynb"
    nb = _notebook()
    nb.cells[2].source = nb.cells[2].source.replace(" ({numref}`fig-a`).", (
        ". It is small. {numref}`fig-a` shows it, as ({numref}`fig-a`) and e.g. "
        "{numref}`fig-a` do."))
    nb.cells.append(nbformat.v4.new_markdown_cell("Done.\n{numref}`fig-a` again: in\n"
                                                  "{numref}`fig-a`."))
    new, problems = mod.convert(nb, path)
    assert problems == []
    say = [c for c in new.cells if c.get("metadata", {}).get("course", {}).get("prose")][0]
    fig = f"{links.book_url()}book/part1/x.html#fig-a"
    for text, at in ((say.source, "{book}book/part1/x.html#fig-a"),
                     (say.outputs[0]["data"]["text/markdown"], fig)):
        flat = " ".join(text.split())
        assert f"small. [The figure below]({at}) shows" in flat, flat
        assert f"as ([the figure below]({at}))" in flat and "e.g. [the figure below]" in flat
    last = new.cells[-1].source
    assert last == (f"Done.\n[The figure above]({fig}) again: in\n[the figure above]({fig}).")
    # notebooks converted before this rule: their Markdown, say() text and stored output
    old = copy.deepcopy(new)
    old.cells[-1].source = last.replace("The figure", "the figure")
    old_say = [c for c in old.cells if c.get("metadata", {}).get("course", {}).get("prose")][0]
    old_say.source = old_say.source.replace("[The figure", "[the figure")
    # and an in-page link (#fig-a), as older notebooks wrote it
    old_say.outputs[0]["data"]["text/markdown"] = "[the figure below](#fig-a) shows it."
    again, _ = mod.convert(old, path)
    again_say = [c for c in again.cells if c.get("metadata", {}).get("course", {})
                 .get("prose")][0]
    assert again.cells[-1].source == last and again_say.source == say.source
    assert again_say.outputs[0]["data"]["text/markdown"] == f"[The figure below]({fig}) shows it."


def test_text_used_before_it_is_glued_is_reported(recorded):
    mod = recorded
    nb = _notebook()
    nb.cells.insert(0, nb.cells.pop(2))   # the result before the glue
    _, problems = mod.convert(nb, ROOT / "book" / "part1" / "x.ipynb")
    assert any("uses ['x'] before the cell that glues them" in p for p in problems), problems


def test_a_display_formula_over_several_lines_stays_in_place():
    """A $$...$$ block over lines in a markdown cell without numbers stays whole and in order
    (its middle lines once moved above it: a second run rewrote the formula)."""
    text = "Before:\n\n$$a \\to\nb \\to\nc$$\n\nafter."
    assert glued.split_blocks(text) == ["Before:", "$$a \\to\nb \\to\nc$$", "after."]


def test_links_cover_their_word_and_book_pages_are_linked_by_address():
    assert links.whole_word_links("[bucket](u#a)s and [x](v) s") == "[buckets](u#a) and [x](v) s"
    ctx = links.Context(ROOT / "book" / "part5" / "fsdp2.ipynb")
    url = links.book_url()
    assert links.absolute_links("[m](../part6/mesh2d.ipynb) [g](glossary.md) [w](https://x.org/"
                              "a.md) [h](#here)", ctx) == \
        f"[m]({url}book/part6/mesh2d.html) [g](glossary.md) [w](https://x.org/a.md) " \
        f"[h]({url}book/part5/fsdp2.html#here)"
    assert ctx.problems == ["link glossary.md: no page book/part5/glossary in _toc.yml"]
    assert links.absolute_links("[m](../part6/mesh2d.ipynb) [f](#fig-a)", ctx, field=True) == \
        "[m]({book}book/part6/mesh2d.html) [f]({book}book/part5/fsdp2.html#fig-a)"


def test_a_say_text_made_too_wide_by_a_figure_link_is_refilled():
    """An in-page figure link (#fig-b) in an older notebook's say() cell becomes the published
    page's address; where a line then passes 79 columns the text is re-filled (the notebooks'
    lint)."""
    mod = _script()
    ctx = links.Context(ROOT / "book" / "part6" / "pipeline_dist.ipynb")
    words = "word " * 12
    cell = nbformat.v4.new_code_cell(
        source=glued.TITLE + '\nhelpers.say(r"""\nOn the clock ([the figure above](#fig-b), '
        f'crosses)\n{words}{{x:.2f}}.\n""")', metadata={"course": {"prose": True}})
    mod.relink_prose(cell, ctx)
    assert "({book}book/part6/pipeline_dist.html#fig-b)" in cell.source
    assert all(len(ln) <= glued.WIDTH for ln in cell.source.splitlines()), cell.source
    assert cell.source.startswith(glued.TITLE + '\nhelpers.say(r"""\nOn the clock')
    assert cell.source.endswith('{x:.2f}.\n""")')


def test_claims_show_nothing_and_counted_words_agree(monkeypatch):
    assert helpers.claim(True, "it holds") is None, "a claim cell would print True"
    monkeypatch.setenv("COURSE_CLAIMS", "strict")
    with pytest.raises(ClaimFailed, match="it holds"):
        helpers.claim(False, "it holds", a=1.0)
    assert formatted("over {n:d|round|rounds}", {"n": 1}) == "over 1 round"
    assert formatted("over {n:d|round|rounds}", {"n": 3}) == "over 3 rounds"
    assert formatted("{n:.1f|second|seconds}", {"n": "2.5"}) == "2.5 seconds"
    with pytest.raises(ValueError, match="singular"):
        formatted("{n:d|rounds}", {"n": 3})


def test_a_readers_run_that_differs_is_told_beside_the_prose(monkeypatch, capsys):
    """Outside `make outputs` and CI a failed claim does not stop Run All: the reader's next
    paragraph says their run differs from the sentence, once."""
    monkeypatch.delenv("COURSE_CLAIMS", raising=False)
    monkeypatch.setattr("helpers.config.in_notebook", lambda: False)
    assert helpers.claim(False, "two are faster than one", ratio=0.8) is None
    assert "two are faster than one" in capsys.readouterr().err
    helpers.say("Two workers were slower.")
    out = capsys.readouterr().out
    assert "Your run differs from the text" in out and "ratio=0.8" in out
    assert out.rstrip().endswith("Two workers were slower.")
    helpers.say("Next paragraph.")
    assert "differs" not in capsys.readouterr().out, "the note is shown once"


def test_stored_and_tested_runs_refuse_a_failed_claim():
    """`make outputs` (scripts/execute_notebooks.py) and `make test` run claims strictly."""
    exe = (ROOT / "scripts" / "execute_notebooks.py").read_text()
    assert 'os.environ["COURSE_CLAIMS"] = "strict"' in exe
    make = (ROOT / "Makefile").read_text()
    for target in ("test", "test-notebooks", "test-py"):
        assert f"{target}: export COURSE_CLAIMS := strict" in make, target


def test_every_notebook_is_converted():
    """Fails while a notebook holds MyST, a relative link, a plural outside its link, an unfolded
    bookkeeping cell or a "Runs on" line without the run that book/_ext/runs.json records: run
    `python scripts/reader_markup.py` (`make outputs` refreshes the run line itself)."""
    assert _script().main(["--check"]) == 0, "run: python scripts/reader_markup.py"


def test_say_fills_in_this_runs_values(capsys):
    helpers.glue("reader_test_v", 0.123456, display=False)
    assert formatted("v={reader_test_v:.2f} {{k}}") == "v=0.12 {k}"
    assert formatted("{n:.1f}", {"n": "2.25"}) == "2.2", "text glued numbers format too"
    with pytest.raises(KeyError, match="no cell has glued yet"):
        formatted("{never_glued}")
    helpers.say("value {reader_test_v:.3f}")
    assert "value 0.123" in capsys.readouterr().out


def _glue_outputs():
    """The display outputs (data, metadata) of a few glue calls, as a kernel stores them."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    InteractiveShell.instance()
    with capture_output() as got:
        helpers.glue("reader_glue_hidden", 0.5, display=False)
        helpers.glue("reader_glue_words", "a b", display=False)
        helpers.glue("reader_glue_shown", [1, 2])
    return [(o.data, o.metadata) for o in got.outputs], got.stdout


def test_glue_without_myst_nb_stores_what_myst_nb_stores(monkeypatch):
    """A GPU machine's Python without myst-nb failed nbval on a checked cell that glues
    ("Missing output fields: application/papermill.record/text/plain"): the fallback printed
    instead. Without myst-nb the outputs must be myst-nb's, record for record."""
    pytest.importorskip("myst_nb")
    with_myst = _glue_outputs()
    assert with_myst[0][0] == ({"application/papermill.record/text/plain": "0.5"},
                               {"scrapbook": {"name": "reader_glue_hidden",
                                              "mime_prefix": "application/papermill.record/"}})
    monkeypatch.setitem(sys.modules, "myst_nb", None)   # import myst_nb now raises
    with pytest.raises(ImportError):
        import myst_nb  # noqa: F401
    assert _glue_outputs() == with_myst


def _rendered_text(nb):
    """What nbconvert's HTML shows of the markdown cells and the Markdown outputs, as text."""
    from nbconvert import HTMLExporter
    html, _ = HTMLExporter(template_name="basic").from_notebook_node(nb)
    html = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", html, flags=re.S)
    html = re.sub(r'<div class="jp-InputArea[^"]*jp-Cell-inputArea".*?</div>\s*</div>', " ",
                  html, flags=re.S)   # the code cells' source: Python, not prose
    return re.sub(r"<(?![^>]*language-\{)[^>]+>", " ", html)   # tags out, directives' kept


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_renders_without_raw_markup(path):
    nb = nbformat.read(path, as_version=4)
    if not READER_MARKUP_APPLIED:
        nb, _ = _script().convert(nb, path)
    prose = nbformat.v4.new_notebook()
    prose.cells = [c for c in nb.cells if c.cell_type == "markdown"
                   or c.get("metadata", {}).get("course", {}).get("prose")]
    for c in prose.cells:
        if c.cell_type == "code":
            c.source = ""   # only its output is prose
    found = RAW.findall(_rendered_text(prose))
    assert not found, f"{path.relative_to(ROOT)}: raw MyST left: {found[:5]}"


def test_links_into_the_book_are_a_field_that_fits_the_page():
    """{book} in a say() text is the published book (_config.yml's baseurl), so a glossary link
    fits 79 columns; a display formula over several lines stays as written, and the prose after
    it is re-filled."""
    from helpers import prose
    assert prose.BOOK_URL == links.book_url()
    assert prose.formatted("[x]({book}glossary.html#term-x)") == \
        f"[x]({links.book_url()}glossary.html#term-x)"
    assert links.book_field(f"see [x]({links.book_url()}a.html)") == "see [x]({book}a.html)"
    text = "$$a = b\n+ c:$$\n\n" + " ".join(["word"] * 40)
    out = glued.rewrap(text)
    assert out.startswith("$$a = b\n+ c:$$\n\n") and max(map(len, out.split("\n"))) <= 79


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_bookkeeping_cells_show_nothing_outside_the_book(path):
    """A folded bookkeeping cell (tagged remove-cell: glue, claim) displays nothing in JupyterLab,
    Colab or VS Code: `glue(..., display=False)` stores only papermill's record, which no viewer
    renders; a value it shows would sit under the fold's title as a stray line."""
    nb = nbformat.read(path, as_version=4)
    shown = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "remove-cell" not in cell.metadata.get("tags", []):
            continue
        if cell.metadata.get("course", {}).get("figure_caption"):
            continue    # a figure's caption with a glued value: the book has it under the image
        for out in cell.get("outputs", []):
            kinds = [k for k in out.get("data", {})
                     if not k.startswith("application/papermill.record")]
            if out.output_type == "stream" or kinds:
                shown.append((index, out.output_type, kinds))
    assert not shown, (f"{path.relative_to(ROOT)}: bookkeeping cells display {shown[:5]}: pass "
                       "display=False to glue, end the line with ';' or print nothing")


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_prose_counts_say_their_plural(path):
    """"3 round(s)" in a sentence: say's plural format (`{n:d|round|rounds}`) writes the word."""
    nb = nbformat.read(path, as_version=4)
    found = []
    for index, cell in enumerate(nb.cells):
        texts = [cell.source] if cell.cell_type == "markdown" else [
            str(o.get("data", {}).get("text/markdown", ""))
            for o in cell.get("outputs", [])]
        found += [(index, m) for t in texts for m in re.findall(r"\b\d[\d,.]* \w+\(s\)", t)]
    assert not found, f"{path.relative_to(ROOT)}: {found[:5]}"


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_say_cell_is_prose(path):
    """A cell that displays prose (`helpers.say(`), converted or written by hand, carries the
    prose metadata: folded in JupyterLab and Colab (no template with raw {fields} above the
    text), and kept with its text in the student edition (scripts/student_edition.py)."""
    nb = nbformat.read(path, as_version=4)
    bare = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
            and "helpers.say(" in c.source
            and not (c.metadata.get("course", {}).get("prose")
                     and c.metadata.get("jupyter", {}).get("source_hidden")
                     and c.metadata.get("cellView") == "form")]
    assert not bare, (f"{path.relative_to(ROOT)}: say cells {bare} lack the prose metadata "
                      "(course.prose, jupyter.source_hidden, cellView form)")


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_stored_output_was_run(path):
    """nbval fails a cell that holds outputs but no execution count ("Unrun reference cell has
    outputs"): a cell reader_markup wrote, or one edited by hand, after the notebook was stored.
    Caught here in seconds rather than by the notebook run of CI."""
    nb = nbformat.read(path, as_version=4)
    unrun = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.get("outputs")
             and c.get("execution_count") is None]
    assert not unrun, (f"{path.relative_to(ROOT)}: cells {unrun} hold outputs but were not run: "
                       f'store it again (make outputs NB="{path.relative_to(ROOT)}")')
