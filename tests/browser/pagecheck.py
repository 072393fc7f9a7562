"""What a reader would see wrong on one rendered page, checked in a real browser (Playwright).

`open_page` loads a page with every request outside the local server blocked (the book must work
offline) and records console errors and failed local requests; `check_page` then returns a list
of problems, one readable line each. tests/browser/test_pages.py runs it over the whole book and
tests/browser/test_checks_fail.py feeds it broken pages to prove that each check can fail.
"""
import contextlib
import functools
import html.parser
import http.server
import pathlib
import re
import threading
import urllib.parse
from unittest import mock

import book_files

VIEW_MIME = "application/vnd.jupyter.widget-view+json"
MIN_FIGURE = 100          # px: a figure a notebook produced is at least this wide and high
RENDER_TIMEOUT_MS = 15_000
TRACEBACK_RE = re.compile(r"Traceback \(most recent call last\)|^\s*[A-Z]\w*(Error|Exception): \S",
                          re.M)


def toc_entries_of(book_dir):
    with mock.patch.object(book_files, "ROOT", pathlib.Path(book_dir)):
        return book_files.toc_entries()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Quiet, and its files cacheable: a page's scripts and styles (the theme's, MathJax, the
    widget manager, mostly the same on every page) come from Chromium's cache, compiled code
    included, after the first page of a run instead of being served and parsed again. An error
    (a missing file) is not cached: every page that asks for it is told so."""

    def log_message(self, *args):
        pass

    def send_response(self, code, message=None):
        super().send_response(code, message)
        if code == 200:
            self.send_header("Cache-Control", "max-age=3600")


@contextlib.contextmanager
def serve(directory):
    """Serve `directory` on 127.0.0.1 at a free port; yields the base URL (ending in /)."""
    handler = functools.partial(_Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class Page:
    """A loaded page and what the browser saw while loading it."""

    def __init__(self, page, url):
        self.page, self.url = page, url
        self.console_errors, self.local_failures, self.blocked = [], [], []


# The browser resolves no host name but 127.0.0.1 (conftest.py's OFFLINE): a request outside
# the local server fails at once with this error, inside Chromium. Blocking each request through
# Playwright's routes instead has Chromium pause every request for the driver, with its cache off.
OFFLINE_ERROR = "net::ERR_NAME_NOT_RESOLVED"


def open_page(context, url, base, timeout=RENDER_TIMEOUT_MS):
    """Open `url` in a new tab of `context` (a browser started offline: conftest.py); requests
    outside `base` fail and are noted. Waits up to `timeout` ms for math, widgets and images to
    render."""
    page = context.new_page()
    seen = Page(page, url)

    def on_console(msg):
        if msg.type != "error":
            return
        where = (msg.location or {}).get("url", "")
        if OFFLINE_ERROR in msg.text or (where and not where.startswith(base)
                                         and "Failed to load resource" in msg.text):
            return   # an external request we blocked on purpose; it is listed in seen.blocked
        seen.console_errors.append(f"{msg.text} ({where})" if where else msg.text)

    # a new reader's page: no theme chosen before (the context is shared, and the theme's switch,
    # which test_page's dark-mode pass clicks, stores its choice in localStorage), so the theme
    # follows the system's, light here
    page.add_init_script("localStorage.removeItem('theme'); localStorage.removeItem('mode');")
    page.on("console", on_console)
    page.on("pageerror", lambda exc: seen.console_errors.append(
        f"uncaught {getattr(exc, 'name', None) or 'Error'}: {getattr(exc, 'message', exc)}"))

    def on_failed(req):
        if req.url.startswith(base):
            seen.local_failures.append(f"{req.url} ({req.failure})")
        elif not req.url.startswith("data:") and OFFLINE_ERROR in (req.failure or ""):
            seen.blocked.append(req.url)

    page.on("requestfailed", on_failed)
    page.on("response", lambda resp: resp.url.startswith(base) and resp.status >= 400 and
            seen.local_failures.append(f"{resp.url} (HTTP {resp.status})"))
    page.goto(url, wait_until="load")
    wait_rendered(page, timeout)
    return seen


_TIMED_OUT = "pagecheck: the page never settled this promise"


def settle(page, js, arg=None, seconds=10.0, what="the page"):
    """page.evaluate(js, arg) of a function returning a promise, refused after `seconds`:
    Playwright's evaluate has no timeout, and a promise the page never settles (a paused
    animation's `finished`, a MathJax start that failed, a frame a stalled tab never draws)
    hung the whole run. Raises TimeoutError naming `what`."""
    bounded = (f"async (arg) => {{ let t; const limit = new Promise((_, no) => {{ t = setTimeout("
               f"() => no(new Error({_TIMED_OUT!r})), {int(seconds * 1000)}); }});"
               f" try {{ return await Promise.race([({js})(arg), limit]); }}"
               f" finally {{ clearTimeout(t); }} }}")
    try:
        return page.evaluate(bounded, arg)
    except Exception as e:
        if _TIMED_OUT in str(e):
            raise TimeoutError(f"{what} did not finish within {seconds:g} s") from None
        raise


FRAMES = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"


def resize(page, width, height=None):
    """Set the viewport and wait until the page is laid out at the new width: the width's media
    queries apply and two frames have been drawn. A fixed pause was not enough on a busy machine
    (CI once measured a phone-width table at its desktop width)."""
    height = height or (page.viewport_size or {}).get("height", 900)
    page.set_viewport_size({"width": width, "height": height})
    page.wait_for_function(
        "w => window.innerWidth === w && matchMedia(`(max-width: ${w}px)`).matches "
        "&& matchMedia(`(min-width: ${w}px)`).matches", arg=width, timeout=10_000)
    settle(page, FRAMES, what=f"two frames drawn at {width} px")
    # and until the width's CSS transitions have ended: the theme slides its sidebars off
    # screen at phone width, and one caught halfway covered the page's right edge. Running
    # ones only (a paused animation's `finished` never settles), and for 10 s at most: on a
    # busy machine a 0.15 s transition once had not finished after 10 s (and, unbounded, hung
    # the run for 20 minutes); the width's layout holds by then (its media queries, two frames)
    with contextlib.suppress(TimeoutError):
        settle(page, "() => Promise.all(document.getAnimations()"
                     ".filter(a => a.playState === 'running'"
                     " && a.effect?.getComputedTiming().iterations !== Infinity)"
                     ".map(a => a.finished.catch(() => null)))",
               what=f"the running animations at {width} px")


# Everything that renders after `load`: MathJax typesetting, the widget manager, lazy images.
_RENDERED_JS = """() => {
  const math = [...document.querySelectorAll('.math')];
  if (math.length && !(window.MathJax && MathJax.startup)) return false;
  if (math.some(m => !m.querySelector('mjx-container'))) return false;
  const views = [...document.querySelectorAll('script[type="%s"]')];
  if (views.length && !views.every(v => v.previousElementSibling &&
        v.previousElementSibling.classList.contains('widget-subarea') &&
        v.previousElementSibling.childElementCount > 0)) return false;
  return [...document.images].every(i => i.complete);
}""" % VIEW_MIME   # noqa: UP031 - JavaScript braces read better than {{ }}


def wait_rendered(page, timeout=RENDER_TIMEOUT_MS):
    """Wait until math, widgets and images are rendered; a page that never gets there is reported
    by check_page (this only waits)."""
    try:
        page.wait_for_function(_RENDERED_JS, timeout=timeout, polling=100)
    except Exception:   # the checks below say what is missing
        pass
    try:   # MathJax may still be laying out the last expressions
        settle(page, "() => window.MathJax && MathJax.startup && MathJax.startup.promise",
               seconds=timeout / 1000, what="MathJax's start")
    except Exception:
        pass


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


# ---------------------------------------------------------------- launch and download buttons
def check_launch_buttons(page, entry, repo_root, repository, launch, binder=True):
    """The Colab, Binder and JupyterHub buttons and the .ipynb download of a notebook page open
    `entry`.ipynb of the configured repository and branch, and that notebook exists. `binder`:
    whether the chapter fits Binder's memory (chapter_runs.fits_binder); where it does not, the
    page must offer no Binder button."""
    hrefs = page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.href)")
    url = repository["url"].rstrip("/")
    owner_repo = urllib.parse.urlsplit(url).path.strip("/")
    branch = repository.get("branch", "main")
    book = repository.get("path_to_book", "").strip("/")
    want = "/".join(p for p in (book, entry + ".ipynb") if p)
    problems = []
    if not (pathlib.Path(repo_root) / want).is_file():
        problems.append(f"{want} is not a file of the repository")

    def find(prefix):
        return [h for h in hrefs if h.startswith(prefix.rstrip("/") + "/")]

    expected = {}
    if launch.get("colab_url"):
        expected["Colab"] = (find(launch["colab_url"]), lambda h: urllib.parse.urlsplit(h).path ==
                             f"/github/{owner_repo}/blob/{branch}/{want}")
    if launch.get("binderhub_url") and not binder and find(launch["binderhub_url"]):
        problems.append("a Binder button on a chapter that does not fit Binder's memory")
    if launch.get("binderhub_url") and binder:
        def binder_ok(h):
            s = urllib.parse.urlsplit(h)
            q = urllib.parse.parse_qs(s.query)
            return (s.path == f"/v2/gh/{owner_repo}/{branch}"
                    and q.get("urlpath", [""])[0].split("/tree/", 1)[-1] == want)
        expected["Binder"] = (find(launch["binderhub_url"]), binder_ok)
    if launch.get("jupyterhub_url"):
        def hub_ok(h):
            q = urllib.parse.parse_qs(urllib.parse.urlsplit(h).query)
            repo_name = owner_repo.split("/")[-1]
            return (q.get("repo", [""])[0].rstrip("/") == url and q.get("branch", [""])[0] == branch
                    and q.get("urlpath", [""])[0].split("/tree/", 1)[-1] == f"{repo_name}/{want}")
        expected["JupyterHub"] = (find(launch["jupyterhub_url"]), hub_ok)
    for name, (found, ok) in expected.items():
        if not found:
            problems.append(f"no {name} launch button")
        for h in found:
            if not ok(h):
                problems.append(f"{name} button opens {h}, expected {want} on branch {branch}")
    downloads = [h for h in hrefs if urllib.parse.urlsplit(h).path.endswith(".ipynb")
                 and "/_sources/" in h]
    if not downloads:
        problems.append("no .ipynb download button")
    for h in downloads:
        if not urllib.parse.urlsplit(h).path.endswith("/_sources/" + entry + ".ipynb"):
            problems.append(f".ipynb download {h} is not {entry}.ipynb")
    return problems


# ---------------------------------------------------------------- a static figure beside each widget
_WIDGET_FIGURE_JS = """(viewMime) => {
  const cells = [...document.querySelectorAll('.cell')];
  const hasFigure = c => !!c && [...c.querySelectorAll('.cell_output img')]
      .some(i => !i.closest('.widget-subarea'));
  // prose with this run's numbers (helpers.say, input hidden) sits between cells as text does
  const prose = c => c.classList.contains('tag_remove-input') && !hasFigure(c);
  const step = (i, d) => {
    let j = i + d;
    while (cells[j] && prose(cells[j])) j += d;
    return cells[j];
  };
  const out = [];
  for (const v of document.querySelectorAll('script[type="' + viewMime + '"]')) {
    const cell = v.closest('.cell'), i = cells.indexOf(cell);
    if (!cell) continue;
    if (![step(i, -1), cell, step(i, 1)].some(hasFigure)) {
      const src = cell.querySelector('.cell_input pre');
      out.push((src ? src.textContent : '').trim().split('\\n')[0].slice(0, 80));
    }
  }
  return out;
}"""


def check_widget_figures(page):
    """Widgets lose their callbacks in the static book: each widget cell needs a static figure
    (a matplotlib output) in the same cell or the cell just before or after it."""
    return [f"widget without a static figure beside it (cell starting {src!r})"
            for src in page.evaluate(_WIDGET_FIGURE_JS, VIEW_MIME)]


# Text that runs past its column: cell outputs and inline code wider than the box they sit in
# (scrolled sideways or cut), and, at phone width, a page wider than the screen.
_FITS_JS = """() => {
  const out = [];
  for (const el of document.querySelectorAll('main .cell_output pre, main code.literal')) {
    if (el.closest('.highlight, .course-explorer')) continue;   // code cells scroll by design
    const r = el.getBoundingClientRect();
    if (!r.width) continue;
    const box = el.closest('.cell_output, p, li, td, dd, dt') || el.parentElement;
    const over = Math.max(el.scrollWidth - el.clientWidth,
                          r.right - box.getBoundingClientRect().right);
    if (over > 2) out.push({text: (el.textContent || '').trim().slice(0, 60), over: Math.round(over)});
  }
  return {items: out, page: document.documentElement.scrollWidth - window.innerWidth,
          width: window.innerWidth};
}"""

PHONE_WIDTH = 390


def check_fits(page, phone_width=PHONE_WIDTH):
    """Text outputs and inline code that run past their column at this width and at phone width,
    and a page wider than a phone's screen. Leaves the page at phone width."""
    problems = []
    size = page.viewport_size or {"width": 1280, "height": 900}
    for width in dict.fromkeys([size["width"], phone_width]):
        resize(page, width, size["height"])
        seen = page.evaluate(_FITS_JS)
        for item in seen["items"][:5]:
            problems.append(f"at {width} px a text runs {item['over']} px past its column: "
                            f"{item['text']!r}")
        if len(seen["items"]) > 5:
            problems.append(f"at {width} px {len(seen['items']) - 5} more texts run past their "
                            f"column")
        if width == phone_width and seen["page"] > 1:
            problems.append(f"at {width} px the page scrolls sideways by {seen['page']} px")
    return problems


# ---------------------------------------------------------------- controls that do nothing
_WIDGET_CONTROLS_JS = """(viewMime) => {
  const out = [];
  for (const v of document.querySelectorAll('script[type="' + viewMime + '"]')) {
    const area = v.previousElementSibling;
    // ipywidgets 8 draws sliders as noUiSlider handles (role=slider), not <input>s
    const controls = area ? area.querySelectorAll('input, select, textarea, button, ' +
                                                   '[role="slider"]').length : 0;
    if (!controls) continue;
    const cell = v.closest('.cell');
    const src = cell ? cell.querySelector('.cell_input pre') : null;
    out.push({controls, src: (src ? src.textContent : '').trim().split('\\n')[0].slice(0, 80)});
  }
  return out;
}"""


def check_widget_twins(page):
    """A widget with controls on a page is dead (no kernel runs its callbacks): an output that
    carries a static twin (text/html, helpers.with_static_twin) shows the twin instead, so any
    widget view with controls left on the page has none."""
    return [f"a widget with {w['controls']} control(s) and no static twin: they do nothing on "
            f"this page (cell starting {w['src']!r})"
            for w in page.evaluate(_WIDGET_CONTROLS_JS, VIEW_MIME)]


# ---------------------------------------------------------------- tables on a phone
# Text whose lines rely on alignment (book/_ext/text_tables.py's test, in JavaScript: two or more
# lines, any one indented or with a gap of two spaces or more between words): a wrapped one is
# found by its height, with and without wrapping. test_pages runs it on every page.
_TEXT_TABLES_JS = """() => {
  const LEADING = /^[ \\t]+\\S/, GAP = /\\S(?: {2,}|\\t)\\S/;
  const out = [];
  for (const pre of document.querySelectorAll('main .cell_output pre')) {
    const lines = pre.textContent.split('\\n').filter(l => l.trim());
    if (lines.length < 2 || !lines.some(l => LEADING.test(l) || GAP.test(l))) continue;
    if (!pre.getBoundingClientRect().height) continue;   // folded away
    const shown = pre.getBoundingClientRect().height;
    const old = pre.style.whiteSpace;
    pre.style.whiteSpace = 'pre';
    const unwrapped = pre.getBoundingClientRect().height;
    pre.style.whiteSpace = old;
    if (shown > unwrapped + 1) out.push({text: lines[0].trim().slice(0, 60), extra: Math.round(shown - unwrapped)});
  }
  return out;
}"""


def check_text_tables(page, phone_width=PHONE_WIDTH):
    """Column-aligned text outputs (printed tables, printed code) that wrap at phone width: their
    columns become noise. Leaves the page at phone width."""
    size = page.viewport_size or {"width": 1280, "height": 900}
    resize(page, phone_width, size["height"])
    return [f"at {phone_width} px a column-aligned output wraps ({t['extra']} px taller): "
            f"{t['text']!r}" for t in page.evaluate(_TEXT_TABLES_JS)]


# ---------------------------------------------------------------- the header bar
_HEADER_JS = """() => {
  const out = [];
  for (const h of document.querySelectorAll('header.bd-header, .bd-header')) {
    const r = h.getBoundingClientRect();
    if (r.height < 2 || getComputedStyle(h).display === 'none') continue;
    const shown = [...h.querySelectorAll('a, button, input, img, p, span, h1, h2, div')]
      .filter(e => { const b = e.getBoundingClientRect(); return b.width > 0 && b.height > 0 &&
                     getComputedStyle(e).visibility !== 'hidden'; })
      .filter(e => !e.closest('.search-button, .search-button-field, .search-button__button'));
    const content = shown.filter(e => e.matches('a, button, input, img') ||
                                      (e.childElementCount === 0 && e.textContent.trim()));
    if (!content.length) out.push(Math.round(r.height));
  }
  return out;
}"""


def check_header(page, width=1366):
    """A header bar across the top of a wide page that holds nothing but a search button (the
    sidebar has one): empty space above the text."""
    size = page.viewport_size or {"width": 1280, "height": 900}
    resize(page, width, size["height"])
    return [f"at {width} px an empty header bar ({h} px high) tops the page"
            for h in page.evaluate(_HEADER_JS)]
