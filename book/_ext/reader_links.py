"""Links to the published book become links within the book being built.

The notebooks' prose links terms, citations and pages with absolute addresses of the published
book (scripts/reader_markup.py), so that they work in Colab, JupyterLab, VS Code and on GitHub.
In the book itself such a link should stay inside this build (offline, on a fork's own site, in
the PDF): every reference to `html.baseurl` + `<page>.html#anchor` is rewritten to that page of
this build, and a link to a page or an anchor this build does not have is an error (a warning:
the builds run with -W). Figures: the notebooks link
`[the figure below](<baseurl>book/x.html#fig-a)` (an in-page `#fig-a` does nothing in a
notebook), which resolves to the figure's anchor here.
"""
import posixpath
import urllib.parse

from docutils import nodes
from sphinx.util import logging

logger = logging.getLogger(__name__)


def _base(app):
    base = (getattr(app.config, "html_baseurl", "") or "").rstrip("/") + "/"
    return base if base != "/" else None


def _anchors(app, docname):
    """Ids in a page's doctree (terms, citations, sections, figures)."""
    cache = app.env.__dict__.setdefault("_course_anchor_cache", {})
    if docname not in cache:
        try:
            tree = app.env.get_doctree(docname)
        except Exception:  # not read in this build
            return None
        ids = {i for node in tree.findall(nodes.Element) for i in node.get("ids", [])}
        try:   # sphinxcontrib-bibtex adds the bibliography's entries after reading
            ids |= {c.citation_id for c in app.env.get_domain("cite").citations
                    if c.bibliography_key.docname == docname}
        except Exception:  # no bibtex domain, or another version of it
            pass
        cache[docname] = ids
    return cache[docname]


def retarget(app, doctree, fromdocname):
    base = _base(app)
    if not base:
        return
    for ref in list(doctree.findall(nodes.reference)):
        uri = ref.get("refuri", "")
        if uri.startswith("#") and len(uri) > 1:
            continue
        if not uri.startswith(base):
            continue
        parts = urllib.parse.urlsplit(uri[len(base):])
        target = parts.path[:-5] if parts.path.endswith(".html") else parts.path.rstrip("/")
        if target not in app.env.all_docs:
            logger.warning(f"link to the published book names no page of this build: {uri}",
                           location=ref)
            continue
        anchor = urllib.parse.unquote(parts.fragment)
        ids = _anchors(app, target)
        if anchor and ids is not None and anchor not in ids:
            logger.warning(f"link to the published book names no anchor {anchor!r} in {target}: "
                           f"{uri}", location=ref)
        rel = app.builder.get_relative_uri(fromdocname, target)
        if app.builder.name == "singlehtml":
            rel = "#" + (anchor or f"document-{target}")
        elif anchor:
            rel = f"{rel}#{anchor}"
        ref["refuri"] = rel or posixpath.basename(target) + ".html"
        ref["internal"] = True
        ref["classes"] = [c for c in ref.get("classes", []) if c != "external"] + ["internal"]


def setup(app):
    app.connect("doctree-resolved", retarget)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
