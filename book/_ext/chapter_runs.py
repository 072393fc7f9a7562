"""The measured runs of the chapters, and what a reader needs to run each (book/_ext/runs.json).

`make outputs` (scripts/execute_notebooks.py) executes a notebook and records, under the size
it ran at, how long it took, the peak memory of its kernel and every process the kernel started
(ranks, torchrun), and the most processes alive at once. The chapter badges and the table on the
landing page (book/_ext/course_badges.py) read the record; nobody types these numbers. The GPUs
a chapter asks for are not measured but declared: `"course": {"gpus": N}` in the notebook's
metadata, the most devices (ranks, simulated GPUs) any of its cells asks for; 0 for none.

Plain Python (json only): the Sphinx extension runs where torch is absent (the Pages build).
"""
import json
import pathlib
import re

HERE = pathlib.Path(__file__).resolve().parent
RECORD = HERE / "runs.json"   # committed; written by scripts/execute_notebooks.py only
# The sizes helpers.choose picks: quick mode (COURSE_QUICK=1), the CPU default size (no GPU, the
# scaled-down sizes a reader's laptop runs) and the full size (a GPU, or COURSE_FULL=1).
MODES = {"small": "CPU default size", "quick": "quick mode", "full": "full size"}
REQUIRED = "small"   # every chapter has a run at this size; the others show where they exist
FIELDS = ("seconds", "peak_bytes", "processes", "machine", "date")


class MissingRun(LookupError):
    """A chapter has no recorded run (or no GPU count) where one is required."""


def _flag(value):   # the same reading of a switch as helpers.config (which refuses the rest)
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def run_mode(env, num_gpus):
    """The size a run picks (helpers.choose): 'quick', 'full' or 'small'."""
    if _flag(env.get("COURSE_QUICK")):
        return "quick"
    return "full" if num_gpus or _flag(env.get("COURSE_FULL")) else "small"


def load(path=None):
    """{docname: {mode: entry}} of the record (default RECORD); {} when there is none yet."""
    path = pathlib.Path(path or RECORD)
    if not path.exists():
        return {}
    record = json.loads(path.read_text())
    for doc, modes in record.items():
        for mode, entry in modes.items():
            missing = [f for f in FIELDS if f not in entry]
            if mode not in MODES or missing:
                raise ValueError(f"{path}: {doc} {mode}: not a run record (unknown size, or "
                                 f"missing {missing}); rewrite it with `make outputs`")
    return record


def run_of(record, doc, mode=REQUIRED):
    """The entry of `doc` at `mode`; MissingRun naming the fix when the required one is absent,
    None for another size never measured."""
    entry = record.get(doc, {}).get(mode)
    if entry is None and mode == REQUIRED:
        raise MissingRun(f"{doc} has no run at the {MODES[mode]} in book/_ext/{RECORD.name}: run "
                         f"`make outputs NB={doc}.ipynb` (it records one) and commit the file")
    return entry


def gpus_wanted(notebook):
    """The notebook's declared `"course": {"gpus": N}` metadata (an int >= 0)."""
    meta = json.loads(pathlib.Path(notebook).read_text()).get("metadata", {})
    gpus = (meta.get("course") or {}).get("gpus")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
        raise MissingRun(f"{notebook}: no GPU count in its metadata; add "
                         '"course": {"gpus": N} (the most devices a cell asks for, 0 for none)')
    return gpus


def fmt_seconds(s):
    s = round(s)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"


def fmt_bytes(b):
    mib = b / 2 ** 20
    return f"{mib / 1024:.1f} GiB" if mib >= 1000 else f"{mib:.0f} MiB"


def fmt_gpus(n):
    return {0: "none", 1: "1 GPU"}.get(n, f"{n} GPUs")


OTHERS_BUSY = 0.5   # cores of other work on average: the run shared its machine


def busy(entry):
    """True when the run shared its machine: other processes kept half a core or more busy on
    average (`others`). The load average counts the run's own ranks too: without `others` (an
    older record), only a load above the cores plus the run's own processes counts."""
    if entry.get("others") is not None:
        return entry["others"] >= OTHERS_BUSY
    load, cores = entry.get("load"), entry.get("cores")
    return bool(load and cores and load > cores + entry.get("processes", 1))


def run_text(entry):
    """'45 s (2 CPU cores, no GPU, 2026-12-02)', and a short note when the machine was busy
    (such a run is slower than the chapter would be alone)."""
    if not busy(entry):
        note = ""
    elif entry.get("others") is not None:
        note = f"; busy machine: other work used {entry['others']:.1f} cores"
    else:
        note = f"; busy machine: load {entry['load']:g}"
    return f"{fmt_seconds(entry['seconds'])} ({entry['machine']}, {entry['date']}{note})"


def needs_text(entry, gpus):
    """What a reader needs, from the run at the CPU default size and the declared GPUs."""
    procs = entry["processes"]
    gpu = ("no GPU" if gpus == 0 else
           f"asks for {fmt_gpus(gpus)} (simulated on the CPU or on fewer GPUs where missing)")
    return (f"{fmt_bytes(entry['peak_bytes'])} of memory at most, "
            f"{procs} process{'es' if procs != 1 else ''} at once; {gpu}")


def badge_text(record, doc, gpus):
    """The run-time and needs sentences of a chapter's badge."""
    parts = [f"{MODES[REQUIRED]} {run_text(run_of(record, doc))}"]
    small = run_of(record, doc)
    for mode in ("quick", "full"):
        entry = run_of(record, doc, mode)
        if mode == "quick" and entry and entry["seconds"] >= small["seconds"]:
            # a quick run timed on a busier machine than the default size's: its time would
            # tell a reader that the shorter run takes longer
            parts.append(f"{MODES[mode]} shorter (its last timing, on a busier machine, "
                         "is not comparable)")
        elif entry:
            parts.append(f"{MODES[mode]} {run_text(entry)}")
        elif mode == "full":
            parts.append(f"{MODES[mode]} not measured yet")
    return "; ".join(parts), needs_text(run_of(record, doc), gpus)


def notebook_line(record, doc, gpus):
    """The sentence under a notebook's "Runs on" line, outside the book (Colab, JupyterLab: where
    its run time and memory matter most): the CPU default size's run and what it needs, as the
    badge says them. scripts/reader_markup.py writes it, `make outputs` refreshes it."""
    small = run_of(record, doc)
    return f"Run time: {MODES[REQUIRED]} {run_text(small)}. Needs: {needs_text(small, gpus)}."


# "*Runs on: CPU, one GPU.*" (scripts/reader_markup.py's line) and the sentence after it, if any
RUNS_LINE = re.compile(r"^(\*Runs on: [^*\n]+\.\*)(?: Run time: [^\n]*)?$", re.M)


def with_notebook_line(markdown, record, doc, gpus):
    """`markdown` (a notebook's title cell) with notebook_line after its "Runs on" line."""
    line = notebook_line(record, doc, gpus)
    return RUNS_LINE.sub(lambda m: f"{m.group(1)} {line}", markdown)


# mybinder.org gives each session 1-2 GB (binder/start runs every notebook in quick mode): a
# chapter whose quick-mode run peaked above this gets no Binder button (book/_ext/course_badges.py)
BINDER_BYTES = 1.5 * 2 ** 30


def fits_binder(record, doc):
    """True when `doc`'s recorded quick-mode run (what Binder runs) peaked within BINDER_BYTES;
    False when it needed more, or when no quick run is recorded (unknown: not offered)."""
    quick = run_of(record, doc, "quick")
    return bool(quick) and quick["peak_bytes"] <= BINDER_BYTES


def binder_text(record, doc):
    """What the badge says about Binder for `doc`."""
    quick = run_of(record, doc, "quick")
    if not quick:
        return "not offered (no quick-mode run recorded)"
    need = fmt_bytes(quick["peak_bytes"])
    if fits_binder(record, doc):
        return f"fits (quick mode, {need} at most)"
    return (f"not offered: quick mode needs {need}, more than Binder's "
            f"{fmt_bytes(BINDER_BYTES)}")


TABLE_HEAD = ("chapter", "run time", "peak memory", "processes", "GPUs it asks for")
FULL_HEAD = "full size"


def table_head(record, docs):
    """TABLE_HEAD, and a full-size column once any chapter of `docs` has a full-size run (until
    then the caption says it once, not every row)."""
    return TABLE_HEAD + ((FULL_HEAD,) if any_full(record, docs) else ())


def any_full(record, docs):
    return any(run_of(record, d, "full") for d in docs)


def table_rows(record, chapters):
    """One row per (docname, title, gpus) of `chapters`, in table_head's columns (strings), from
    the CPU default size's runs; MissingRun for a chapter without one."""
    rows, full_column = [], any_full(record, [c[0] for c in chapters])
    for doc, title, gpus in chapters:
        small, full = run_of(record, doc), run_of(record, doc, "full")
        took = fmt_seconds(small["seconds"]) + (" (busy machine)" if busy(small) else "")
        row = (title, took, fmt_bytes(small["peak_bytes"]), str(small["processes"]),
               fmt_gpus(gpus))
        if full_column:
            row += (fmt_seconds(full["seconds"]) if full else "not measured yet",)
        rows.append(row)
    return rows


# An exercise's heading, and the line under it: "### Exercise 2: ... (open-ended, 15 min)" or
# "*Core, 20 minutes.*" say the time it asks of a reader
EXERCISE = re.compile(r"^### Exercise[^\n]*(?:\n+(?!#)[^\n]*)?", re.M)
MINUTES = re.compile(r"(\d+)\s*min(?:ute)?s?\b")
# short words: at 390 px the four columns fit the phone's column ("announced" did not)
PART_HEAD = ("part", "run time", "exercises", "time for them")


def exercise_minutes(notebook):
    """(exercises, minutes): how many exercises `notebook` has, and the minutes they announce
    added up (an exercise that announces none counts 0)."""
    text = "\n\n".join(map(_prose, json.loads(pathlib.Path(notebook).read_text())["cells"]))
    found = [MINUTES.search(m.group(0)) for m in EXERCISE.finditer(text)]
    return len(found), sum(int(m.group(1)) for m in found if m)


def _prose(cell):
    """A cell's text as a reader sees it: a markdown cell's source, a prose cell's paragraph
    (helpers.say(r\"\"\"...\"\"\"), scripts/reader_markup.py's form), nothing for other code."""
    source = "".join(cell.get("source", []))
    if cell.get("cell_type") == "markdown":
        return source
    if (cell.get("metadata", {}).get("course") or {}).get("prose"):
        said = re.search(r'say\(r?"""\n?(.*?)"""', source, re.S)
        return said.group(1) if said else ""
    return ""


def fmt_minutes(m):
    return f"{m} min" if m < 60 else f"{m // 60} h {m % 60:02d} min"


def part_rows(record, parts):
    """One row per part of `parts`, [(caption, [(doc, notebook path), ...])], in PART_HEAD's
    columns: its chapters' runs at the CPU default size added up, and its exercises with the
    time they announce added up (a reader's time, not the machine's). Parts without a notebook
    are left out; MissingRun for a chapter without a run."""
    rows = []
    for caption, chapters in parts:
        if not chapters:
            continue
        seconds = sum(run_of(record, doc)["seconds"] for doc, _ in chapters)
        counts = [exercise_minutes(path) for _, path in chapters]
        rows.append((caption, fmt_seconds(seconds), str(sum(n for n, _ in counts)),
                     fmt_minutes(sum(m for _, m in counts))))
    return rows


def machines(record, docs, mode=REQUIRED):
    """The machines and dates the runs of `docs` at `mode` come from, for the table's caption."""
    runs = [record[d][mode] for d in docs if mode in record.get(d, {})]
    names = sorted({r["machine"] for r in runs})
    dates = sorted({r["date"] for r in runs})
    span = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}" if dates else ""
    return ", ".join(names), span
