"""That the accessibility check can fail. axe-core (tests/browser/axecheck.py) runs on every page
of the rendered book in test_pages.py's test_page: every rule in light mode, on the page as
loaded, and its colour rules in dark mode, the same page turned dark by the theme's switch (not a
second load of every page). Dark-mode screenshots (the first screen of each page; test_page takes
the full light-mode page) go to artifacts/screenshots/<entry>-dark.png.
"""
from axecheck import COLOUR_RULES, axe_failures, axe_violations, dark_mode_failures
from pagecheck import wait_rendered


def open_in_mode(context, url, base, mode):
    """The page in `mode` (light/dark): pydata-sphinx-theme reads localStorage 'theme'."""
    page = context.new_page()   # offline (conftest.py): nothing outside `base` loads
    page.add_init_script(f"localStorage.setItem('theme', '{mode}'); "
                         f"localStorage.setItem('mode', '{mode}');")
    page.goto(url, wait_until="load")
    wait_rendered(page)
    return page


def test_axe_reports_an_inaccessible_page(browser, tmp_path):
    """The check can fail: an image without alt text (critical) and grey-on-grey text (serious)."""
    from pagecheck import serve
    (tmp_path / "bad.html").write_text(
        '<!DOCTYPE html><html lang="en"><head><title>t</title></head><body><main>'
        '<h1>Bad</h1><img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=" width="50" height="50">'
        '<p style="color:#999;background:#aaa">hard to read</p></main></body></html>')
    with serve(tmp_path) as base:
        page = open_in_mode(browser, base + "bad.html", base, "light")
        try:
            violations = axe_violations(page)
            colour = {v["id"] for v in axe_violations(page, COLOUR_RULES)}   # dark mode's
            no_switch = dark_mode_failures(page, "bad", tmp_path)   # no theme switch
        finally:
            page.close()
    found = {v["id"]: v["impact"] for v in violations}
    assert found.get("image-alt") == "critical", found
    assert found.get("color-contrast") == "serious", found
    assert colour == {"color-contrast"}, f"the colour rules alone found {colour}"
    failing = axe_failures("bad", "light", violations, tmp_path)
    assert any("critical image-alt" in f for f in failing), failing
    assert any("serious color-contrast" in f for f in failing), failing
    assert (tmp_path / "bad-axe-light.json").is_file()
    assert no_switch == ["the theme's switch did not turn the page dark (data-theme=None)"], \
        no_switch


def test_code_styles_are_judged_once_each(browser, tmp_path):
    """The colour rules judge each style of highlighted code once (repeats hidden while they
    run): a low-contrast style is still found, on its first span and on one met only after many
    readable repeats, in the colour rules' own run and in the full one; the page is left as it
    was."""
    from pagecheck import serve
    ok = '<span style="color:#000">x</span> ' * 200
    for name, body in (("first", '<span style="color:#bbb">faint</span> ' + ok),
                       ("late", ok + '<span style="color:#ccc">faint</span>'),
                       ("fine", ok)):
        (tmp_path / f"{name}.html").write_text(
            '<!DOCTYPE html><html lang="en"><head><title>t</title></head><body><main><h1>C</h1>'
            f'<div class="highlight" style="background:#fff"><pre>{body}</pre></div>'
            '</main></body></html>')
    found = {}
    with serve(tmp_path) as base:
        for name in ("first", "late", "fine"):
            page = open_in_mode(browser, base + f"{name}.html", base, "light")
            try:
                found[name] = ({v["id"]: v["count"] for v in axe_violations(page, COLOUR_RULES)},
                               {v["id"]: v["count"] for v in axe_violations(page)})
                left = page.evaluate("() => [document.querySelectorAll('[data-axe-repeat]')"
                                     ".length, document.styleSheets.length]")
            finally:
                page.close()
            assert left == [0, 0], f"{name}: the page was not left as it was: {left}"
    for name in ("first", "late"):
        assert found[name] == ({"color-contrast": 1}, {"color-contrast": 1}), found[name]
    assert found["fine"] == ({}, {}), found["fine"]
