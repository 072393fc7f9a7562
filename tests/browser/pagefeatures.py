"""Checks of one rendered page's features (pagecheck.py re-exports them): the launch and
download buttons, a static figure beside each widget, text that fits its column, controls
that do something, aligned text tables on a phone, and the header bar."""
import pathlib
import urllib.parse

from pageserve import VIEW_MIME, resize


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
