"""What a reader would see wrong on one rendered page, checked in a real browser (Playwright).

`open_page` loads a page with every request outside the local server blocked (the book must work
offline) and records console errors and failed local requests; `check_page` then returns a list
of problems, one readable line each. tests/browser/test_pages.py runs it over the whole book and
tests/browser/test_checks_fail.py feeds it broken pages to prove that each check can fail.
Serving and opening pages: pageserve.py; the checks of a page's features (buttons, widgets,
fit, tables, header): pagefeatures.py.
"""
import functools
import html.parser
import pathlib
import urllib.parse

from pagefeatures import (
    check_fits,
    check_header,
    check_launch_buttons,
    check_text_tables,
    check_widget_figures,
    check_widget_twins,
)
from pageserve import (
    FRAMES,
    MIN_FIGURE,
    TRACEBACK_RE,
    VIEW_MIME,
    open_page,
    resize,
    serve,
    settle,
    toc_entries_of,
    wait_rendered,
)

# the browser tests take every check, and what opens a page, from here
__all__ = ["FRAMES", "check_fits", "check_header", "check_launch_buttons", "check_page",
           "check_text_tables", "check_widget_figures", "check_widget_twins", "ids_in",
           "local_file", "open_page", "resize", "serve", "settle", "toc_entries_of",
           "wait_rendered"]


_DOM_JS = """(viewMime) => {
  const vis = el => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const text = el => (el.innerText || el.textContent || '');
  const out = {links: [], images: [], errors: [], figures: [], math: [], rawMath: [], widgets: [],
               scripts: []};
  for (const a of document.querySelectorAll('a[href]'))
    out.links.push({href: a.href, raw: a.getAttribute('href')});
  for (const img of document.images)
    out.images.push({src: img.currentSrc || img.src, w: img.naturalWidth, h: img.naturalHeight,
                     complete: img.complete});
  // cell outputs showing an error (a cell tagged raises-exception may show one on purpose)
  for (const o of document.querySelectorAll('.cell_output .output, .cell_output pre, .output.traceback, .output.error, .output.stderr')) {
    const cell = o.closest('.cell');
    if (cell && cell.classList.contains('tag_raises-exception')) continue;
    // an error the cell's own `except` clause prints on purpose ("ValueError: ... " to show it)
    const input = cell ? cell.querySelector('.cell_input') : null;
    out.errors.push({classes: o.className, text: text(o).slice(0, 2000),
                     caught: !!input && /\\bexcept\\b/.test(text(input))});
  }
  // figures a notebook produced: images in cell outputs, glued outputs and rendered widgets
  const canvas = document.createElement('canvas');
  for (const img of document.querySelectorAll('.cell_output img, .output img, .widget-subarea img')) {
    const f = {src: img.currentSrc || img.src, w: img.naturalWidth, h: img.naturalHeight,
               colors: null, err: null};
    try {
      const W = Math.min(img.naturalWidth, 400), H = Math.min(img.naturalHeight, 400);
      canvas.width = W; canvas.height = H;
      const ctx = canvas.getContext('2d', {willReadFrequently: true});
      ctx.clearRect(0, 0, W, H);
      ctx.drawImage(img, 0, 0, W, H);
      const d = ctx.getImageData(0, 0, W, H).data, seen = new Set();
      for (let i = 0; i < d.length && seen.size < 50; i += 4 * 7) seen.add(d[i] << 24 | d[i+1] << 16 | d[i+2] << 8 | d[i+3]);
      f.colors = seen.size;
    } catch (e) { f.err = String(e); }
    out.figures.push(f);
  }
  for (const m of document.querySelectorAll('.math')) {
    out.math.push({rendered: !!m.querySelector('mjx-container'),
                   merror: !!m.querySelector('mjx-merror, [data-mjx-error]'),
                   text: (m.querySelector('mjx-container') ? '' : text(m)).slice(0, 200)});
  }
  // TeX left raw in the prose (outside code, scripts and rendered math)
  const walker = document.createTreeWalker(document.querySelector('main') || document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement.closest('pre, code, script, style, textarea, mjx-container, .highlight, .cell_output')) continue;
    const m = n.textContent.match(/\\$\\$|\\\\\\(|\\\\\\[|\\\\begin\\{/);
    if (m) out.rawMath.push(n.textContent.trim().slice(0, 120));
  }
  // template text left raw ({{ release_tag }}): in the prose, inline code included; a code
  // cell's input and output may hold braces (a say() cell's output is prose)
  const texts = document.createTreeWalker(document.querySelector('main') || document.body, NodeFilter.SHOW_TEXT);
  out.template = [];
  for (let n = texts.nextNode(); n; n = texts.nextNode()) {
    const el = n.parentElement;
    if (el.closest('script, style, textarea, pre, .highlight, .cell_input')) continue;
    if (el.closest('.cell_output') && !el.closest('.cell.tag_remove-input')) continue;
    if (/[{][{]|[}][}]|[{]%|%[}]/.test(n.textContent)) out.template.push(n.textContent.trim().slice(0, 120));
  }
  for (const v of document.querySelectorAll('script[type="' + viewMime + '"]')) {
    const area = v.previousElementSibling;
    const ok = !!area && area.classList.contains('widget-subarea');
    const shown = ok ? [...area.querySelectorAll('*')].filter(vis) : [];
    let model = null; try { model = JSON.parse(v.textContent).model_id; } catch (e) {}
    // inside a folded output (hide-output toggle) nothing has a size: count elements instead
    let folded = !!v.closest('details:not([open])');
    for (let e = v.parentElement; e && !folded; e = e.parentElement)
      folded = getComputedStyle(e).display === 'none';
    out.widgets.push({model, rendered: ok, children: ok ? area.childElementCount : 0, folded,
                      visible: folded ? (ok ? area.querySelectorAll('*').length : 0) : shown.length,
                      height: folded ? 99 : (ok ? area.getBoundingClientRect().height : 0)});
  }
  for (const s of document.querySelectorAll('script[src]')) out.scripts.push(s.src);
  out.hasWidgetState = !!document.querySelector('script[type="application/vnd.jupyter.widget-state+json"]');
  out.title = document.title;
  return out;
}"""


class _Ids(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k == "id" or (k == "name" and tag == "a"):
                self.ids.add(v)


@functools.cache
def ids_in(path):
    p = _Ids()
    p.feed(pathlib.Path(path).read_text(errors="replace"))
    return frozenset(p.ids)


def local_file(url, base, site):
    """The file under `site` that a same-site URL points at (directories serve index.html)."""
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    rel = path[len(urllib.parse.urlsplit(base).path):] if path.startswith(
        urllib.parse.urlsplit(base).path) else path.lstrip("/")
    f = pathlib.Path(site) / rel
    return f / "index.html" if (not rel or rel.endswith("/") or f.is_dir()) else f


def check_page(seen, base, site):
    """Every problem a reader would see on the loaded page, as readable lines (empty: all good)."""
    dom = seen.page.evaluate(_DOM_JS, VIEW_MIME)
    problems = [f"console error: {e}" for e in seen.console_errors]
    http_errors = {f.split(" (HTTP ")[0] for f in seen.local_failures if " (HTTP " in f}
    problems += [f"local request failed: {f}" for f in seen.local_failures
                 if not (f.endswith("(net::ERR_ABORTED)") and f.rsplit(" (", 1)[0] in http_errors)]

    for link in dom["links"]:
        href = link["href"]
        if not href.startswith(base):
            continue   # external: launch buttons are checked by check_launch_buttons
        target = local_file(href, base, site)
        if not target.is_file():
            problems.append(f"broken link {link['raw']!r}: {target.relative_to(site)} does not exist")
            continue
        frag = urllib.parse.unquote(urllib.parse.urlsplit(href).fragment)
        if frag and target.suffix == ".html" and frag not in ids_in(str(target)):
            problems.append(f"broken link {link['raw']!r}: no id {frag!r} in {target.relative_to(site)}")

    for img in dom["images"]:
        if not img["complete"] or img["w"] == 0:
            problems.append(f"broken image {img['src']}")

    for out in dom["errors"]:
        is_error_class = any(c in out["classes"].split() for c in ("traceback", "error"))
        m = TRACEBACK_RE.search(out["text"])
        if m and out["caught"] and not is_error_class and "Traceback (most" not in out["text"]:
            continue   # printed by the cell's own except clause: shown on purpose
        if is_error_class or m:
            lines = [ln.strip() for ln in out["text"].splitlines() if ln.strip()]
            errs = [ln for ln in lines if TRACEBACK_RE.match(ln) and "Traceback" not in ln]
            shown = (errs or lines or [""])[-1]
            problems.append(f"cell output shows an error: {shown[:150]}")

    for fig in dom["figures"]:
        if fig["w"] < MIN_FIGURE or fig["h"] < MIN_FIGURE:
            problems.append(f"figure {fig['src'][:80]} is only {fig['w']}x{fig['h']} px")
        elif fig["err"] and not fig["src"].startswith("file:"):   # file:// taints the canvas
            problems.append(f"figure {fig['src'][:80]} could not be read: {fig['err']}")
        elif fig["colors"] is not None and fig["colors"] < 2:
            problems.append(f"figure {fig['src'][:80]} is blank (one colour)")

    bad_math = [m["text"] for m in dom["math"] if not m["rendered"]]
    if bad_math:
        problems.append(f"{len(bad_math)} math expression(s) not rendered by MathJax, "
                        f"e.g. {bad_math[0]!r}")
    if any(m["merror"] for m in dom["math"]):
        problems.append("MathJax reports a TeX error on the page")
    for raw in dom["rawMath"]:
        problems.append(f"raw TeX left in the text: {raw!r}")
    for raw in dom["template"]:
        problems.append(f"raw template text in the prose: {raw!r}")

    for w in dom["widgets"]:
        if not w["rendered"]:
            problems.append(f"widget {w['model']} not rendered (is the widget manager loaded?)")
        elif w["children"] == 0 or w["visible"] == 0 or w["height"] < 5:
            problems.append(f"widget {w['model']} renders blank")

    # The vendored scripts (book/_vendor): loaded once, and only the entry points.
    static = [s for s in dom["scripts"] if "/_static/ipywidgets/" in s or "/_static/mathjax/" in s]
    names = [urllib.parse.urlsplit(s).path for s in static]
    for n in sorted(set(names)):
        if names.count(n) > 1:
            problems.append(f"script {n} is loaded {names.count(n)} times "
                            "(is book/_vendor inside a _static folder?)")
        if "/_static/mathjax/" in n and not n.endswith("/tex-mml-chtml.js"):
            problems.append(f"MathJax component {n} is loaded as a page script")
    if not dom["hasWidgetState"] and any("/_static/ipywidgets/" in n for n in names):
        problems.append("the widget manager is loaded on a page without widgets")
    return problems
