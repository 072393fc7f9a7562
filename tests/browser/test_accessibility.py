"""Accessibility of every page of the rendered book: axe-core, in light and in dark mode.

axe-core (pinned in package.json, installed by `npm ci` from package-lock.json into node_modules/;
`make test-browser` does it) runs in headless Chromium on each page of _toc.yml after it rendered.
A violation of impact "serious" or "critical" fails the page (the same rule pydata-sphinx-theme
tests itself with). Dark mode changes colours only, so there axe runs its colour rules (light
mode runs every rule). Dark-mode screenshots (the first screen of each page; test_pages.py
takes the full light-mode page) go to artifacts/screenshots/<entry>-dark.png.
"""
import json
import pathlib

import pytest

from pagecheck import wait_rendered

ROOT = pathlib.Path(__file__).resolve().parents[2]
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
FAIL_ON = ("serious", "critical")
# the rules whose outcome depends on the colour scheme (axe-core 4: contrast, and links told
# from the text around them by colour alone)
COLOUR_RULES = ["color-contrast", "link-in-text-block"]

_RUN_AXE = """async (rules) => {
  const options = {resultTypes: ['violations']};
  if (rules) options.runOnly = {type: 'rule', values: rules};
  const r = await axe.run(document, options);
  return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 3).map(n => n.target.join(' ') + ': ' +
                                   (n.failureSummary || '').split('\\n').slice(1, 2).join(''))
                                   .map(s => s.slice(0, 240)),
    count: v.nodes.length}));
}"""


def open_in_mode(context, url, base, mode):
    """The page in `mode` (light/dark): pydata-sphinx-theme reads localStorage 'theme'."""
    page = context.new_page()
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith((base, "data:"))
               else r.abort("blockedbyclient"))
    page.add_init_script(f"localStorage.setItem('theme', '{mode}'); "
                         f"localStorage.setItem('mode', '{mode}');")
    page.goto(url, wait_until="load")
    wait_rendered(page)
    return page


def axe_violations(page, rules=None):
    """axe-core's violations on the loaded page, [{id, impact, help, nodes, count}]; only
    those of `rules` (axe rule ids) if given."""
    if not AXE.is_file():
        pytest.fail(f"axe-core is missing ({AXE}): run `npm ci` (make test-browser does)",
                    pytrace=False)
    page.add_script_tag(path=str(AXE))
    return page.evaluate(_RUN_AXE, rules)


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_page_is_accessible(entry, mode, browser, base_url, site, shots):
    assert (site / f"{entry}.html").is_file(), f"{entry} was not built"
    page = open_in_mode(browser, base_url + entry + ".html", base_url, mode)
    try:
        theme = page.evaluate("() => document.documentElement.dataset.theme")
        assert theme == mode, f"the page did not switch to {mode} mode (data-theme={theme!r})"
        if mode == "dark":
            shot = shots / f"{entry}-dark.png"
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot))
        found = axe_violations(page, COLOUR_RULES if mode == "dark" else None)
    finally:
        page.close()
    (shots / f"{entry}-axe-{mode}.json").parent.mkdir(parents=True, exist_ok=True)
    (shots / f"{entry}-axe-{mode}.json").write_text(json.dumps(found, indent=1))
    bad = [v for v in found if v["impact"] in FAIL_ON]
    assert not bad, f"{entry}.html in {mode} mode, axe-core:\n  " + "\n  ".join(
        f"{v['impact']} {v['id']} ({v['count']}x): {v['help']}; e.g. {v['nodes']}" for v in bad)


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
            found = {v["id"]: v["impact"] for v in axe_violations(page)}
            colour = {v["id"] for v in page.evaluate(_RUN_AXE, COLOUR_RULES)}   # dark mode's
        finally:
            page.close()
    assert found.get("image-alt") == "critical", found
    assert found.get("color-contrast") == "serious", found
    assert colour == {"color-contrast"}, f"the colour rules alone found {colour}"
