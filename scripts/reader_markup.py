"""Rewrite the notebooks' MyST prose into markup that reads well wherever a notebook is opened.

Usage: python scripts/reader_markup.py [--check] [--out DIR] [book/x.ipynb ...]
(default: every notebook of _toc.yml, rewritten in place; --out writes copies under DIR instead;
--check changes nothing and exits 1 listing the notebooks a run would change).

Colab, JupyterLab, VS Code and GitHub render Markdown, not MyST: `{glue:text}`, `{term}`, `{cite}`,
`{numref}`, `{doc}` and directives print literally there. Per markdown cell:
- a cell with glued numbers becomes a code cell `helpers.say(r\"\"\"...{name:fmt}...\"\"\")`: it
  displays the paragraph as Markdown with this run's values (helpers/prose.py), its code hidden
  (tag remove-input for the book; `jupyter.source_hidden` for JupyterLab and VS Code; `#@title`
  and `cellView: form` for Colab), its stored output computed now from the values the notebook's
  stored glue outputs hold, so the numbers show before anything runs;
- {term}`x` becomes a link to the glossary entry of the published book, {cite}`k` "[Author et
  al., year]" linking to the bibliography, {doc}`p` a link with the page's title, {numref}`fig`
  "the figure above/below" (a link to the figure on the published page: an in-page `#fig-x` does
  nothing in a notebook); book/_ext/reader_links.py turns links to the published book into links
  within the book being built (checked under -W -n);
- ```{dropdown} T``` becomes <details><summary>T</summary>, ```{note}``` a quoted "**Note.**",
  ```{runs-on} cpu gpu``` the line "*Runs on: CPU, one GPU.*", which book/_ext/course_badges.py
  turns into the badge.
Also, in every notebook (converted or not):
- a relative link to another page of the book (`../part6/mesh2d.ipynb`) becomes the published
  page's address (Colab opens a lone notebook: a relative link is dead there), an in-page link
  (`#fig-zero-owners`: the anchor exists only in the book) the published page's address with
  that anchor (a say() text whose lines grow past 79 columns is re-filled), and a link
  followed by letters (`[bucket](...)s`, a plural) takes them in (`[buckets](...)`);
- the "Runs on" line gets the run time and needs the badge shows in the book, from
  book/_ext/runs.json (chapter_runs.notebook_line; `make outputs` refreshes it);
- the bookkeeping cells the book removes (tag remove-cell: glue, claim) fold like the prose
  cells (`#@title`, `cellView: form`, `jupyter.source_hidden`), without a stored result (a
  claim's `True` under the cell), their outputs hidden too (`jupyter.outputs_hidden`, and
  `collapsed`, which JupyterLab keeps equal to it): a glue's papermill record is for the book,
  and a front end without a renderer for it would say so under the fold;
- "the figure above/below" that starts a sentence is capitalised;
- under each figure, its caption and alt text (the figure cell's myst-nb metadata) in a Markdown
  cell the book removes (scripts/figure_captions.py): a front end shows the image alone.
Idempotent: a converted notebook has nothing left to convert (`--check` converts in memory and
fails where that would change a notebook). Written atomically.
"""
import argparse
import ast
import copy
import functools
import json
import pathlib
import re
import sys
import textwrap

import nbformat
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "book" / "_ext"))
sys.path.insert(0, str(ROOT / "scripts"))
import chapter_runs  # noqa: E402
from book_files import entry_path, toc_entries, toc_notebooks  # noqa: E402
from figure_captions import is_caption, with_captions  # noqa: E402

ROLES = re.compile(r"\{(glue(:text)?|term|cite(:[pt])?|numref)\}`")   # what the audit counts
GLUE = re.compile(r"\{glue(?::text)?\}`([A-Za-z_]\w*)(?::([^`]*))?`")
TERM = re.compile(r"\{term\}`([^`<]+?)(?:\s*<([^`>]+)>)?`")
CITE = re.compile(r"\{cite(?::([pt]))?\}`([^`]+)`")
NUMREF = re.compile(r"\{numref\}`([^`<]+?)(?:\s*<([^`>]+)>)?`")
DOC = re.compile(r"\{doc\}`([^`<]+?)(?:\s*<([^`>]+)>)?`")
FENCE = re.compile(r"^(?P<f>`{3,}|:{3,})\{(?P<name>[\w-]+)\}[ \t]*(?P<arg>.*)$")
PLACES = {"cpu": "CPU", "gpu": "one GPU", "gpus": "several GPUs"}
WIDTH = 79
TITLE = "#@title Text with this run's numbers (double-click to see the code)"
BOOKKEEPING = "#@title Bookkeeping for the text below (double-click to see the code)"
SETUP_CELL = "course-setup"   # scripts/colab_setup_cell.py's: folded by that script
# a link to a page of the book by its file, relative (not a URL, an anchor or the {book} field)
RELATIVE = re.compile(r"(\]\()(?![a-z][\w+.-]*:|#|/|\{book\})([^)\s#]+?)\.(ipynb|md)"
                      r"(#[^)\s]*)?\)")
# an in-page link: [the figure below](#fig-a)
IN_PAGE = re.compile(r"(\]\()#([^)\s]+)\)")
# a say() cell's text, between its opening r""" and its closing """)
SAY_TEXT = re.compile(r'(helpers\.say\(r"""\n)(.*?)(\n"""\))', re.S)
# a link with letters glued after it: [bucket](...)s
GLUED = re.compile(r"\[([^\[\]\n]+)\]\(([^()\s]+)\)([A-Za-z]+)")


def config():
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def book_url(cfg=None):
    """The published book's address, ending in '/' (_config.yml html.baseurl)."""
    url = ((cfg or config()).get("html") or {}).get("baseurl")
    if not url:
        raise SystemExit("_config.yml has no html.baseurl: the links need the published book")
    return url.rstrip("/") + "/"


# ---------------------------------------------------------------- what the links point at
@functools.cache
def glossary_terms():
    """{lowercased term: term as the glossary writes it} from book/glossary.md."""
    text = (ROOT / "book" / "glossary.md").read_text()
    block = text.split("```{glossary}", 1)[1].split("```", 1)[0]
    return {ln.strip().lower(): ln.strip() for ln in block.splitlines()
            if ln.strip() and not ln.startswith((" ", "\t", ":"))}


def term_anchor(term):
    return "term-" + re.sub(r"[^\w]+", "-", term).strip("-")


@functools.cache
def citation_labels():
    """{bibtex key: 'Huang et al., 2019'} with the labels of book/_ext/bib_style.py."""
    import importlib.util

    from pybtex.database import parse_file
    spec = importlib.util.spec_from_file_location("bib_style", ROOT / "book/_ext/bib_style.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    entries = parse_file(str(ROOT / "book" / "references.bib")).entries
    return {key: mod.author_year(e) for key, e in entries.items()}


@functools.cache
def page_titles():
    titles = {}
    for entry in toc_entries():
        path = entry_path(entry)
        text = path.read_text()
        if path.suffix == ".ipynb":
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"]
                             if c["cell_type"] == "markdown")
        m = re.search(r"^# (.+)$", text, re.M)
        titles[entry] = m.group(1).strip() if m else entry.rsplit("/", 1)[-1]
    return titles


class Context:
    """What the rewriting of one notebook needs: the book's address and the targets."""

    def __init__(self, path, cfg=None):
        self.path = pathlib.Path(path).resolve()
        self.entry = self.path.relative_to(ROOT).with_suffix("").as_posix()
        self.url = book_url(cfg)
        self.terms = glossary_terms()
        self.cites = citation_labels()
        self.titles = page_titles()
        self.problems = []
        self.gpus = None   # the notebook's "course": {"gpus": N}

    def page_url(self, entry, anchor=""):
        return f"{self.url}{entry}.html" + (f"#{anchor}" if anchor else "")


# ---------------------------------------------------------------- inline roles
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
    entry = (pathlib.PurePosixPath(ctx.entry).parent / target).as_posix()
    parts = []
    for p in entry.split("/"):
        if p == "..":
            parts.pop()
        elif p != ".":
            parts.append(p)
    entry = "/".join(parts)
    if entry not in ctx.titles:
        ctx.problems.append(f"{{doc}}`{target}`: no page {entry} in _toc.yml")
        return text
    label = text if m.group(2) else ctx.titles[entry]
    return f"[{label}]({ctx.page_url(entry)})"


def absolute_links(text, ctx, field=False):
    """Relative links to pages of the book as the published pages' addresses (`{book}...` in a
    say() text when `field`)."""
    def repl(m):
        parts = []
        for p in (pathlib.PurePosixPath(ctx.entry).parent / m.group(2)).as_posix().split("/"):
            if p == "..":
                parts.pop()
            elif p != ".":
                parts.append(p)
        entry = "/".join(parts)
        if entry not in ctx.titles:
            ctx.problems.append(f"link {m.group(2)}.{m.group(3)}: no page {entry} in _toc.yml")
            return m.group(0)
        url = ctx.page_url(entry, (m.group(4) or "#")[1:])
        return m.group(1) + (book_field(url, ctx.url) if field else url) + ")"

    def here(m):   # an anchor of this page: the published page's
        url = ctx.page_url(ctx.entry, m.group(2))
        return m.group(1) + (book_field(url, ctx.url) if field else url) + ")"
    return IN_PAGE.sub(here, RELATIVE.sub(repl, text))


def whole_word_links(text):
    """`[bucket](url)s` as `[buckets](url)`: a link covers the whole word it is part of."""
    return GLUED.sub(lambda m: f"[{m.group(1)}{m.group(3)}]({m.group(2)})", text)


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


def fold_bookkeeping(cell):
    """A cell the book removes (glue, claim): folded under a title, no stored result."""
    meta = cell.metadata
    if "remove-cell" not in meta.get("tags", []) or cell.get("id") == SETUP_CELL:
        return
    if is_caption(cell):          # a caption with a glued value: shown outside the book
        return
    if not cell.source.startswith("#@title"):
        cell.source = BOOKKEEPING + "\n" + cell.source
    meta["cellView"] = "form"
    meta["jupyter"] = {**meta.get("jupyter", {}), "source_hidden": True, "outputs_hidden": True}
    meta["collapsed"] = True      # nbformat's older key for hidden outputs (classic Notebook)
    cell.outputs = [o for o in cell.get("outputs", []) if o.get("output_type") != "execute_result"]


# "[the figure above](#...)" where a sentence starts: at the start of the text, of a paragraph,
# list item or heading, or after a sentence's end (not after "e.g." and the like)
FIGURE_AT_START = re.compile(
    r"(\A\s*|\n[ \t]*\n\s*|^[ \t]*(?:[-*+>]|\d+[.)]|#+)[ \t]+|"
    r"(?<!\be\.g)(?<!\bi\.e)(?<!\bcf)(?<!\bvs)[.!?][\"')\]*_]*\s+)"
    r"\[the(\s+figure\s+(?:above|below))\]", re.M)


def capital_figures(text):
    """'[the figure above](#x)' as '[The figure above](#x)' where it starts a sentence (its words
    possibly on two lines of a filled paragraph)."""
    return FIGURE_AT_START.sub(lambda m: f"{m.group(1)}[The{m.group(2)}]", text)


def relink_prose(cell, ctx):
    """A say() cell's links, in its text and its stored Markdown, as in a markdown cell."""
    head, say, text = cell.source.partition('helpers.say(r"""')     # its text starts there
    source = whole_word_links(absolute_links(
        head + say + (capital_figures(text) if say else text), ctx, field=True))
    if source != cell.source and any(len(ln) > WIDTH for ln in source.split("\n")):
        # a link made longer: the text re-filled (soft line breaks: Markdown renders it alike)
        source = SAY_TEXT.sub(lambda m: m.group(1) + rewrap(m.group(2)) + m.group(3), source, 1)
    cell.source = source
    for out in cell.get("outputs", []):
        md = out.get("data", {}).get("text/markdown")
        if md:
            text = "".join(md) if isinstance(md, list) else md
            out["data"]["text/markdown"] = capital_figures(
                whole_word_links(absolute_links(text, ctx)))


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


# ---------------------------------------------------------------- directives
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


# ---------------------------------------------------------------- glue: prose cells
def prose_fields(text):
    """The text as a str.format template: glue roles become {name:fmt}, other braces doubled.
    Returns (template, names used)."""
    names, pieces, last = [], [], 0
    for m in GLUE.finditer(text):
        pieces.append(text[last:m.start()].replace("{", "{{").replace("}", "}}"))
        names.append(m.group(1))
        pieces.append("{" + m.group(1) + (":" + m.group(2) if m.group(2) else "") + "}")
        last = m.end()
    pieces.append(text[last:].replace("{", "{{").replace("}", "}}"))
    return "".join(pieces), names


def rewrap(text, width=WIDTH):
    """Markdown paragraphs and list items re-filled to `width` columns (soft line breaks do not
    change how Markdown renders); tables, math blocks, HTML, headings, quotes and code stay."""
    out, para, indent, first = [], [], "", ""
    fenced = math = False

    def flush():
        nonlocal para
        if para:
            words = " ".join(para).split()
            out.extend(textwrap.wrap(" ".join(words), width=width, initial_indent=first,
                                     subsequent_indent=indent, break_long_words=False,
                                     break_on_hyphens=False))
            para = []

    for line in text.split("\n"):
        s = line.strip()
        if math and not s.startswith("$$"):   # inside a display formula, until its closing $$
            out.append(line)
            math = not s.endswith("$$")
            continue
        if s.startswith(("```", "~~~")):
            flush()
            fenced = not fenced
            out.append(line)
            continue
        if s.startswith("$$"):
            flush()
            if not (len(s) > 2 and s.endswith("$$")):
                math = not math
            out.append(line)
            continue
        if fenced or math or not s or s.startswith(("|", "<", "#", ">", "![")) or \
                line.startswith("    "):
            flush()
            out.append(line)
            continue
        item = re.match(r"^(\s*)([-*+]|\d+[.)])\s+(.*)$", line)
        if item:
            flush()
            first = item.group(1) + item.group(2) + " "
            indent = " " * len(first)
            para = [item.group(3)]
            continue
        if not para:
            first = indent = re.match(r"^(\s*)", line).group(1)
        para.append(s)
    flush()
    return "\n".join(out)


def stored_values(cells):
    """{name: value} from the stored glue outputs of `cells` (myst-nb's scrapbook metadata)."""
    values = {}
    for cell in cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else ():
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:   # display=False glues keep it under myst-nb's (papermill's) prefix
                data = out.get("data", {})
                plain = data.get("text/plain", data.get("application/papermill.record/text/plain"))
                values[name] = _literal("".join(plain or ""))
    return values


def _literal(text):
    """A glued value back from its text/plain repr: numbers, strings, numpy scalars, tensors."""
    text = text.strip()
    m = re.match(r"^(?:np\.\w+|numpy\.\w+|tensor)\((.*?)(?:, dtype=[\w.]+)?\)$", text, re.S)
    if m:
        text = m.group(1)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def split_blocks(text):
    """Blank-line separated blocks; a fence, a $$ block or a <details> ... </details> stays one."""
    out, cur, depth = [], [], 0
    fence = math = False
    for line in text.split("\n"):
        s = line.strip()
        if math and not s.startswith("$$"):   # inside a display formula, until its closing $$
            cur.append(line)
            math = not s.endswith("$$")
            continue
        if s.startswith(("```", "~~~")):
            fence = not fence
        elif s.startswith("$$") and not (len(s) > 2 and s.endswith("$$")):
            math = not math
        depth += s.count("<details") - s.count("</details>")
        if re.match(r"^#{1,6} ", line) and not (fence or math or depth):   # a heading: alone
            if cur:
                out.append("\n".join(cur))
            out.append(line)
            cur = []
        elif not s and not (fence or math or depth):
            if cur:
                out.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    if cur:
        out.append("\n".join(cur))
    return out


def book_field(template, url=None):
    """Links into the published book written `{book}glossary.html#...` (helpers.say fills it in),
    so that they fit the notebook's 79 columns."""
    return template.replace(url or book_url(), "{book}")


def say_cell(template, names, md_cell, imported):
    from helpers import formatted  # the formatting the kernel will do
    body = rewrap(template)
    lines = [TITLE] + ([] if imported else ["import helpers", ""]) + \
        ['helpers.say(r"""', body, '""")']
    src = "\n".join(lines)
    if any(len(ln) > WIDTH for ln in src.split("\n")):
        src += "  # noqa: E501"   # a table row or a long URL: Markdown cannot wrap it
    meta = copy.deepcopy(md_cell.get("metadata", {}))
    meta["tags"] = list(dict.fromkeys(["remove-input", *meta.get("tags", [])]))
    meta["jupyter"] = {**meta.get("jupyter", {}), "source_hidden": True}
    meta["cellView"] = "form"
    # other course marks stay (a figure's caption cell keeps saying whose caption it is)
    meta["course"] = {**meta.get("course", {}), "prose": True, "glued": sorted(set(names))}
    cell = nbformat.v4.new_code_cell(source=src, metadata=meta)
    if md_cell.get("id"):
        cell["id"] = md_cell["id"]
    return cell, formatted


def convert(nb, path, cfg=None):
    """The notebook with its prose rewritten (a new object) and the problems found."""
    ctx = Context(path, cfg)
    nb = copy.deepcopy(nb)
    ran = {c.get("id"): c for c in nb.cells if c.cell_type == "code" and is_caption(c)}
    nb.cells = with_captions(nb.cells)
    gpus = (nb.metadata.get("course") or {}).get("gpus")
    ctx.gpus = gpus if isinstance(gpus, int) and not isinstance(gpus, bool) else None
    figures = {c.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name"): i
               for i, c in enumerate(nb.cells)}
    figures.pop(None, None)
    imported = False
    cells = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            if re.search(r"^\s*(import helpers|from helpers)", cell.source, re.M):
                imported = True
            fold_bookkeeping(cell)
            if cell.get("metadata", {}).get("course", {}).get("prose"):
                relink_prose(cell, ctx)
            cells.append(cell)
            continue
        if cell.cell_type != "markdown":
            cells.append(cell)
            continue
        text = blocks(cell.source, ctx)
        text = inline(text, ctx, figures, i)
        text = capital_figures(runs_line(whole_word_links(absolute_links(text, ctx)), ctx))
        groups = []   # consecutive blocks with glue / without, in order
        for block in split_blocks(text):
            has = bool(GLUE.search(block)) and not block.lstrip().startswith("#")
            if groups and groups[-1][0] == has:
                groups[-1][1].append(block)
            else:
                groups.append((has, [block]))
        for n, (has, group) in enumerate(groups):
            part = "\n\n".join(group)
            base_id = cell.get("id") or f"cell{i}"
            part_id = base_id if n == 0 else f"{base_id}-{n}"[:64]
            if not has:
                md = copy.deepcopy(cell)
                md.source = part
                md["id"] = part_id
                cells.append(md)
                continue
            template, names = prose_fields(part)
            template = book_field(template)
            new, formatted = say_cell(template, names, cell, imported)
            new["id"] = part_id
            values = stored_values(nb.cells[:i])
            missing = [nm for nm in names if nm not in values]
            later = stored_values(nb.cells[i:])
            early = [nm for nm in missing if nm in later]
            if early:
                ctx.problems.append(f"cell {i} ({cell.get('id')}): uses {early} before the cell "
                                    "that glues them: move the glue up, or the text down")
            if not missing:
                md_text = formatted(rewrap(template).strip("\n"), values)
                new.outputs = [nbformat.v4.new_output(
                    "display_data", data={"text/markdown": md_text, "text/plain":
                                          "<IPython.core.display.Markdown object>"})]
            elif not early:
                ctx.problems.append(f"cell {i} ({cell.get('id')}): no stored value for "
                                    f"{missing} (run `make outputs` first, then convert)")
            cells.append(new)
    nb.cells = [_keep_run(c, ran.get(c.get("id"))) for c in cells]
    return nb, ctx.problems


def _keep_run(cell, old):
    """A caption's say cell rebuilt from the metadata keeps the run it had where its text is
    the same (nbval refuses a cell with outputs but no execution count)."""
    if old is None or cell.cell_type != "code" or cell.source != old.source:
        return cell
    cell.outputs, cell.execution_count = old.outputs, old.execution_count
    if "execution" in old.metadata:
        cell.metadata["execution"] = old.metadata["execution"]
    return cell


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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=pathlib.Path)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--out", type=pathlib.Path, help="write converted copies under this folder")
    args = ap.parse_args(argv)
    from helpers import atomic_write  # a kill leaves the old notebook whole
    cfg = config()
    bad, problems_all = [], []
    for path in args.notebooks or toc_notebooks():
        path = pathlib.Path(path).resolve()
        nb = nbformat.read(path, as_version=4)
        if args.check:
            left = raw_markup(nb)
            if left:
                bad.append(f"{path}: {len(left)} lines of MyST, e.g. {left[0]}")
                continue
            new, _ = convert(nb, path, cfg)
            changed = [i for i, (a, b) in enumerate(zip(nb.cells, new.cells)) if a != b]
            if changed or len(nb.cells) != len(new.cells):
                bad.append(f"{path}: a run would change cell {(changed or [len(nb.cells)])[0]}")
            continue
        new, problems = convert(nb, path, cfg)
        problems_all += [f"{path.relative_to(ROOT)}: {p}" for p in problems]
        nbformat.validate(new)
        dest = (args.out / path.relative_to(ROOT)) if args.out else path
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dest, lambda f, nb=new: nbformat.write(nb, f), mode="w")
    if bad:
        print("not converted (run scripts/reader_markup.py):", *bad, sep="\n  ")
        return 1
    if problems_all:
        print("converted, with problems to fix by hand:", *problems_all, sep="\n  ")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
