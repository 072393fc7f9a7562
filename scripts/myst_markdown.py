"""MyST roles and directives as plain Markdown: {term}, {cite}, {doc} and {numref} become links,
```{dropdown}``` and ```{note}``` HTML and quotes, ```{runs-on}``` the "Runs on" line."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "book" / "_ext"))
sys.path.insert(0, str(ROOT / "scripts"))
import chapter_runs  # noqa: E402
from book_links import page_entry, term_anchor  # noqa: E402

ROLES = re.compile(r"\{(glue(:text)?|term|cite(:[pt])?|numref)\}`")   # what the audit counts
TERM = re.compile(r"\{term\}`([^`<]+?)(?:\s*<([^`>]+)>)?`")
CITE = re.compile(r"\{cite(?::([pt]))?\}`([^`]+)`")
NUMREF = re.compile(r"\{numref\}`([^`<]+?)(?:\s*<([^`>]+)>)?`")
DOC = re.compile(r"\{doc\}`([^`<]+?)(?:\s*<([^`>]+)>)?`")
FENCE = re.compile(r"^(?P<f>`{3,}|:{3,})\{(?P<name>[\w-]+)\}[ \t]*(?P<arg>.*)$")
PLACES = {"cpu": "CPU", "gpu": "one GPU", "gpus": "several GPUs"}


def _term(m, ctx):
    text, target = m.group(1).strip(), (m.group(2) or m.group(1)).strip()
    key = target.lower()
    found = ctx.terms.get(key) or ctx.terms.get(key.rstrip("s"))
    if not found:
        ctx.problems.append(f"{{term}}`{target}`: no such glossary entry")
        return text
    return f"[{text}]({ctx.page_url('book/glossary', term_anchor(found))})"


def _cite(m, ctx):
    kind, keys = m.group(1), [k.strip() for k in m.group(2).split(",")]
    parts = []
    for key in keys:
        if key not in ctx.cites:
            ctx.problems.append(f"{{cite}}`{key}`: not in book/references.bib")
            continue
        label = ctx.cites[key]
        if kind == "t":   # "Huang et al. (2019)"
            who, year = label.rsplit(", ", 1)
            label = f"{who} ({year})"
        parts.append(f"[{label}]({ctx.page_url('book/bibliography', 'cite-' + key)})")
    return "; ".join(parts) if kind == "t" else "[" + "; ".join(parts) + "]"


def _doc(m, ctx):
    text, target = m.group(1).strip(), (m.group(2) or m.group(1)).strip()
    entry = page_entry(ctx.entry, target)
    if entry not in ctx.titles:
        ctx.problems.append(f"{{doc}}`{target}`: no page {entry} in _toc.yml")
        return text
    label = text if m.group(2) else ctx.titles[entry]
    return f"[{label}]({ctx.page_url(entry)})"


def runs_line(text, ctx):
    """The "Runs on" line with the run time and needs of the chapter (chapter_runs)."""
    if not chapter_runs.RUNS_LINE.search(text):
        return text
    if ctx.gpus is None:
        ctx.problems.append('no GPU count in the notebook\'s metadata ("course": {"gpus": N})')
        return text
    try:
        return chapter_runs.with_notebook_line(text, chapter_runs.load(), ctx.entry, ctx.gpus)
    except chapter_runs.MissingRun as e:
        ctx.problems.append(str(e))
        return text


def inline(text, ctx, figures=None, here=0):
    """The roles of one markdown text, as Markdown (glue roles excepted: see prose_fields)."""
    text = TERM.sub(lambda m: _term(m, ctx), text)
    text = CITE.sub(lambda m: _cite(m, ctx), text)
    text = DOC.sub(lambda m: _doc(m, ctx), text)

    def numref(m):
        name = (m.group(2) or m.group(1)).strip()
        where = (figures or {}).get(name)
        if where is None:
            ctx.problems.append(f"{{numref}}`{name}`: no figure of that name in this notebook")
            return "the figure"
        words = "the figure below" if where > here else "the figure above"
        return f"[{words}](#{name})"

    return NUMREF.sub(numref, text)


def blocks(text, ctx):
    """```{dropdown}```, ```{note}``` and ```{runs-on}``` as plain Markdown (others: reported)."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        fence, name, arg = m.group("f"), m.group("name"), m.group("arg").strip()
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        body = lines[i + 1:j]
        while body and re.match(r"^:[\w-]+:", body[0]):   # directive options
            body = body[1:]
        inner = blocks("\n".join(body), ctx).strip("\n")
        if name == "runs-on":
            bad = [a for a in arg.split() if a not in PLACES]
            if bad:
                ctx.problems.append(f"runs-on: unknown {bad}")
            out.append("*Runs on: " + ", ".join(PLACES[a] for a in arg.split() if a in PLACES)
                       + ".*")
        elif name == "dropdown":
            out += ["<details>", f"<summary>{arg or 'Show'}</summary>", "", inner, "",
                    "</details>"]
        elif name in ("note", "tip", "important", "warning", "caution", "hint", "seealso"):
            head = f"**{arg or name.capitalize()}.**"
            out += ["> " + head, ">"] + [("> " + ln).rstrip() for ln in inner.split("\n")]
        else:
            ctx.problems.append(f"directive {{{name}}} left as it is: convert it by hand")
            out += lines[i:j + 1]
        i = j + 1
    return "\n".join(out)


def raw_markup(nb):
    """Lines of markdown cells (and of say cells' text) that still hold a MyST role."""
    found = []
    for i, cell in enumerate(nb.cells):
        src = cell.source if cell.cell_type == "markdown" else ""
        if cell.cell_type == "code" and cell.get("metadata", {}).get("course", {}).get("prose"):
            src = cell.source
        for line in src.splitlines():
            if ROLES.search(line) or DOC.search(line) or FENCE.match(line.strip()):
                found.append(f"cell {i}: {line.strip()[:100]}")
    return found
