"""axe-core in the loaded page: its violations, and the ones that fail a page.

axe-core (pinned in package.json, installed by `npm ci` from package-lock.json into node_modules/;
`make test-browser` does it) runs in headless Chromium on a page after it rendered. A violation of
impact "serious" or "critical" fails the page (the same rule pydata-sphinx-theme tests itself
with). Light mode runs every rule; dark mode changes colours only, so there axe runs its colour
rules. Both on the page test_pages.py's test_page loads anyway: dark mode by the theme's own
switch (dark_mode_failures), not a second load of the page.
"""
import json
import pathlib

import pytest
from pagecheck import FRAMES, settle

ROOT = pathlib.Path(__file__).resolve().parents[2]
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
FAIL_ON = ("serious", "critical")
# the rules whose outcome depends on the colour scheme (axe-core 4: contrast, and links told
# from the text around them by colour alone)
COLOUR_RULES = ["color-contrast", "link-in-text-block"]

# Highlighted code is most of a long chapter's text nodes (thousands of one-token spans) but a
# handful of styles: axe's colour rules read each span's colours, about 3 s of CPU per chapter
# and mode. While they run, a span whose colour, background behind it, size, weight, opacity and
# shadow repeat an earlier span's (all a contrast verdict reads) is hidden, so that each distinct
# style of code is judged once on every page and in both modes; other rules see every node.
REPEATS = """() => {
  const seen = new Set(), repeats = [];
  for (const el of document.querySelectorAll('.highlight pre > span')) {
    if (el.childElementCount) continue;
    const s = getComputedStyle(el);
    let behind = '', up = el;
    while (up && up.nodeType === 1) {
      const u = getComputedStyle(up);
      if (u.backgroundImage !== 'none' || !/^(transparent|rgba\\(.*, 0\\))$/.test(
          u.backgroundColor)) { behind = u.backgroundColor + u.backgroundImage; break; }
      up = up.parentElement;
    }
    const key = [s.color, behind, s.fontSize, s.fontWeight, s.opacity, s.textShadow].join('|');
    if (seen.has(key)) repeats.push(el); else seen.add(key);
  }
  return repeats;
}"""
RUN_AXE = """async ([rules, skip]) => {
  const options = {resultTypes: ['violations']};
  if (rules) options.runOnly = {type: 'rule', values: rules};
  if (skip) options.rules = Object.fromEntries(skip.map(id => [id, {enabled: false}]));
  const repeats = rules ? (REPEATS)() : [];
  const hide = document.createElement('style');
  hide.textContent = '[data-axe-repeat] { visibility: hidden !important; }';
  for (const el of repeats) el.setAttribute('data-axe-repeat', '');
  document.head.append(hide);
  let r;
  try { r = await axe.run(document, options); }
  finally { hide.remove(); for (const el of repeats) el.removeAttribute('data-axe-repeat'); }
  return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 3).map(n => n.target.join(' ') + ': ' +
                                   (n.failureSummary || '').split('\\n').slice(1, 2).join(''))
                                   .map(s => s.slice(0, 240)),
    count: v.nodes.length}));
}""".replace("REPEATS", REPEATS)


def axe_violations(page, rules=None):
    """axe-core's violations on the loaded page, [{id, impact, help, nodes, count}]; only
    those of `rules` (axe rule ids) if given. Every rule: the colour rules in a run of their own
    (repeated code styles hidden, above), the others on every node."""
    if not AXE.is_file():
        pytest.fail(f"axe-core is missing ({AXE}): run `npm ci` (make test-browser does)",
                    pytrace=False)
    if not page.evaluate("() => !!window.axe"):
        page.add_script_tag(path=str(AXE))
    def run(args):
        return settle(page, RUN_AXE, args, seconds=AXE_SECONDS, what="axe-core's run")
    if rules is not None:
        return run([rules, None])
    return run([None, COLOUR_RULES]) + run([COLOUR_RULES, None])


# The theme's switch button, clicked until the page has `mode` (pydata-sphinx-theme cycles auto,
# dark, light on a light system): what a reader does, and the theme's code that a page loaded
# with a stored choice runs too (it sets data-theme, the dropdowns' class and localStorage).
SWITCH_THEME = """(mode) => {
  const button = document.querySelector('.theme-switch-button');
  for (let i = 0; button && i < 3 && document.documentElement.dataset.theme !== mode; i++)
    button.click();
  return document.documentElement.dataset.theme;
}"""
# colours change at once (the theme's .15 s colour transitions would have axe read colours
# halfway), and two frames drawn in them
NO_TRANSITIONS = ("() => { const s = document.createElement('style'); s.id = 'axe-no-transitions';"
                  " s.textContent = '*, *::before, *::after { transition: none !important; }';"
                  " document.head.append(s); }")
# the longest chapter's every rule took about 5 s of a busy 2-core machine's CPU
AXE_SECONDS = 120


def dark_mode_failures(page, entry, shots):
    """The loaded light page turned dark by the theme's switch: its first screen to
    artifacts/screenshots/<entry>-dark.png, axe-core's colour rules (a report as axe_failures
    writes it), then light again. One line per failure, as axe_failures."""
    page.evaluate(NO_TRANSITIONS)
    try:
        theme = page.evaluate(SWITCH_THEME, "dark")
        if theme != "dark":
            return [f"the theme's switch did not turn the page dark (data-theme={theme!r})"]
        settle(page, FRAMES, what="two frames drawn in dark mode")
        shot = shots / f"{entry}-dark.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot))
        found = axe_violations(page, COLOUR_RULES)
        back = page.evaluate(SWITCH_THEME, "light")
        settle(page, FRAMES, what="two frames drawn in light mode")
    finally:
        page.evaluate("() => document.getElementById('axe-no-transitions').remove()")
    failures = axe_failures(entry, "dark", found, shots)
    if back != "light":
        failures.append(f"the theme's switch did not turn the page light again ({back!r})")
    return failures


def axe_failures(entry, mode, found, shots):
    """Writes `found` (axe_violations' list) to artifacts/screenshots/<entry>-axe-<mode>.json;
    one line per violation that fails the page."""
    report = shots / f"{entry}-axe-{mode}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(found, indent=1))
    return [f"axe-core in {mode} mode: {v['impact']} {v['id']} ({v['count']}x): {v['help']}; "
            f"e.g. {v['nodes']}" for v in found if v["impact"] in FAIL_ON]
