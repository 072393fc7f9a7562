"""The teacher's guide's generated tables (book/teachers.md): every chapter's exercises, what
each check observes, and the time `nbgrader autograde` takes per submission."""
import pathlib
import re
import sys

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "book" / "_ext"))
sys.path.insert(0, str(ROOT / "scripts"))
import chapter_runs  # noqa: E402
from exercise_cells import (  # noqa: E402
    EXERCISE,
    chapters,
    is_check,
    is_prose,
    is_solution,
    is_text,
    source,
)

LEVEL = re.compile(r"\b(warm[- ]?up|core|open[- ]ended|stretch|challenge)\b", re.I)
TIME = re.compile(r"(\d+)(?:\s*(?:-|–|to)\s*(\d+))?\s*(min(?:ute)?s?|h(?:ours?)?)\b", re.I)
TABLE_BEGIN, TABLE_END = "<!-- exercise-table: begin -->", "<!-- exercise-table: end -->"
TEACHERS = ROOT / "book" / "teachers.md"


def chapter_title(nb, path):
    for cell in nb.cells:
        m = is_text(cell) and re.search(r"^#\s+(.+)$", source(cell), re.M)
        if m:
            return m.group(1).strip()
    return pathlib.Path(path).stem


def exercises(path):
    """The exercises of a chapter notebook, in order: dicts with number, title, level, minutes
    (the upper bound of the time the heading's cell states), check (the check function(s) its
    check cells call, or "worked answer")."""
    nb = nbformat.read(path, as_version=4)
    found = []
    for index, cell in enumerate(nb.cells):
        text = source(cell)
        if is_text(cell) and not is_solution(cell):
            heads = list(EXERCISE.finditer(text))
            for i, m in enumerate(heads):
                part = text[m.start():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
                after = nb.cells[index + 1] if index + 1 < len(nb.cells) else None
                if i == len(heads) - 1 and after is not None and is_prose(after):
                    part += "\n" + source(after)   # reader_markup put the text after a heading
                level, time = LEVEL.search(part), TIME.search(part)
                minutes = None
                if time:
                    minutes = int(time.group(2) or time.group(1))
                    minutes *= 60 if time.group(3).lower().startswith("h") else 1
                title = re.sub(r"\s*[(\[][^)\]]*(?:min|warm|core|open)[^)\]]*[)\]]", "",
                               m.group(2), flags=re.I).strip(" .:*_")
                found.append(dict(number=int(m.group(1)), title=title.replace("|", "\\|"),
                                  level=level.group(1).lower().replace(" ", "-") if level else None,
                                  minutes=minutes, checks=[], worked=False))
        elif found and is_check(cell):
            found[-1]["checks"] += re.findall(r"\b(check_\w+)\s*\(", text)
        elif found and is_solution(cell) and is_text(cell):
            found[-1]["worked"] = True
    for ex in found:
        checks = ", ".join(f"`{c}`" for c in ex.pop("checks"))
        ex["written"] = ex.pop("worked")      # a worked answer: the handout's answer cell
        ex["check"] = (checks + (" and a worked answer" if ex["written"] else "") if checks else
                       "worked answer" if ex["written"] else "—")
    return found


def exercise_table(notebooks=None):
    """The Markdown table of every chapter's exercises, for book/teachers.md."""
    rows, total = [], 0
    for path in chapters() if notebooks is None else notebooks:
        nb = nbformat.read(path, as_version=4)
        title = chapter_title(nb, path)
        for ex in exercises(path):
            total += ex["minutes"] or 0
            minutes = f"{ex['minutes']} min" if ex["minutes"] else "?"
            rows.append(f"| {title} | {ex['number']}. {ex['title']} | {ex['level'] or '?'} | "
                        f"{minutes} | {ex['check']} |")
            title = ""   # the chapter's name once, on its first row
    head = ["| Chapter | Exercise | Level | Time | Checked by |",
            "|---|---|---|---|---|"]
    summary = (f"\n\nIn all: {len(rows)} exercises, about {total / 60:.1f} hours."
               if rows else "")
    return "\n".join(head + rows) + summary


CHECKS_BEGIN, CHECKS_END = "<!-- checks-table: begin -->", "<!-- checks-table: end -->"


def checks_table():
    """The Markdown list of what every check observes, from the checks' own declarations
    (@check in helpers/checks): complete by construction. A list, not a table: on a phone a
    three-column table squeezed the long check names into a letter column."""
    import helpers.checks
    from helpers.checks import REGISTRY
    rows = []
    for name in sorted(n for n in dir(helpers.checks) if n.startswith("check_")):
        info = REGISTRY.get(name)
        if info is None:
            rows.append(f"- **`{name}`**: not yet on the harness: judges what it returns and "
                        "what it logs.")
            continue
        observes = "; ".join(info.observes)
        refs = ", ".join(f"`helpers.{r}`" for r in info.references if not r.startswith("torch."))
        torch_refs = ", ".join(f"`{r}`" for r in info.references if r.startswith("torch."))
        refused = " and ".join(([f"the course's own {refs}"] if refs else [])
                               + ([f"torch's {torch_refs}"] if torch_refs else []))
        rows.append(f"- **`{name}`** observes {observes}." + (
            f" It refuses {refused}." if refused else ""))
    return "\n".join(rows)


# --- the grading time of the teacher's guide ---------------------------------------------------
GRADING_BEGIN, GRADING_END = "<!-- grading-time: begin -->", "<!-- grading-time: end -->"
GRADING_RECORD = ROOT / "book" / "_ext" / "grading_times.json"   # scripts/time_autograde.py
GRADING_FIELDS = ("seconds", "submissions", "machine", "date", "command", "by")


def grading_record(path=None):
    """{docname: entry} of the measured autograde times (scripts/time_autograde.py); {} when
    none is recorded yet."""
    import json
    path = pathlib.Path(path or GRADING_RECORD)
    if not path.exists():
        return {}
    record = json.loads(path.read_text())
    for doc, entry in record.items():
        missing = [f for f in GRADING_FIELDS if f not in entry]
        if missing:
            raise ValueError(f"{path}: {doc}: missing {missing}; rewrite it with "
                             "scripts/time_autograde.py")
    return record


def _where_when(entry):
    """'2 CPU cores, no GPU, 2026-12-04', and what other work kept busy when the machine was
    shared (such a run is slower than it would be alone)."""
    text = f"{entry['machine']}, {entry['date']}"
    if chapter_runs.busy(entry) and entry.get("others") is not None:
        text += f", busy (other work: {entry['others']:.1f} cores)"
    elif chapter_runs.busy(entry):
        text += f", busy (load {entry['load']:g})"
    return text


def grading_time(doc, record=None, runs=None):
    """(time, how it is known) of grading one submission of chapter `doc`: measured by
    scripts/time_autograde.py where it has been, else the chapter's quick-mode run
    (book/_ext/runs.json), an estimate; ("?", why) when neither is recorded."""
    record = grading_record() if record is None else record
    runs = chapter_runs.load() if runs is None else runs
    if doc in record:
        entry = record[doc]
        n = entry["submissions"]
        return (chapter_runs.fmt_seconds(entry["seconds"]),
                f"measured: `{entry['command']}` on {n} solved submission{'s' if n != 1 else ''}, "
                f"{_where_when(entry)}")
    quick = chapter_runs.run_of(runs, doc, "quick")
    if quick:
        return (f"about {chapter_runs.fmt_seconds(quick['seconds'])}",
                f"estimate: the quick-mode run, {_where_when(quick)}")
    return "?", "no quick-mode run recorded"


def grading_table(notebooks=None, record=None, runs=None):
    """The Markdown table of the time `nbgrader autograde` takes per submission, per chapter."""
    rows = []
    for path in chapters() if notebooks is None else notebooks:
        nb = nbformat.read(path, as_version=4)
        doc = pathlib.Path(path).resolve().relative_to(ROOT).with_suffix("").as_posix()
        time, how = grading_time(doc, record, runs)
        rows.append(f"| {chapter_title(nb, path)} | {time} | {how} |")
    return "\n".join(["| Chapter | Per submission | How it is known |", "|---|---|---|"] + rows)


def _between(text, begin, end, table):
    b, e = text.index(begin) + len(begin), text.index(end)
    return text[:b] + "\n" + table + "\n" + text[e:]


def update_teachers_guide(path=TEACHERS, notebooks=None):
    """Rewrite the tables between the exercise-table, checks-table and grading-time markers of
    the teacher's guide; return whether the file changed."""
    text = pathlib.Path(path).read_text()
    new = _between(text, TABLE_BEGIN, TABLE_END, exercise_table(notebooks))
    new = _between(new, CHECKS_BEGIN, CHECKS_END, checks_table())
    new = _between(new, GRADING_BEGIN, GRADING_END, grading_table(notebooks))
    if new != text:
        sys.path.insert(0, str(ROOT))
        from helpers import atomic_write  # a kill leaves the old guide whole
        atomic_write(pathlib.Path(path), lambda f: f.write(new), mode="w")
    return new != text
