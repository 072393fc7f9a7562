"""The cost explorer of book/part1/costs works on the static page: its controls move, and the
numbers that follow are split_costs' for the new setting (helpers/cost_explorer.py looks them up
in a grid and works the seconds out from the bandwidth and latency). Without its script the page
shows the default setting's table and no control at all."""
import pytest
from pagecheck import open_page, resize

PAGE = "book/part1/costs.html"
READ_JS = """() => {
  const root = document.querySelector('.cost-explorer');
  return {hidden: root.querySelector('.ce-controls').hidden,
          widgets: document.querySelectorAll('.jupyter-widgets, .widget-subarea').length,
          rows: [...root.querySelectorAll('tbody tr')].map(tr =>
            [tr.querySelector('th').textContent, ...[...tr.querySelectorAll('td')]
              .map(td => td.textContent)])};
}"""


@pytest.fixture(scope="module")
def sizes():
    import helpers
    return {"LeNet": helpers.layer_sizes(helpers.lenet_module(), (1, 28, 28)),
            "ResNet-18": helpers.layer_sizes(helpers.resnet18(), (1, 28, 28))}


def _expected(sizes, model, k, batch, bandwidth, latency, optimizer):
    import helpers
    c = helpers.split_costs(sizes[model], k, batch, bandwidth, optimizer=optimizer,
                            latency_us=latency, zero=True)
    return {s: (d["sent"] / 1e6, d["memory"] / 1e6, d["messages"], 1e3 * d["seconds"])
            for s, d in c.items()}


def _check(rows, want):
    assert [r[0] for r in rows] == list(want)
    for split, sent, memory, messages, ms in rows:
        w = want[split]
        assert abs(float(sent) - w[0]) <= 0.005 and abs(float(memory) - w[1]) <= 0.05, split
        assert int(messages) == w[2] and abs(float(ms) - w[3]) <= 0.005, (split, ms, w[3])


def test_moving_the_controls_recomputes_the_numbers(browser, base_url, sizes):
    seen = open_page(browser, base_url + PAGE, base_url)
    page = seen.page
    try:
        start = page.evaluate(READ_JS)
        assert not start["hidden"], "the explorer's controls stay hidden: its script did not run"
        assert start["widgets"] == 0, "the page shows the widget (dead without a kernel)"
        _check(start["rows"], _expected(sizes, "ResNet-18", 4, 256, 16.0, 10.0, "adam"))
        k = page.locator('.cost-explorer input[data-param="k"]')
        k.focus()
        for _ in range(3):                       # k 4 -> 7, as a reader's keyboard would
            page.keyboard.press("ArrowRight")
        moved = page.evaluate(READ_JS)["rows"]
        assert moved != start["rows"], "the numbers did not change when k moved"
        _check(moved, _expected(sizes, "ResNet-18", 7, 256, 16.0, 10.0, "adam"))
        assert k.get_attribute("aria-valuetext") == "7"
        page.select_option('.cost-explorer select[data-param="model"]', "LeNet")
        page.select_option('.cost-explorer select[data-param="optimizer"]', "sgd")
        batch = page.locator('.cost-explorer input[data-param="batch_size"]')
        batch.focus()
        page.keyboard.press("ArrowLeft")         # 256 -> 128
        bandwidth = page.locator('.cost-explorer input[data-param="bandwidth_gbs"]')
        bandwidth.focus()
        page.keyboard.press("End")               # 10^3 GB/s
        _check(page.evaluate(READ_JS)["rows"],
               _expected(sizes, "LeNet", 7, 128, 1000.0, 10.0, "sgd"))
        problems = seen.console_errors + seen.local_failures
    finally:
        page.close()
    assert not problems, problems


def test_without_its_script_no_control_shows(site):
    """A viewer that runs no script (GitHub, a sanitized notebook) sees the default setting's
    table and no control; the page carries no widget and loads no widget manager."""
    html = (site / PAGE).read_text()
    assert html.count('class="cost-explorer"') == 1
    assert 'class="ce-controls" hidden' in html
    assert html.count('<th scope="row">') == 6, "the default setting's table, one row per split"
    assert "application/vnd.jupyter.widget-view+json" not in html
    assert "/_static/ipywidgets/" not in html, "the widget manager loads for nothing"


_IN_VIEW_JS = """() => {
  const root = document.querySelector('.cost-explorer');
  root.scrollIntoView();
  const hits = [];
  const seen = el => { const r = el.getBoundingClientRect();
    const x = Math.min(r.right - 2, innerWidth - 1), y = r.top + r.height / 2;
    const hit = document.elementFromPoint(x, y);
    const ok = r.width > 0 && r.right <= innerWidth + 0.5 && !!hit && el.contains(hit);
    if (!ok) hits.push({right: Math.round(r.right), y: Math.round(y), width: innerWidth,
                        hit: hit ? hit.tagName + '.' + hit.className : null});
    return ok; };
  const last = [...root.querySelectorAll('tr')].map(tr => tr.lastElementChild);
  // header words laid out over more than one line (a break inside the word)
  const splitWords = cells => [...cells].flatMap(th => {
    const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT), out = [];
    for (let n = walker.nextNode(); n; n = walker.nextNode())
      for (const m of n.textContent.matchAll(/\\S+/g)) {
        const r = document.createRange();
        r.setStart(n, m.index);
        r.setEnd(n, m.index + m[0].length);
        const tops = new Set([...r.getClientRects()].map(b => Math.round(b.top)));
        if (tops.size > 1) out.push(m[0]);
      }
    return out;
  });
  return {columns: last.map(seen), caption: seen(root.querySelector('caption')),
          sideways: document.documentElement.scrollWidth - innerWidth, hits,
          split_words: splitWords(root.querySelectorAll('thead th'))};
}"""


def test_on_a_phone_the_column_the_sliders_change_is_in_view(browser, base_url):
    """At 390 px the last column ("ms of sending", what the bandwidth and latency sliders change)
    and the caption are on screen, not off to the right of a scroll box."""
    seen = open_page(browser, base_url + PAGE, base_url)
    page = seen.page
    try:
        resize(page, 390, 844)
        view = page.evaluate(_IN_VIEW_JS)
    finally:
        page.close()
    assert all(view["columns"]) and len(view["columns"]) >= 2, \
        f"the explorer's last column is off screen at 390 px: {view}"
    assert view["caption"] and view["sideways"] <= 1, view
    assert view["split_words"] == [], \
        f"at 390 px a header word breaks over two lines (once: 'messa-ges'): {view['split_words']}"
