"""Part VII's plan tables (helpers.composed.planner_page.plan_table_html) on a phone: the table
scrolls sideways in its box, its caption wraps within the box and stays in view while the
table scrolls (it ran off-screen with the table's columns)."""

_CAPTIONS_JS = """() => [...document.querySelectorAll('.plan-table')].map(d => {
  const c = d.querySelector('caption'), box = d.getBoundingClientRect();
  const before = c && c.getBoundingClientRect();
  d.scrollLeft = d.scrollWidth;
  const after = c && c.getBoundingClientRect();
  d.scrollLeft = 0;
  return {box: [box.left, box.right], scrolls: d.scrollWidth > d.clientWidth + 1,
          caption: c && [before.left, before.right], scrolled: c && [after.left, after.right],
          text: c ? c.textContent.slice(0, 50) : null};
})"""


def test_plan_table_captions_stay_on_a_phone(browser, base_url):
    """In a browser, at 390 px: every plan table's caption lies within its box, scrolled or not,
    and at least one table is wider than its box (else this checks nothing)."""
    from pagecheck import open_page, resize
    seen = open_page(browser, base_url + "book/part7/composed.html", base_url)
    try:
        resize(seen.page, 390, 844)
        tables = seen.page.evaluate(_CAPTIONS_JS)
    finally:
        seen.page.close()
    captioned = [t for t in tables if t["caption"]]
    assert captioned and any(t["scrolls"] for t in captioned), tables
    for t in captioned:
        left, right = t["box"]
        for where in ("caption", "scrolled"):
            c_left, c_right = t[where]
            assert left - 1 <= c_left and c_right <= right + 1, \
                f"the caption {t['text']!r} runs out of its box ({where}): {t}"
