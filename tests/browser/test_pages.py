"""Every page of the rendered book, as a reader sees it in Chromium, offline.

Needs the built book (`make test-book`, which `make test` runs first). For each page in _toc.yml:
no console error, no failed local request, no broken internal link or image, no error in a cell
output, every notebook figure a real image, math rendered, widgets rendered without internet,
launch and download buttons opening the right notebook (Binder only where the chapter fits its
memory), no raw template text (`{{ ... }}`) in the prose, no widget with controls but no static
twin, no empty header bar at 1366 px, no text running past its column (at 1280 px and on a
phone, 390 px), no column-aligned output wrapped on a phone and no page scrolling sideways on a
phone, and no serious or critical axe-core violation in light mode nor, the page turned dark by
the theme's switch, in dark mode's colours (tests/browser/axecheck.py). A screenshot of each
page goes to artifacts/screenshots/<entry>.png (CI keeps it: the first screen, the whole page
where problems were found), the first screen in dark mode to <entry>-dark.png, with <entry>.json
beside them: the problems found and the external requests the page tried (blocked: the book
must work offline).
"""
import json
import re
import sys
import urllib.parse

import pytest
from axecheck import axe_failures, axe_violations, dark_mode_failures
from pagecheck import (
    check_fits,
    check_header,
    check_launch_buttons,
    check_page,
    check_text_tables,
    check_widget_figures,
    check_widget_twins,
    open_page,
    settle,
    toc_entries_of,
)


def _fits_binder(book_dir, entry):
    """Whether the chapter's recorded quick-mode run fits Binder (its page offers the button)."""
    import book_files
    sys.path.insert(0, str(book_files.ROOT / "book" / "_ext"))
    import chapter_runs
    record = book_dir / "book" / "_ext" / "runs.json"
    return chapter_runs.fits_binder(chapter_runs.load(record) if record.is_file() else {}, entry)


def test_page(entry, browser, base_url, site, book_dir, book_config, shots):
    html = site / f"{entry}.html"
    assert html.is_file(), f"{entry} is in _toc.yml but {html} was not built"
    seen = open_page(browser, base_url + entry + ".html", base_url)
    shot = shots / f"{entry}.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    try:
        # the first screen as loaded; a page with problems: the whole page, below (a full-page
        # capture of a long chapter costs about 2 s of CPU, a minute over the book)
        seen.page.screenshot(path=str(shot))
        # axe-core's every rule in light mode (a new reader's: the theme follows the system's),
        # on the page as loaded, then its colour rules in dark mode (the theme's switch, and
        # back), before the checks below click and resize
        theme = seen.page.evaluate("() => document.documentElement.dataset.theme")
        axe = axe_violations(seen.page) if theme == "light" else None
        dark = dark_mode_failures(seen.page, entry, shots) if theme == "light" else []
        problems = check_page(seen, base_url, site)
        problems += check_widget_figures(seen.page)
        problems += check_widget_twins(seen.page)
        if (book_dir / f"{entry}.ipynb").is_file():
            problems += check_launch_buttons(seen.page, entry, book_dir,
                                             book_config.get("repository", {}),
                                             book_config.get("launch_buttons", {}),
                                             binder=_fits_binder(book_dir, entry))
        problems += check_header(seen.page)
        problems += check_fits(seen.page)   # last: they leave the page at phone width
        problems += check_text_tables(seen.page)
    finally:
        seen.page.close()
    if axe is None:
        problems.append(f"the page opened in {theme!r} mode, not light: axe-core's light-mode "
                        "run needs it")
    else:
        problems += axe_failures(entry, "light", axe, shots) + dark
    problems = list(dict.fromkeys(problems))
    if problems:   # the whole page as loaded, to see them
        again = open_page(browser, base_url + entry + ".html", base_url)
        try:
            again.page.screenshot(path=str(shot), full_page=True)
        finally:
            again.page.close()
    shot.with_suffix(".json").write_text(json.dumps(
        {"page": f"{entry}.html", "problems": problems, "blocked_external": seen.blocked},
        indent=1))
    assert not problems, f"{entry}.html (screenshot {shot}):\n  " + "\n  ".join(problems)


def _search_word(site, entry):
    """A word of the page's title: searching it must find that page."""
    text = (site / f"{entry}.html").read_text()
    h1 = re.search(r"<h1[^>]*>(.*?)</h1>", text, re.S)
    assert h1, f"{entry}.html has no <h1>"
    words = re.findall(r"[A-Za-z]{5,}", re.sub(r"<[^>]+>", " ", h1.group(1)))
    assert words, f"no word to search for in the title of {entry}"
    return max(words, key=len).lower()


def test_search_works_offline(browser, base_url, site, book_dir):
    entry = toc_entries_of(book_dir)[-1]
    word = _search_word(site, entry)
    seen = open_page(browser, base_url + "search.html?q=" + urllib.parse.quote(word), base_url)
    try:
        seen.page.wait_for_selector("#search-results .search-summary, #search-results ul.search li",
                                    timeout=15_000)
        seen.page.wait_for_function(
            "() => !document.querySelector('#search-results h2') || "
            "!/Searching/.test(document.querySelector('#search-results h2').textContent)",
            timeout=15_000)
        hits = seen.page.eval_on_selector_all("#search-results ul.search li a",
                                              "as => as.map(a => a.href)")
        # the snippets under the hits: the page's text, not the theme's buttons' hidden labels
        # ("Color mode") and titles (book/_js/course.js)
        seen.page.wait_for_selector("#search-results ul.search li p.context", timeout=15_000)
        snippets = seen.page.eval_on_selector_all("#search-results ul.search li p.context",
                                                  "ps => ps.map(p => p.textContent)")
        # the text snippets are cut from (Sphinx's Search.htmlToText) of a chapter with every
        # button in its header (launch, download, theme): wherever the word falls
        chapter = next(e for e in toc_entries_of(book_dir) if (book_dir / f"{e}.ipynb").is_file())
        source = settle(seen.page, "async (url) => Search.htmlToText(await (await fetch(url))"
                        ".text())", base_url + chapter + ".html", seconds=30,
                        what=f"fetching {chapter}.html")
        problems = seen.console_errors + seen.local_failures
    finally:
        seen.page.close()
    assert not problems, problems
    assert hits, f"searching {word!r} on search.html found nothing"
    assert any(urllib.parse.urlsplit(h).path.endswith(f"/{entry}.html") for h in hits), \
        f"searching {word!r} did not find {entry}.html, only {hits[:5]}"
    chrome = re.compile(r"Color mode|Toggle \w+ sidebar|Suggest edit|Open issue")
    assert not [t for t in snippets if chrome.search(t)], \
        f"search snippets quote the theme's buttons: {snippets[:3]}"
    assert not chrome.search(source), \
        f"the text search snippets come from holds the theme's buttons: {source[:300]!r}"
    assert _search_word(site, chapter) in source.lower(), "and the chapter's own text"


def test_widgets_and_math_work_from_disk(browser, site):
    """A reader without a server opens _build/html/... straight from disk (file://)."""
    pages = [p for p in sorted(site.rglob("*.html"))
             if "application/vnd.jupyter.widget-state+json" in p.read_text(errors="replace")]
    if not pages:
        pytest.skip("no page with widgets in this book")
    base = site.as_uri() + "/"
    seen = open_page(browser, pages[0].as_uri(), base)
    try:
        problems = check_page(seen, base, site)
    finally:
        seen.page.close()
    assert not problems, f"{pages[0].relative_to(site)} from disk:\n  " + "\n  ".join(problems)


def test_chapter_has_runs_on_badge(entry, site, book_dir):
    """Every notebook chapter says where it runs and how long it takes (book/_ext/course_badges.py):
    a markdown cell under the title with ```{runs-on} cpu gpu gpus``` (the places it runs on)."""
    if not (book_dir / f"{entry}.ipynb").is_file():
        pytest.skip("not a notebook")
    html = (site / f"{entry}.html").read_text()
    badge = re.search(r'<p class="runs-on">(.*?)</p>', html, re.S)
    assert badge, f"{entry}: no runs-on badge; add ```{{runs-on}} cpu gpu gpus``` under the title"
    text = re.sub(r"<[^>]+>", "", badge.group(1))
    assert "Runs on:" in text and "Run time:" in text, text
