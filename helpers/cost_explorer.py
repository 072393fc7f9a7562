"""Part I: the cost explorer that also works on the static page, without a kernel.

`widgets.interactive(explore, ...)` recomputes `split_costs` in a running kernel; a page of the
book has no kernel, so its sliders would move and nothing would follow. `with_static_twin` shows
the same explorer as HTML beside the widget's own output, in one display: a live notebook shows
the widget, the book (which prefers text/html, _config.yml) and other kernel-less viewers the
twin. The twin looks up the bytes, messages and memory of `split_costs` in a grid over the
explorer's discrete controls (model, k, batch size, optimizer), computed here, and works out the
seconds in JavaScript from the two continuous ones, as split_costs does:
messages * latency + bytes / bandwidth. Without JavaScript it shows the default setting's table
and no controls.
"""
import hashlib
import html
import json
import math

from .costs import split_costs

__all__ = ["cost_grid", "with_static_twin"]

PARTS = ("sent", "messages", "params", "grads", "optim", "acts")
DISCRETE = ("model", "k", "batch_size", "optimizer")
CONTINUOUS = ("bandwidth_gbs", "latency_us")


def cost_grid(sizes, ks, batch_sizes, optimizers, zero=True):
    """split_costs at every (model, k, batch size, optimizer): {"axes": the values of each,
    "splits": the rows, "parts": PARTS, "values": {model: a flat list}}. The entry of split s,
    part p at indices (ki, bi, oi) is at ((ki * B + bi) * O + oi) * S * P + s * P + p. Bytes are
    rounded to whole bytes: the page shows MB."""
    axes = dict(model=list(sizes), k=[int(k) for k in ks],
                batch_size=[int(b) for b in batch_sizes], optimizer=list(optimizers))
    splits, values = None, {}
    for model, model_sizes in sizes.items():
        flat = []
        for k in axes["k"]:
            for n in axes["batch_size"]:
                for opt in axes["optimizer"]:
                    c = split_costs(model_sizes, k, n, 1.0, optimizer=opt, zero=zero)
                    splits = splits or list(c)
                    flat += [round(c[s][p]) for s in splits for p in PARTS]
        values[model] = flat
    return dict(axes=axes, splits=splits, parts=list(PARTS), values=values)


def _controls(explorer):
    """{name: ipywidgets control} of a widgets.interactive, checked to be the explorer's."""
    controls = {getattr(w, "_kwarg", None) or w.description: w
                for w in explorer.kwargs_widgets}
    want = set(DISCRETE + CONTINUOUS)
    if set(controls) != want:
        raise ValueError(f"the explorer's controls are {sorted(controls)}; the static twin "
                         f"knows {sorted(want)} (the arguments of split_costs it looks up)")
    return controls


def _axis_values(w):
    if hasattr(w, "options"):          # Dropdown, SelectionSlider, list abbreviations
        return list(w.options)
    return list(range(w.min, w.max + 1, w.step))     # IntSlider


LABELS = dict(model="model", k="devices k", batch_size="batch size",
              optimizer="optimizer", bandwidth_gbs="bandwidth (GB/s)", latency_us="latency (µs)")


def _control_html(name, spec, uid):
    label = f'<label for="{uid}-{name}">{LABELS[name]}</label>'
    if spec["kind"] == "select":
        opts = "".join(f'<option{" selected" if v == spec["value"] else ""}>'
                       f"{html.escape(str(v))}</option>" for v in spec["values"])
        return f'{label}<select id="{uid}-{name}" data-param="{name}">{opts}</select>'
    if spec["kind"] == "index":          # a slider over the listed values
        lo, hi, step, val = 0, len(spec["values"]) - 1, 1, spec["values"].index(spec["value"])
    else:    # a log slider: the input holds the exponent (data-value the exact start value,
        # which the slider's steps may not hit, until the reader moves it)
        lo, hi, step, val = spec["min"], spec["max"], spec["step"], spec["exponent"]
    return (f'{label}<input type="range" id="{uid}-{name}" data-param="{name}" min="{lo}" '
            f'max="{hi}" step="{step}" value="{val}" data-value="{spec["value"]}">'
            f'<output for="{uid}-{name}"></output>')


def _cost_explorer_html(grid, specs, title=""):
    """The twin: controls (hidden until its script runs), a table of the current setting, the
    grid as JSON. `specs`: {name: {"kind": "select"|"index"|"log", "value", "values" or
    "base"/"min"/"max"/"step"/"exponent"}}."""
    data = json.dumps(dict(grid, specs=specs), separators=(",", ":")).replace("</", "<\\/")
    # ids for the labels, the same on every run of the same explorer (stored outputs stay put)
    uid = "ce-" + hashlib.sha1((data + title).encode()).hexdigest()[:8]
    default = {n: s["value"] for n, s in specs.items()}
    rows = _rows(grid, default)
    body = "".join(f"<tr><th scope=\"row\">{html.escape(r[0])}</th>"
                   + "".join(f"<td>{v}</td>" for v in r[1:]) + "</tr>" for r in rows)
    controls = "".join(f"<div>{_control_html(n, specs[n], uid)}</div>" for n in specs)
    return (f'<div class="cost-explorer" id="{uid}"><style>{_CSS}</style>'
            f'<p class="ce-title">{html.escape(title)}</p>'
            f'<div class="ce-controls" hidden>{controls}</div>'
            '<table class="ce-table"><caption>per training step, for each split: what the '
            'busiest device sends, the memory of the fullest device (parameters, gradients, '
            'optimizer state, activations), its messages and the seconds of sending</caption>'
            '<thead><tr><th scope="col">split</th><th scope="col">MB sent</th>'
            '<th scope="col">MB of memory</th><th scope="col">messages</th>'
            '<th scope="col">ms of sending</th></tr></thead>'
            f"<tbody>{body}</tbody></table>"
            f'<script type="application/json">{data}</script>'
            f"<script>{_JS}</script></div>")


def _rows(grid, setting):
    """The table rows at `setting` (Python's formatting; the script formats the same way)."""
    ax, S, P = grid["axes"], len(grid["splits"]), len(grid["parts"])
    i = ((ax["k"].index(setting["k"]) * len(ax["batch_size"])
          + ax["batch_size"].index(setting["batch_size"])) * len(ax["optimizer"])
         + ax["optimizer"].index(setting["optimizer"])) * S * P
    flat = grid["values"][setting["model"]]
    rows = []
    for s, split in enumerate(grid["splits"]):
        d = dict(zip(grid["parts"], flat[i + s * P:i + (s + 1) * P], strict=True))
        secs = (d["messages"] * setting["latency_us"] * 1e-6
                + d["sent"] / (setting["bandwidth_gbs"] * 1e9))
        memory = d["params"] + d["grads"] + d["optim"] + d["acts"]
        rows.append((split, f"{d['sent'] / 1e6:.2f}", f"{memory / 1e6:.1f}",
                     str(d["messages"]), f"{1e3 * secs:.2f}"))
    return rows


def static_specs(explorer):
    """The twin's controls from the widget's: the same values, ranges and current setting."""
    specs = {}
    for name, w in _controls(explorer).items():
        if name in CONTINUOUS:
            specs[name] = dict(kind="log", value=float(w.value), base=w.base, min=w.min,
                               max=w.max, step=w.step, exponent=math.log(w.value, w.base))
        else:
            kind = "index" if type(w).__name__.endswith("Slider") else "select"
            specs[name] = dict(kind=kind, value=w.value, values=_axis_values(w))
    return {n: specs[n] for n in DISCRETE + CONTINUOUS}


class WithTwin:
    """A widget shown with a static twin: the widget's own output, with `html_text` as its
    text/html (a live notebook shows the widget, the book, which has no kernel, the twin).
    Part I's cost explorer and Part VII's planner both display through it."""

    def __init__(self, widget, html_text):
        self.widget, self.html = widget, html_text

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle = dict(bundle[0] if isinstance(bundle, tuple) else bundle)
        bundle["text/html"] = self.html
        return bundle


def with_static_twin(explorer, sizes):
    """`explorer` (widgets.interactive over split_costs' arguments: model, k, batch_size,
    optimizer, bandwidth_gbs, latency_us) displayed with its static twin as the text/html of the
    same output. `sizes`: {model name: layer_sizes(...)}, the explorer's models."""
    specs = static_specs(explorer)
    if specs["model"]["values"] != list(sizes):
        raise ValueError(f"the explorer's models {specs['model']['values']} are not the sizes' "
                         f"{list(sizes)}")
    grid = cost_grid(sizes, specs["k"]["values"], specs["batch_size"]["values"],
                     specs["optimizer"]["values"])
    return WithTwin(explorer, _cost_explorer_html(grid, specs, title=(
        "Move the controls: this page looks up the numbers split_costs computed when the "
        "notebook ran, and works out the seconds from the bandwidth and latency.")))


# Colours are inherited: the book puts HTML outputs on a light card in dark mode too (myst-nb)
_CSS = """
.cost-explorer .ce-controls { display: grid; grid-template-columns: repeat(auto-fill,
  minmax(16rem, 1fr)); gap: .3rem 1.2rem; margin: .5rem 0; }
.cost-explorer .ce-controls div { display: flex; align-items: center; gap: .5rem; }
.cost-explorer label { min-width: 8.5rem; }
.cost-explorer input[type=range] { flex: 1; min-width: 5rem; }
.cost-explorer output, .cost-explorer .ce-controls span { min-width: 3.5rem;
  font-variant-numeric: tabular-nums; }
.cost-explorer table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
.cost-explorer caption { caption-side: bottom; text-align: left; font-size: .85em;
  color: inherit; }
.cost-explorer th, .cost-explorer td { padding: .15rem .6rem; text-align: right; }
.cost-explorer th[scope=row] { text-align: left; }
"""

# Reads the grid, shows the controls, and on every input recomputes the table as _rows does.
_JS = r"""
(function () {
  const root = document.currentScript.closest('.cost-explorer');
  const g = JSON.parse(root.querySelector('script[type="application/json"]').textContent);
  const S = g.splits.length, P = g.parts.length, ax = g.axes;
  const fix = (x, d) => x.toFixed(d);
  function setting() {
    const s = {};
    for (const el of root.querySelectorAll('[data-param]')) {
      const name = el.dataset.param, spec = g.specs[name];
      if (spec.kind === 'select') s[name] = spec.values[el.selectedIndex];
      else if (spec.kind === 'index') s[name] = spec.values[Number(el.value)];
      else if (el.dataset.value !== undefined) s[name] = Number(el.dataset.value);
      else s[name] = Math.pow(spec.base, Number(el.value));
      const shown = String(spec.kind === 'log' ? Number(s[name].toPrecision(3)) : s[name]);
      if (el.type === 'range') {
        el.nextElementSibling.textContent = shown;
        el.setAttribute('aria-valuetext', shown);
      }
    }
    return s;
  }
  function update() {
    const s = setting();
    const i = ((ax.k.indexOf(s.k) * ax.batch_size.length + ax.batch_size.indexOf(s.batch_size))
               * ax.optimizer.length + ax.optimizer.indexOf(s.optimizer)) * S * P;
    const flat = g.values[s.model];
    const rows = root.querySelectorAll('tbody tr');
    g.splits.forEach((split, j) => {
      const d = {};
      g.parts.forEach((p, q) => { d[p] = flat[i + j * P + q]; });
      const secs = d.messages * s.latency_us * 1e-6 + d.sent / (s.bandwidth_gbs * 1e9);
      const mem = d.params + d.grads + d.optim + d.acts;
      const cells = rows[j].querySelectorAll('td');
      [fix(d.sent / 1e6, 2), fix(mem / 1e6, 1), String(d.messages), fix(1e3 * secs, 2)]
        .forEach((v, c) => { cells[c].textContent = v; });
    });
  }
  root.querySelectorAll('[data-param]').forEach(el => el.addEventListener('input', () => {
    delete el.dataset.value;   // moved: its position is the value now
    update();
  }));
  root.querySelector('.ce-controls').hidden = false;
  update();
})();
"""
