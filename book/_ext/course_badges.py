"""A one-line "runs on" badge per chapter with its measured run time and needs, and the table of
every chapter's needs on the landing page.

Chapter authors put this under the chapter title (a markdown cell of the notebook)::

    ```{runs-on} cpu gpu gpus
    ```

or, as plain Markdown that reads the same outside the book (scripts/reader_markup.py writes it)::

    *Runs on: CPU, one GPU, several GPUs.*

The arguments say where the chapter runs: ``cpu`` (a CPU-only laptop), ``gpu`` (one GPU),
``gpus`` (several GPUs). The badge adds how long the whole notebook took at the CPU default size
(what a reader's laptop runs), in quick mode and at full size where measured, and what it needs
(peak memory, processes, the GPUs it asks for). Nobody types these: `make outputs` measures the
run whose outputs the pages show and records it in book/_ext/runs.json (book/_ext/chapter_runs.py).
The landing page's ```{chapter-runs}``` directive makes the same numbers a table, one row per
chapter of _toc.yml. A chapter without a run at the CPU default size, or without its GPU count,
fails the build (-W) with a message naming the command that records one.
"""
import pathlib
import sys

import yaml
from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import chapter_runs

logger = logging.getLogger(__name__)

PLACES = {"cpu": "CPU", "gpu": "one GPU", "gpus": "several GPUs"}
LINE_PREFIX = "Runs on: "
RUN_TIME = " Run time: "   # chapter_runs.notebook_line, after the places in a notebook


class runs_on_node(nodes.General, nodes.Element):
    """Placeholder: filled in when the page is written (doctree-resolved)."""


class chapter_runs_node(nodes.General, nodes.Element):
    """Placeholder for the table: the chapters' titles are known once every page is read."""


class RunsOn(SphinxDirective):
    required_arguments = 1
    optional_arguments = len(PLACES) - 1
    has_content = False

    def run(self):
        bad = [a for a in self.arguments if a not in PLACES]
        if bad:
            raise self.error(f"runs-on: unknown {bad}; use any of {list(PLACES)}")
        node = runs_on_node(places=[a for a in PLACES if a in self.arguments],
                            docname=self.env.docname)
        self.set_source_info(node)
        self.env.note_dependency(str(chapter_runs.RECORD))
        return [node]


class ChapterRuns(SphinxDirective):
    """```{chapter-runs}```: every notebook chapter's run time and needs (book/_ext/runs.json)."""
    has_content = False

    def run(self):
        self.env.note_dependency(str(chapter_runs.RECORD))
        for path in toc_notebooks(self.env.srcdir):
            self.env.note_dependency(str(path))
        node = chapter_runs_node()
        self.set_source_info(node)
        return [node]


def toc_notebooks(srcdir):
    """The notebooks of _toc.yml, in its order, as paths."""
    srcdir = pathlib.Path(srcdir)
    toc = yaml.safe_load((srcdir / "_toc.yml").read_text())
    files = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(toc.get("parts", []))
    stems = [f.removesuffix(".ipynb").removesuffix(".md") for f in files]
    return [srcdir / f"{s}.ipynb" for s in stems if (srcdir / f"{s}.ipynb").is_file()]


def toc_parts(srcdir):
    """[(caption, [file without suffix, ...])] of _toc.yml's parts, in order."""
    toc = yaml.safe_load((pathlib.Path(srcdir) / "_toc.yml").read_text())
    return [(part.get("caption", ""), [c["file"].removesuffix(".ipynb").removesuffix(".md")
                                       for c in part.get("chapters", []) if "file" in c])
            for part in toc.get("parts", [])]


def places_of_line(text):
    """['cpu', 'gpus'] for the line "Runs on: CPU, several GPUs." (what scripts/reader_markup.py
    writes for ```{runs-on} cpu gpus```, so that a notebook outside the book says it too), also
    when the notebook's "Run time: ..." sentence follows it; None for any other text."""
    text = text.strip()
    if RUN_TIME in text:   # the notebook's own run-time sentence follows (the badge says it)
        text = text.split(RUN_TIME, 1)[0].rstrip()
    if not (text.startswith(LINE_PREFIX) and text.endswith(".")):
        return None
    words = [w.strip() for w in text[len(LINE_PREFIX):-1].split(",")]
    names = {v: k for k, v in PLACES.items()}
    if not words or any(w not in names for w in words):
        return None
    return [names[w] for w in words]


def badge_lines(app, doctree):
    """The plain "Runs on: ..." line of a chapter becomes the badge (as the directive does)."""
    docname = app.env.docname
    for para in list(doctree.findall(nodes.paragraph)):
        places = places_of_line(para.astext())
        if places:
            app.env.note_dependency(str(chapter_runs.RECORD))
            para.replace_self(runs_on_node(places=places, docname=docname))


def _badge(text, kind):
    return nodes.inline(text, text, classes=["sd-badge", f"sd-bg-{kind}", f"sd-bg-text-{kind}"])


def _record(app):
    """The record as this build read it (once per build: the app, not the pickled env)."""
    if getattr(app, "course_runs", None) is None:
        app.course_runs = chapter_runs.load()
    return app.course_runs


def _source(app, docname):
    return pathlib.Path(app.env.doc2path(docname))


def resolve_badges(app, doctree, docname):
    for node in doctree.findall(runs_on_node):
        para = nodes.paragraph(classes=["runs-on"])
        para += nodes.strong("Runs on: ", "Runs on: ")
        for place in node["places"]:
            para += _badge(PLACES[place], "primary")
            para += nodes.Text(" ")
        path = _source(app, node["docname"])
        if path.suffix == ".ipynb":
            try:
                times, needs = chapter_runs.badge_text(_record(app), node["docname"],
                                                       chapter_runs.gpus_wanted(path))
            except chapter_runs.MissingRun as e:
                logger.warning(str(e), location=node)
                times, needs = "not measured", "not measured"
            binder = chapter_runs.binder_text(_record(app), node["docname"])
            for label, value in (("Run time", times), ("Needs", needs), ("Binder", binder)):
                # one span per fact: a phone gives each its own line (book/_css/course.css)
                fact = nodes.inline(classes=["runs-on-fact"])
                fact += nodes.Text(f"  {label}: ")
                fact += nodes.emphasis("", value + ".")
                para += fact
        node.replace_self(para)


def _table(head, rows):
    table = nodes.table(classes=["chapter-runs"])
    group = nodes.tgroup(cols=len(head))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in head)
    thead, tbody = nodes.thead(), nodes.tbody()
    for part, cells_of in ((thead, [head]), (tbody, rows)):
        for cells in cells_of:
            row = nodes.row()
            for cell in cells:
                entry = nodes.entry()
                entry += cell if isinstance(cell, nodes.paragraph) else nodes.paragraph(
                    text=cell)
                row += entry
            part += row
    group += thead
    group += tbody
    return table


def resolve_table(app, doctree, docname):
    for node in list(doctree.findall(chapter_runs_node)):
        record, chapters = _record(app), []
        srcdir = pathlib.Path(app.env.srcdir)
        try:
            for path in toc_notebooks(srcdir):
                doc = path.relative_to(srcdir).with_suffix("").as_posix()
                title = app.env.titles[doc].astext() if doc in app.env.titles else doc
                chapters.append((doc, title, chapter_runs.gpus_wanted(path)))
            rows = chapter_runs.table_rows(record, chapters)
        except chapter_runs.MissingRun as e:
            logger.warning(str(e), location=node)
            node.replace_self(nodes.paragraph(text=f"(no table: {e})"))
            continue
        linked = []
        for (doc, _, _), row in zip(chapters, rows):
            ref = nodes.reference("", row[0], internal=True,
                                  refuri=app.builder.get_relative_uri(docname, doc))
            linked.append((nodes.paragraph("", "", ref), *row[1:]))
        docs = [c[0] for c in chapters]
        where, when = chapter_runs.machines(record, docs)
        full = ("The full size's run times (on a GPU machine) are in the last column."
                if chapter_runs.any_full(record, docs) else
                "No chapter has been run at full size (on a GPU machine) yet.")
        caption = nodes.paragraph(text=(
            f"Measured at the {chapter_runs.MODES[chapter_runs.REQUIRED]} on {where}, {when}; "
            "peak memory of the notebook's kernel and every process it starts, added up; the "
            f"GPUs are what the chapter asks for (fewer are simulated). {full}"))
        parts = [(caption_of, [(d, srcdir / f"{d}.ipynb") for d in files
                               if (srcdir / f"{d}.ipynb").is_file()])
                 for caption_of, files in toc_parts(srcdir)]
        by_part = nodes.paragraph(text=(
            "By part: its chapters' run times above added up, and its exercises with the time "
            "each announces added up (a reader's time, besides the machine's)."))
        node.replace_self([_table(chapter_runs.table_head(record, docs), linked), caption,
                           _table(chapter_runs.PART_HEAD,
                                  chapter_runs.part_rows(record, parts)), by_part])


def binder_button(app, pagename, templatename, context, doctree):
    """No Binder launch button on a chapter whose quick-mode run does not fit Binder's memory
    (chapter_runs.fits_binder). Runs after sphinx-book-theme adds the launch buttons (priority
    501)."""
    path = pathlib.Path(app.srcdir) / f"{pagename}.ipynb"
    if not path.is_file() or chapter_runs.fits_binder(_record(app), pagename):
        return
    for group in context.get("header_buttons", []):
        if group.get("label") == "launch-buttons":
            group["buttons"] = [b for b in group.get("buttons", []) if b.get("text") != "Binder"]


def setup(app):
    app.connect("html-page-context", binder_button, priority=502)
    app.add_node(runs_on_node)
    app.add_node(chapter_runs_node)
    app.add_directive("runs-on", RunsOn)
    app.add_directive("chapter-runs", ChapterRuns)
    app.connect("doctree-read", badge_lines)
    app.connect("doctree-resolved", resolve_badges)
    app.connect("doctree-resolved", resolve_table)
    return {"version": "2.0", "parallel_read_safe": True, "parallel_write_safe": True}
