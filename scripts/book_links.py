"""Links into the published book, for a notebook read outside it (Colab, JupyterLab, GitHub):
the glossary, bibliography and page targets, and relative or in-page links made absolute."""
import functools
import json
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from book_files import entry_path, toc_entries  # noqa: E402

# a link to a page of the book by its file, relative (not a URL, an anchor or the {book} field)
RELATIVE = re.compile(r"(\]\()(?![a-z][\w+.-]*:|#|/|\{book\})([^)\s#]+?)\.(ipynb|md)"
                      r"(#[^)\s]*)?\)")
# an in-page link: [the figure below](#fig-a)
IN_PAGE = re.compile(r"(\]\()#([^)\s]+)\)")

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


def page_entry(here, target):
    """The _toc.yml entry a relative link `target` on page `here` points to ("." and ".."
    resolved)."""
    parts = []
    for p in (pathlib.PurePosixPath(here).parent / target).as_posix().split("/"):
        if p == "..":
            parts.pop()
        elif p != ".":
            parts.append(p)
    return "/".join(parts)


def absolute_links(text, ctx, field=False):
    """Relative links to pages of the book as the published pages' addresses (`{book}...` in a
    say() text when `field`)."""
    def repl(m):
        entry = page_entry(ctx.entry, m.group(2))
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


def book_field(template, url=None):
    """Links into the published book written `{book}glossary.html#...` (helpers.say fills it in),
    so that they fit the notebook's 79 columns."""
    return template.replace(url or book_url(), "{book}")


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
