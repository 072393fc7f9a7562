"""The page checks can fail: small synthetic pages, each broken in one way, must be reported.

No book build needed: the pages are written to a temporary folder, with the vendored widget
manager and MathJax of book/_vendor, and served like the book.
"""
import json
import pathlib
import shutil

import pytest
from pagecheck import (
    check_fits,
    check_header,
    check_launch_buttons,
    check_page,
    check_text_tables,
    check_widget_figures,
    check_widget_twins,
    open_page,
    serve,
)
from PIL import Image, ImageDraw

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENDOR = ROOT / "book" / "_vendor"
REPO = {"url": "https://github.com/multigpu-course/multigpu-course", "branch": "main",
        "path_to_book": ""}
LAUNCH = {"binderhub_url": "https://mybinder.org", "colab_url": "https://colab.research.google.com",
          "jupyterhub_url": "https://hub.example.org"}
ENTRY = "book/part2/scratch"


def _widget_state(*widgets):
    from ipywidgets.embed import embed_data
    data = embed_data(views=list(widgets))
    return data["manager_state"], [json.dumps(v) for v in data["view_specs"]]


def _page(body, state=None, math=False, css=False):
    # an icon, as the book's pages have: else Chromium asks the server for /favicon.ico
    head = ['<meta charset="utf-8"><title>t</title><link rel="icon" href="data:,">']
    if css:   # the book's own stylesheet (book/_css/course.css)
        head.append('<link rel="stylesheet" href="_static/course.css">')
    if state is not None:
        head.append('<script type="application/vnd.jupyter.widget-state+json">'
                    f'{json.dumps(state)}</script>')
        head += [f'<script src="_static/ipywidgets/{n}"></script>'
                 for n in ("require.js", "config.js", "embed-amd.js")]
    if math:
        head.append('<script defer src="_static/mathjax/tex-mml-chtml.js"></script>')
    return (f"<!DOCTYPE html><html><head>{''.join(head)}</head>"
            f"<body><main>{body}</main></body></html>")


def _cell(output_html, tags=(), source="x = 1"):
    cls = " ".join(["cell", "docutils", "container"] + [f"tag_{t}" for t in tags])
    return (f'<div class="{cls}"><div class="cell_input"><pre>{source}</pre></div>'
            f'<div class="cell_output docutils container">{output_html}</div></div>')


_TABLE = ('<div class="output stream highlight-myst-ansi"><div class="highlight"><pre>'
          + "\n".join(f"{'row ' + str(i):<12}{i * 1.5:>14.2f}{i * 300:>16,} bytes{i:>12} steps"
                      for i in range(6)) + "</pre></div></div>")
# right-aligned labels (leading spaces, then single spaces) and code indented 8 spaces: layouts
# the alignment rule once missed
_LABELS = ('<div class="output stream highlight-myst-ansi"><div class="highlight"><pre>'
           + "\n".join(f"{'x' * i:>14}: {i * 1.5:.2f} ms ({i * 300} to {i * 400}, 41 samples); "
                        "against plain, eager: 1.00x (1.00-1.00, 41 rounds): within noise"
                        for i in range(1, 5)) + "</pre></div></div>")
_CODE = ('<div class="output stream highlight-myst-ansi"><div class="highlight"><pre>'
         + "\n".join(f"        value_{i} = compute(self.first_argument, self.second_argument, "
                      f"self.third_argument, {i})" for i in range(4)) + "</pre></div></div>")
_HEADER = ('<header class="bd-header" style="display:flex;height:64px"><div>'
           '<button class="search-button">Search</button></div></header>')


def _view(view_json):
    return f'<script type="application/vnd.jupyter.widget-view+json">{view_json}</script>'


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    import ipywidgets as w
    site = tmp_path_factory.mktemp("site")
    shutil.copytree(VENDOR, site / "_static")
    shutil.copy(ROOT / "book" / "_css" / "course.css", site / "_static" / "course.css")
    img = Image.new("RGB", (300, 200), "white")
    ImageDraw.Draw(img).line([(10, 190), (290, 10)], fill="blue", width=3)
    img.save(site / "figure.png")
    Image.new("RGB", (300, 200), "white").save(site / "blank.png")
    img.resize((40, 30)).save(site / "tiny.png")

    good_state, good_views = _widget_state(w.IntSlider(value=3, description="epochs"))
    empty_state, empty_views = _widget_state(w.HBox([]))
    pages = {
        # a page with everything working: must give no problem at all (the checks are not blind)
        "good.html": _page(
            '<h1 id="top">Good</h1><p>Inline '
            '<span class="math notranslate nohighlight">\\(x^2\\)</span>'
            ' and <a href="good.html#top">a link</a>, <a href="#top">another</a>.</p>'
            + _cell('<img src="figure.png" alt="a plot">')
            + _cell(_view(good_views[0]))
            + _cell('<div class="output stream highlight-myst-ansi"><pre>loss 0.31</pre></div>')
            + _cell('<div class="output stream highlight-myst-ansi"><pre>ValueError: no GPU</pre>'
                    '</div>', source="try:\n    f()\nexcept ValueError as e:\n    print(e)")
            + _cell('<div class="output traceback"><pre>Traceback (most recent call last):\n'
                    'ValueError: shown on purpose</pre></div>', tags=["raises-exception"]),
            state=good_state, math=True),
        "traceback.html": _page(_cell(
            '<div class="output traceback highlight-ipythontb notranslate"><div class="highlight">'
            '<pre>Traceback (most recent call last):\n  File "x.py", line 1\n'
            'ZeroDivisionError: division by zero</pre></div></div>')),
        "error_text.html": _page(_cell(
            '<div class="output stream highlight-myst-ansi"><pre>epoch 1\n'
            'RuntimeError: Expected all tensors to be on the same device</pre></div>')),
        "broken_link.html": _page('<a href="missing.html">gone</a> '
                                  '<a href="good.html#nope">no anchor</a>'),
        "broken_image.html": _page('<img src="nope.png" alt="lost">'),
        "blank_figure.html": _page(_cell('<img src="blank.png">')),
        "tiny_figure.html": _page(_cell('<img src="tiny.png">')),
        "blank_widget.html": _page(_cell(_view(empty_views[0])), state=empty_state),
        "no_manager_widget.html": _page(_cell(_view(good_views[0]))),
        "raw_math.html": _page('<p><span class="math notranslate nohighlight">\\(x^2\\)</span></p>'
                               '<p>$$ \\frac{1}{2} $$</p>'),
        "console.html": _page('<script>console.error("boom")</script>'
                              '<script>throw new Error("kaput")</script>'
                              '<script src="missing.js"></script>'),
        "twice.html": _page(_cell(_view(good_views[0]))
                            + '<script src="_static/ipywidgets/embed-amd.js"></script>',
                            state=good_state),
        # the widget manager without config.js, on a page with MathJax 3: labels throw TypeError
        "widget_math.html": _page(
            _cell(_view(good_views[0])) + '<span class="math">\\(x\\)</span>',
            state=good_state, math=True).replace(
            '<script src="_static/ipywidgets/config.js"></script>', ''),
        "widget_alone.html": _page(_cell(_view(good_views[0])) + _cell("<pre>text</pre>"),
                                   state=good_state),
        "wide.html": _page(
            '<p>See <code class="literal">' + "torch.distributed." * 12 + '</code></p>'
            + _cell('<pre>' + "x" * 400 + '</pre>')),
        "external.html": _page('<img src="https://example.org/plot.png">'),
        # {{ }} in the prose and in inline code is raw template text; in a code cell it is code
        "template.html": _page('<p>This is release {{ release_tag }}.</p><p>See <code>'
                               '{{ version }}</code>.</p>' + _cell('<pre>{{x}}</pre>',
                                                                   source='"{{x}}"')),
        # a printed table, wrapped by the course's CSS unless marked text-table (the extension)
        "table_wrap.html": _page(_cell(_TABLE), css=True),
        "table_scroll.html": _page(_cell(_TABLE.replace('"output stream',
                                                        '"output stream text-table')), css=True),
        "labels_wrap.html": _page(_cell(_LABELS), css=True),
        "code_wrap.html": _page(_cell(_CODE), css=True),
        "header_empty.html": _page(_HEADER + "<p>text</p>"),
        "header_hidden.html": _page(_HEADER + "<p>text</p>", css=True),
        "launch.html": _page(
            '<a href="https://colab.research.google.com/github/multigpu-course/multigpu-course/'
            'blob/main/book/part2/other.ipynb">colab</a>'
            '<a href="https://mybinder.org/v2/gh/multigpu-course/multigpu-course/dev?urlpath='
            'lab/tree/book/part2/scratch.ipynb">binder</a>'
            '<a href="_sources/book/part2/scratch.ipynb">download</a>'),
        "launch_ok.html": _page(
            '<a href="https://colab.research.google.com/github/multigpu-course/multigpu-course/'
            'blob/main/book/part2/scratch.ipynb">colab</a>'
            '<a href="https://mybinder.org/v2/gh/multigpu-course/multigpu-course/main?urlpath='
            'lab/tree/book/part2/scratch.ipynb">binder</a>'
            '<a href="https://hub.example.org/hub/user-redirect/git-pull?repo=https%3A//github.com/'
            'multigpu-course/multigpu-course&urlpath=lab/tree/multigpu-course/book/part2/'
            'scratch.ipynb&branch=main">hub</a>'
            '<a href="_sources/book/part2/scratch.ipynb">download</a>'),
    }
    for name, text in pages.items():
        (site / name).write_text(text)
    (site / "_sources/book/part2").mkdir(parents=True)
    (site / "_sources/book/part2/scratch.ipynb").write_text("{}")
    repo = tmp_path_factory.mktemp("repo")
    (repo / "book/part2").mkdir(parents=True)
    (repo / "book/part2/scratch.ipynb").write_text("{}")
    with serve(site) as base:
        yield base, site, repo


def _problems(browser, synthetic, name):
    base, site, _ = synthetic
    seen = open_page(browser, base + name, base, timeout=3000)   # broken pages never get there
    try:
        return check_page(seen, base, site), seen
    finally:
        seen.page.close()


def test_a_good_page_passes(browser, synthetic):
    problems, _ = _problems(browser, synthetic, "good.html")
    assert problems == []


@pytest.mark.parametrize("name, expected", [
    ("traceback.html", ["cell output shows an error"]),
    ("error_text.html", ["cell output shows an error", "RuntimeError"]),
    ("broken_link.html", ["broken link 'missing.html'", "no id 'nope' in good.html"]),
    ("broken_image.html", ["broken image", "local request failed", "nope.png (HTTP 404)"]),
    ("blank_figure.html", ["is blank"]),
    ("tiny_figure.html", ["is only 40x30 px"]),
    ("blank_widget.html", ["renders blank"]),
    ("no_manager_widget.html", ["not rendered"]),
    ("raw_math.html", ["not rendered by MathJax", "raw TeX left in the text"]),
    ("console.html", ["console error: boom", "uncaught Error: kaput", "missing.js (HTTP 404)"]),
    ("widget_math.html", ["uncaught TypeError"]),
    ("twice.html", ["embed-amd.js is loaded 2 times"]),
])
def test_a_broken_page_is_reported(browser, synthetic, name, expected):
    problems, _ = _problems(browser, synthetic, name)
    text = "\n".join(problems)
    for e in expected:
        assert e in text, f"{name}: expected {e!r} among the problems:\n{text}"


def test_a_widget_needs_a_static_figure_beside_it(browser, synthetic):
    base, site, _ = synthetic
    found = {}
    for name in ("good.html", "widget_alone.html"):
        seen = open_page(browser, base + name, base, timeout=3000)
        try:
            found[name] = check_widget_figures(seen.page)
        finally:
            seen.page.close()
    assert found["good.html"] == []
    assert found["widget_alone.html"] == ["widget without a static figure beside it "
                                          "(cell starting 'x = 1')"]


def test_raw_template_text_is_reported_in_prose_not_in_code(browser, synthetic):
    problems, _ = _problems(browser, synthetic, "template.html")
    assert problems == ["raw template text in the prose: 'This is release {{ release_tag }}.'",
                        "raw template text in the prose: '{{ version }}'"], problems


def _run_on(browser, synthetic, name, check):
    base, _, _ = synthetic
    seen = open_page(browser, base + name, base, timeout=3000)
    try:
        return check(seen.page)
    finally:
        seen.page.close()


def test_a_widget_with_controls_needs_a_static_twin(browser, synthetic):
    assert _run_on(browser, synthetic, "widget_alone.html", check_widget_twins) == [
        "a widget with 1 control(s) and no static twin: they do nothing on this page "
        "(cell starting 'x = 1')"]
    assert _run_on(browser, synthetic, "wide.html", check_widget_twins) == []


def test_a_wrapped_table_is_reported_on_a_phone(browser, synthetic):
    """The course's CSS wraps text outputs; a table marked text-table (book/_ext/text_tables.py)
    keeps its columns and scrolls."""
    found = _run_on(browser, synthetic, "table_wrap.html", check_text_tables)
    assert len(found) == 1 and "at 390 px a column-aligned output wraps" in found[0], found
    assert _run_on(browser, synthetic, "table_scroll.html", check_text_tables) == []
    # what the rule once missed: right-aligned labels, code indented deeper than 4 spaces
    for name in ("labels_wrap.html", "code_wrap.html"):
        found = _run_on(browser, synthetic, name, check_text_tables)
        assert len(found) == 1 and "column-aligned output wraps" in found[0], (name, found)


def test_an_empty_header_bar_is_reported(browser, synthetic):
    """A bar with nothing but a search button; book/_css/course.css hides it."""
    assert _run_on(browser, synthetic, "header_empty.html", check_header) == [
        "at 1366 px an empty header bar (64 px high) tops the page"]
    assert _run_on(browser, synthetic, "header_hidden.html", check_header) == []


def test_external_requests_are_blocked_not_needed(browser, synthetic):
    problems, seen = _problems(browser, synthetic, "external.html")
    assert seen.blocked == ["https://example.org/plot.png"]
    assert any("broken image https://example.org/plot.png" in p for p in problems)


def test_no_host_name_resolves(browser, tmp_path):
    """Offline wherever the tests run, internet or not: a name that resolves on any machine
    (localhost, for the very server of the page) loads nothing; only 127.0.0.1 does."""
    Image.new("RGB", (120, 120), "red").save(tmp_path / "plot.png")
    with serve(tmp_path) as base:
        elsewhere = base.replace("127.0.0.1", "localhost") + "plot.png"
        (tmp_path / "p.html").write_text(_page(f'<img src="plot.png"><img src="{elsewhere}">'))
        seen = open_page(browser, base + "p.html", base, timeout=3000)
        try:
            problems = check_page(seen, base, tmp_path)
        finally:
            seen.page.close()
    assert seen.blocked == [elsewhere]
    assert problems == [f"broken image {elsewhere}"], problems


def test_launch_buttons_must_open_the_notebook(browser, synthetic):
    base, site, repo = synthetic
    for name, want in [("launch.html", ["Colab button opens", "other.ipynb",
                                        "Binder button opens", "no JupyterHub launch button"]),
                       ("launch_ok.html", [])]:
        seen = open_page(browser, base + name, base, timeout=3000)
        try:
            problems = check_launch_buttons(seen.page, ENTRY, repo, REPO, LAUNCH)
        finally:
            seen.page.close()
        text = "\n".join(problems)
        assert bool(problems) == bool(want), f"{name}: {text}"
        for w in want:
            assert w in text, f"{name}: expected {w!r} in:\n{text}"
    seen = open_page(browser, base + "launch_ok.html", base, timeout=3000)
    try:
        problems = check_launch_buttons(seen.page, "book/part2/gone", repo, REPO, LAUNCH)
    finally:
        seen.page.close()
    assert any("book/part2/gone.ipynb is not a file of the repository" in p for p in problems)


def test_text_past_its_column_is_reported(browser, synthetic):
    """An unwrapped wide output and long inline code: reported at both widths, with the page's
    sideways scroll on a phone; the good page fits."""
    base, site, _ = synthetic
    found = {}
    for name in ("good.html", "wide.html"):
        seen = open_page(browser, base + name, base, timeout=3000)
        try:
            seen.page.set_viewport_size({"width": 1280, "height": 900})
            found[name] = check_fits(seen.page)
        finally:
            seen.page.close()
    assert found["good.html"] == [], found["good.html"]
    text = "\n".join(found["wide.html"])
    assert "at 1280 px a text runs" in text and "'xxxx" in text, text
    assert "at 390 px the page scrolls sideways" in text, text
