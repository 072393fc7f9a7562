"""The whole book as one PDF, printed by Chromium from Sphinx's single-page HTML.

Usage: python scripts/book_pdf.py [--html _build/singlehtml] [--out _build/pdf/book.pdf]
`make pdf` builds the single page (`jupyter-book build --builder singlehtml`, from the stored
outputs) and runs this. The page is served on 127.0.0.1 with every other request blocked (the
book needs no internet), math is left to MathJax to finish, and the print styles of
book/_css/course.css apply (code and outputs wrap; no sidebars or buttons). Chromium is the one
the browser test drives (CHROMIUM, default /usr/bin/chromium). Before writing, the script checks
that the page holds every chapter of _toc.yml (by its title), and after, that the PDF has pages;
it fails naming what is missing. Written atomically.
"""
import argparse
import json
import os
import pathlib
import re
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "browser"))
sys.path.insert(0, str(ROOT))
from book_files import entry_path, toc_entries  # noqa: E402
from pageserve import serve  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
FOOTER = ('<div style="font-size:8px;width:100%;text-align:center;color:#555">'
          '<span class="title"></span> · <span class="pageNumber"></span> / '
          '<span class="totalPages"></span></div>')


def chapter_titles():
    """The first heading of every page of _toc.yml (markdown '# ' line or notebook's first)."""
    titles = {}
    for entry in toc_entries():
        path = entry_path(entry)
        text = path.read_text()
        if path.suffix == ".ipynb":
            cells = json.loads(text)["cells"]
            text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        m = re.search(r"^# (.+)$", text, re.M)
        if m:
            titles[entry] = m.group(1).strip()
    return titles


def page_count(pdf_bytes):
    """Pages of a PDF: the /Count of its root page tree (the largest one)."""
    return max(map(int, re.findall(rb"/Count (\d+)", pdf_bytes)), default=0)


# Math typeset and images loaded (widgets stay static in a PDF: their figures are beside them).
_READY_JS = """() => (!document.querySelector('.math') ||
  (window.MathJax && MathJax.startup && [...document.querySelectorAll('.math')]
    .every(m => m.querySelector('mjx-container')))) &&
  [...document.images].every(i => i.complete)"""


def _route(r, base):
    """Local requests only. Sphinx's singlehtml writes `mathjax_path` relative to the root, not
    to the root document's folder (book/): `book/_static/x` is served from `_static/x`."""
    url = r.request.url
    if url.startswith("data:"):
        return r.continue_()
    if not url.startswith(base):
        return r.abort("blockedbyclient")
    rel = url[len(base):]
    if "/_static/" in rel and not rel.startswith("_static/"):
        return r.continue_(url=base + "_static/" + rel.split("/_static/", 1)[1])
    return r.continue_()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--html", default=str(ROOT / "_build" / "singlehtml"))
    ap.add_argument("--out", default=str(ROOT / "_build" / "pdf" / "book.pdf"))
    args = ap.parse_args(argv)
    site = pathlib.Path(args.html)
    root_doc = site / (toc_entries()[0] + ".html")
    if not root_doc.is_file():
        raise SystemExit(f"no single-page book at {root_doc}: build it first (`make pdf`)")
    from playwright.sync_api import sync_playwright
    start = time.time()
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with serve(site) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 1400})
            page.route("**/*", lambda r: _route(r, base))
            # The whole book in one page, every image through _route: on a busy 2-core machine
            # (make test runs the browser test beside it) its load took over playwright's 30 s.
            page.goto(base + root_doc.relative_to(site).as_posix(), wait_until="load",
                      timeout=300_000)
            page.wait_for_function(_READY_JS, timeout=120_000, polling=250)
            text = page.evaluate("() => document.querySelector('main').innerText")
            flat = " ".join(text.split())
            missing = [f"{e} ({t})" for e, t in chapter_titles().items()
                       if " ".join(re.sub(r"[`*_]", "", t).split()) not in flat]
            if missing:
                raise SystemExit("the single-page book lacks these chapters:\n  "
                                 + "\n  ".join(missing))
            page.emulate_media(media="print")
            pdf = page.pdf(format="A4", print_background=True, display_header_footer=True,
                           header_template="<div></div>", footer_template=FOOTER,
                           margin={"top": "15mm", "bottom": "15mm", "left": "12mm",
                                   "right": "12mm"})
        finally:
            browser.close()
    pages = page_count(pdf)
    if pages < len(toc_entries()):
        raise SystemExit(f"the PDF has {pages} pages for {len(toc_entries())} chapters")
    from helpers import atomic_write  # the one atomic writer: a kill leaves the old PDF whole
    atomic_write(out, lambda f: f.write(pdf))
    print(f"wrote {out}: {pages} pages, {len(pdf) / 1e6:.1f} MB in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
