"""The built pages say what book/_ext/runs.json recorded (book/_ext/course_badges.py): every
chapter's badge its run time and needs, the landing page a table with one row per chapter.
The HTML of `make test-book` (and, for the tables on a phone, the browser). How the record is
made and the errors for a missing chapter: tests/test_chapter_runs.py."""
import html as html_lib
import re
import sys

import book_files
import pytest

sys.path.insert(0, str(book_files.ROOT / "book" / "_ext"))
import chapter_runs


def _text(fragment):
    return html_lib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", fragment))).strip()


def _chapters(book_dir):
    return [(p.relative_to(book_dir).with_suffix("").as_posix(), p)
            for p in book_files.toc_notebooks()]


def test_every_badge_says_the_recorded_run(site, book_dir):
    record = chapter_runs.load()
    for doc, path in _chapters(book_dir):
        page = (site / f"{doc}.html").read_text()
        badge = re.search(r'<p class="runs-on">(.*?)</p>', page, re.S)
        assert badge, f"{doc}: no runs-on badge"
        text = _text(badge.group(1))
        times, needs = chapter_runs.badge_text(record, doc, chapter_runs.gpus_wanted(path))
        assert f"Run time: {times}." in text, f"{doc}: {text!r}"
        assert f"Needs: {needs}." in text, f"{doc}: {text!r}"


def test_the_landing_page_tables_every_chapter(site, book_dir):
    record = chapter_runs.load()
    page = (site / "book" / "intro.html").read_text()
    table = re.search(r'<table class="[^"]*chapter-runs[^"]*".*?</table>', page, re.S)
    assert table, "intro.html has no table of the chapters' runs ({chapter-runs})"
    rows = [[_text(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)]
            for r in re.findall(r"<tr[^>]*>(.*?)</tr>", table.group(0), re.S)]
    assert tuple(rows[0]) == chapter_runs.TABLE_HEAD
    titles = [_text(re.search(r"<h1[^>]*>(.*?)</h1>", (site / f"{d}.html").read_text(),
                              re.S).group(1)).rstrip("#").strip() for d, _ in _chapters(book_dir)]
    want = chapter_runs.table_rows(record, [(d, t, chapter_runs.gpus_wanted(p))
                                            for (d, p), t in zip(_chapters(book_dir), titles)])
    assert [tuple(r) for r in rows[1:]] == want
    links = re.findall(r'<a class="reference internal" href="([^"]+)"', table.group(0))
    assert [link.split("#")[0] for link in links] == \
        [f"{d.removeprefix('book/')}.html" for d, _ in _chapters(book_dir)]


@pytest.mark.parametrize("seconds, text", [(4.4, "4 s"), (59.6, "1 min 00 s"), (185, "3 min 05 s")])
def test_times_read_well(seconds, text):
    assert chapter_runs.fmt_seconds(seconds) == text


# The landing page's tables at phone width, and the boxes they scroll in. The chapters' table
# (five columns) scrolls by design; the parts' table must fit (once: its "their announced time"
# header made it 381 px in a 358 px box, a few pixels of scroll that read as a cut-off column).
_TABLES_FIT_JS = """() => [...document.querySelectorAll('main table.chapter-runs')].map(t => {
  const box = t.closest('.pst-scrollable-table-container') || t.parentElement;
  return {head: t.querySelector('tr').textContent.trim().replace(/\\s+/g, ' ').slice(0, 60),
          table: Math.round(t.getBoundingClientRect().width), box: box.clientWidth};
})"""


def test_the_landing_page_tables_fit_a_phone(browser, base_url):
    """In a browser (the session's Chromium), at 390 px: the parts' table fits its box."""
    from pagecheck import open_page, resize
    seen = open_page(browser, base_url + "book/intro.html", base_url)
    try:
        resize(seen.page, 390, 844)
        tables = seen.page.evaluate(_TABLES_FIT_JS)
    finally:
        seen.page.close()
    parts = [t for t in tables if t["head"].startswith(chapter_runs.PART_HEAD[0])]
    assert len(tables) == 2 and len(parts) == 1, tables
    assert parts[0]["table"] <= parts[0]["box"] + 1, \
        f"at 390 px the parts' table is wider than its box: {parts[0]}"


# A chapter's badge at phone width: every fact on the page, in a type still readable, in at most a
# quarter of the screen's height (at the body's size it took a third: 290 px of 844).
_BADGE_JS = """() => { const p = document.querySelector('p.runs-on');
  const facts = [...p.querySelectorAll('.runs-on-fact')];
  return {height: p.getBoundingClientRect().height, width: p.getBoundingClientRect().width,
          column: p.parentElement.clientWidth, font: parseFloat(getComputedStyle(p).fontSize),
          facts: facts.map(f => f.textContent.trim().split(':')[0]),
          lefts: facts.map(f => Math.round(f.getBoundingClientRect().left))}; }"""
PHONE_HEIGHT = 844


def test_the_badge_is_compact_on_a_phone(browser, base_url, book_dir):
    """In a browser, at 390 px: the longest badges of the book fit a quarter of the screen, with
    their run time, needs and Binder each starting a line, in a type of 12 px or more."""
    from pagecheck import open_page, resize
    docs = sorted(_chapters(book_dir), key=lambda c: -len(
        " ".join(chapter_runs.badge_text(chapter_runs.load(), c[0],
                                         chapter_runs.gpus_wanted(c[1])))))[:3]
    for doc, _ in docs:
        seen = open_page(browser, base_url + f"{doc}.html", base_url)
        try:
            resize(seen.page, 390, PHONE_HEIGHT)
            got = seen.page.evaluate(_BADGE_JS)
        finally:
            seen.page.close()
        assert got["facts"] == ["Run time", "Needs", "Binder"], f"{doc}: {got}"
        assert got["width"] <= got["column"] + 1, f"{doc}: the badge is wider than the column"
        assert got["font"] >= 12, f"{doc}: the badge's type is {got['font']} px"
        assert len(set(got["lefts"])) == 1, f"{doc}: the facts do not start a line each: {got}"
        assert got["height"] <= PHONE_HEIGHT / 4, \
            f"{doc}: at 390 px the badge is {got['height']:.0f} px tall: {got}"
