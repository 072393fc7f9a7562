"""A one-line "runs on" badge per chapter, with the measured time its notebook takes.

Chapter authors put this under the chapter title (a markdown cell of the notebook)::

    ```{runs-on} cpu gpu gpus
    ```

or, as plain Markdown that reads the same outside the book (scripts/reader_markup.py writes it)::

    *Runs on: CPU, one GPU, several GPUs.*

The arguments say where the chapter runs: ``cpu`` (a CPU-only laptop), ``gpu`` (one GPU),
``gpus`` (several GPUs). The line also shows how long the whole notebook took to execute, in
quick mode (COURSE_QUICK=1) and at full size (a GPU, or COURSE_FULL=1). Nobody types these times:
every book build executes the notebooks (``execute_notebooks: force``), myst-nb measures each
run, and this extension stores the measurement in ``_build/timings.json`` (never a tracked file:
a build leaves the work tree clean) under the mode of that build, with the machine and the date,
on top of the committed record ``book/_ext/timings.json``. A build in the other mode (CI is
quick, a GPU build is full) fills in the other column; to publish a measurement, copy
``_build/timings.json`` over ``book/_ext/timings.json`` and commit it. A mode never measured says
so. A build with execution off (``make test-book``) measures nothing and shows the record.
A build on a CPU without COURSE_QUICK runs the scaled-down sizes (helpers.choose) and is shown as
such when measured. The times are those of the machine named beside them, whatever else it ran.
"""
import datetime
import json
import os
import pathlib

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

RECORD = pathlib.Path(__file__).resolve().parent / "timings.json"   # committed, read only


def timings_path(app):
    """Where this build writes its measurements: _build/timings.json beside _build/html."""
    out = pathlib.Path(app.outdir).resolve()
    return (out.parent if out.name == "html" else out) / "timings.json"
PLACES = {"cpu": "CPU", "gpu": "one GPU", "gpus": "several GPUs"}
MODES = {"quick": "quick mode", "full": "full size", "small": "scaled down (no GPU)"}


def _flag(name):   # the same switch as helpers.config
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def build_mode():
    """(mode, machine) of this build: the sizes helpers.choose picks, and where they ran."""
    try:
        import torch
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        gpu = f"{n} x {torch.cuda.get_device_name(0)}" if n else "no GPU"
    except Exception:  # noqa: BLE001 - no torch: no GPU either
        n, gpu = 0, "no GPU"
    machine = f"{os.cpu_count()} CPU cores, {gpu}"
    if _flag("COURSE_QUICK"):
        return "quick", machine
    return ("full" if n or _flag("COURSE_FULL") else "small"), machine


def fmt_seconds(s):
    s = round(s)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"


def _read(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def load_timings(app=None):
    """The committed record, updated by what earlier builds into the same _build measured."""
    timings = _read(RECORD)
    if app is not None:
        for doc, modes in _read(timings_path(app)).items():
            timings.setdefault(doc, {}).update(modes)
    return timings


class runs_on_node(nodes.General, nodes.Element):
    """Placeholder: filled in once every notebook of the build has run (doctree-resolved)."""


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
        return [node]


LINE_PREFIX = "Runs on: "


def places_of_line(text):
    """['cpu', 'gpus'] for the line "Runs on: CPU, several GPUs." (what scripts/reader_markup.py
    writes for ```{runs-on} cpu gpus```, so that a notebook outside the book says it too);
    None for any other text."""
    text = text.strip()
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
            para.replace_self(runs_on_node(places=places, docname=docname))


def _badge(text, kind):
    return nodes.inline(text, text, classes=["sd-badge", f"sd-bg-{kind}", f"sd-bg-text-{kind}"])


def resolve(app, doctree, docname):
    timings = getattr(app.env, "course_timings", None) or load_timings(app)
    for node in doctree.findall(runs_on_node):
        para = nodes.paragraph(classes=["runs-on"])
        para += nodes.strong("Runs on: ", "Runs on: ")
        for place in node["places"]:
            para += _badge(PLACES[place], "primary")
            para += nodes.Text(" ")
        mine = timings.get(node["docname"], {})
        if _is_notebook(app, node["docname"]):
            para += nodes.Text("  Run time: ")
            parts = []
            for mode in ("quick", "small", "full"):
                rec = mine.get(mode)
                if rec:
                    parts.append(f"{MODES[mode]} {fmt_seconds(rec['seconds'])} "
                                 f"({rec['machine']}, {rec['date']})")
                elif mode != "small":
                    parts.append(f"{MODES[mode]} not measured yet")
            para += nodes.emphasis("", "; ".join(parts))
        node.replace_self(para)


def _is_notebook(app, docname):
    return str(app.env.doc2path(docname)).endswith(".ipynb")


def record(app, env):
    """After every notebook ran: store this build's measured run times under its mode."""
    try:
        from myst_nb.sphinx_ import NbMetadataCollector
        data = NbMetadataCollector.get_doc_data(env)
    except Exception:  # noqa: BLE001
        data = {}
    timings = load_timings(app)
    mode, machine = build_mode()
    today = datetime.date.today().isoformat()
    changed = False
    for docname in getattr(env, "course_read_now", ()):
        ex = (data.get(docname) or {}).get("exec_data") or {}
        # executed by this build (not a cache hit, not an earlier build's record)
        if ex.get("succeeded") and ex.get("runtime") is not None \
                and ex.get("method") in ("force", "auto", "inline") \
                and ex.get("mtime", 0) >= getattr(env, "course_build_start", float("inf")):
            timings.setdefault(docname, {})[mode] = {
                "seconds": round(float(ex["runtime"]), 1), "machine": machine, "date": today}
            changed = True
    env.course_timings = timings
    if changed:
        path = timings_path(app)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(timings, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)   # atomic: a killed build leaves the old file
        logger.info(f"[course_badges] {mode} run times recorded in {path}")


def remember_read(app, env, docnames):
    env.course_read_now = list(docnames)
    env.course_build_start = datetime.datetime.now().timestamp()


def setup(app):
    app.add_node(runs_on_node)
    app.add_directive("runs-on", RunsOn)
    app.connect("doctree-read", badge_lines)
    app.connect("env-before-read-docs", remember_read)
    app.connect("env-updated", record)
    app.connect("doctree-resolved", resolve)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
