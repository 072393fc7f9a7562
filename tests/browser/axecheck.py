"""axe-core in the loaded page: its violations, and the ones that fail a page.

axe-core (pinned in package.json, installed by `npm ci` from package-lock.json into node_modules/;
`make test-browser` does it) runs in headless Chromium on a page after it rendered. A violation of
impact "serious" or "critical" fails the page (the same rule pydata-sphinx-theme tests itself
with). Light mode runs every rule (test_pages.py, on the page it checks anyway); dark mode changes
colours only, so there axe runs its colour rules (test_accessibility.py).
"""
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
FAIL_ON = ("serious", "critical")
# the rules whose outcome depends on the colour scheme (axe-core 4: contrast, and links told
# from the text around them by colour alone)
COLOUR_RULES = ["color-contrast", "link-in-text-block"]

RUN_AXE = """async (rules) => {
  const options = {resultTypes: ['violations']};
  if (rules) options.runOnly = {type: 'rule', values: rules};
  const r = await axe.run(document, options);
  return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 3).map(n => n.target.join(' ') + ': ' +
                                   (n.failureSummary || '').split('\\n').slice(1, 2).join(''))
                                   .map(s => s.slice(0, 240)),
    count: v.nodes.length}));
}"""


def axe_violations(page, rules=None):
    """axe-core's violations on the loaded page, [{id, impact, help, nodes, count}]; only
    those of `rules` (axe rule ids) if given."""
    if not AXE.is_file():
        pytest.fail(f"axe-core is missing ({AXE}): run `npm ci` (make test-browser does)",
                    pytrace=False)
    page.add_script_tag(path=str(AXE))
    return page.evaluate(RUN_AXE, rules)


def axe_failures(entry, mode, found, shots):
    """Writes `found` (axe_violations' list) to artifacts/screenshots/<entry>-axe-<mode>.json;
    one line per violation that fails the page."""
    report = shots / f"{entry}-axe-{mode}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(found, indent=1))
    return [f"axe-core in {mode} mode: {v['impact']} {v['id']} ({v['count']}x): {v['help']}; "
            f"e.g. {v['nodes']}" for v in found if v["impact"] in FAIL_ON]
