"""Part VII: the planner on a page without a kernel. A notebook's form (ipywidgets) calls
helpers.plan in a running kernel; a page of the book has none, so `with_planner_twin` shows the
form beside a twin: the same fields as HTML inputs and the planner's formulas ported to
JavaScript (PLANNER_JS, the same functions, checked against planner.py by
tests/test_planner_page.py), which plan again on every change. Without JavaScript the twin
shows the plan of the default numbers, computed here by helpers.plan.
"""
import hashlib
import html
import json

from ..cost_explorer import WithTwin
from .planner import plan

__all__ = ["PLANNER_FIELDS", "plan_table_html", "planner_html", "with_planner_twin",
           "PLANNER_JS"]

# name, label, default, step: the form's fields (the widget's and the twin's)
PLANNER_FIELDS = (("layers", "layers", 32, 1), ("width", "width", 4096, 1),
                  ("heads", "heads", 32, 1), ("vocab", "vocabulary", 32000, 1),
                  ("seq", "sequence", 4096, 1), ("batch", "batch (seqs)", 512, 1),
                  ("experts", "experts", 0, 1), ("gpus", "GPUs", 64, 1),
                  ("memory", "GPU GB", 80, 1), ("tflops", "TFLOP/s", 989, 1),
                  ("gbs", "link GB/s", 450, 1), ("latency_us", "latency µs", 10, 1))
NO_FIT = ("No layout fits: try more GPUs (a number whose factors divide the batch, the heads "
          "and the layers), more memory per GPU, or a smaller model.")
COLUMNS = ("dp", "tp", "pp", "cp", "ep", "ZeRO", "accumulate", "recompute", "m", "GB/GPU",
           "step s")


def _cells(r):
    return (r["dp"], r["tp"], r["pp"], r["cp"], r["ep"], r["zero"], r["acc"], r["recompute"],
            r["m"], f"{r['memory'] / 1e9:.2f}", f"{r['seconds']:.2f}")


def plan_table_html(rows, caption="", gpu=None):
    """The plan as an HTML table (it keeps its columns on a phone: the page scrolls it
    sideways), one layout a row; 'no layout fits' when there is none."""
    head = "".join(f'<th scope="col">{c}</th>' for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in _cells(r))
                   + "</tr>" for r in rows)
    if not rows:
        fits = f" in {gpu['memory'] / 1e9:.0f} GB" if gpu else ""
        body = f'<tr><td colspan="{len(COLUMNS)}">no layout fits{fits}</td></tr>'
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (f'<div class="plan-table" style="overflow-x:auto"><table>{cap}<thead><tr>{head}'
            f"</tr></thead><tbody>{body}</tbody></table></div>")


_CSS = """
.planner .pl-form { display: grid; grid-template-columns: repeat(auto-fill, minmax(9.5rem, 1fr));
  gap: .35rem .9rem; margin: .5rem 0; }
.planner .pl-form label { display: flex; flex-direction: column; font-size: .9em; }
.planner .pl-form input, .planner .pl-form select { width: 100%; box-sizing: border-box; }
.planner table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
.planner caption { caption-side: bottom; text-align: left; font-size: .85em; color: inherit; }
.planner th, .planner td { padding: .15rem .5rem; text-align: right; white-space: nowrap; }
.planner .pl-status { font-size: .9em; margin: .3rem 0; }
"""


def planner_html(defaults=None, optimizer="mixed_adam", dtype_bytes=2, top=10, rows=None):
    """The twin: the form's fields (hidden until its script runs), the plan of `defaults`
    (helpers.plan, here; `rows`: that plan, if the caller has it), and PLANNER_JS, which plans
    again in the page on every change."""
    values = {name: default for name, _, default, _ in PLANNER_FIELDS}
    values.update(defaults or {})
    model, gpu, n = _inputs(values)
    if rows is None:
        rows = plan(model, gpu, n, optimizer=optimizer, dtype_bytes=dtype_bytes)
    spec = json.dumps(dict(optimizer=optimizer, dtype_bytes=dtype_bytes, top=top, no_fit=NO_FIT),
                      separators=(",", ":"))
    uid = "pl-" + hashlib.sha1((spec + json.dumps(values, sort_keys=True)).encode()) \
        .hexdigest()[:8]
    fields = "".join(
        f'<label for="{uid}-{name}">{html.escape(label)}<input type="number" id="{uid}-{name}" '
        f'data-field="{name}" value="{values[name]}" min="0" step="{step}"></label>'
        for name, label, _, step in PLANNER_FIELDS)
    status = (f"{len(rows)} layouts fit; the {min(top, len(rows))} fastest:" if rows
              else NO_FIT)
    return (f'<div class="planner" id="{uid}"><style>{_CSS}</style>'
            f'<div class="pl-form" hidden>{fields}</div>'
            f'<p class="pl-status">{html.escape(status)}</p>'
            + plan_table_html(rows[:top], "dp x tp x pp x cp GPUs, ep dividing dp; ZeRO over "
                              "dp x cp; accumulate: reduce every micro-batch or no_sync; m "
                              "micro-batches; memory of the fullest GPU; step time by the "
                              "course's cost model", gpu)
            + f'<script type="application/json">{spec}</script>'
            f"<script>{PLANNER_JS}{_BIND_JS}</script></div>")


def _inputs(v):
    model = {k: int(v[k]) for k in ("layers", "width", "heads", "vocab", "seq", "batch",
                                    "experts")}
    gpu = dict(memory=float(v["memory"]) * 1e9, flops=float(v["tflops"]) * 1e12,
               bandwidth=float(v["gbs"]) * 1e9, latency=float(v["latency_us"]) * 1e-6)
    return model, gpu, int(v["gpus"])


def with_planner_twin(widget, defaults=None, **kw):
    """`widget` (the notebook's form) displayed with its static twin (planner_html) as the
    text/html of the same output: a live notebook shows the widget, the book the twin."""
    return WithTwin(widget, planner_html(defaults, **kw))


# The planner's formulas, as planner.py and transformer_costs.py write them (same names).
PLANNER_JS = r"""
var Planner = (function () {
  const STATE = {sgd: 0, momentum: 4, adam: 8, mixed_adam: 12};
  const STAGES = ['dp', 'zero1', 'zero2', 'zero3'], RECOMPUTE = ['none', 'selective', 'full'];
  const fdiv = (a, b) => Math.floor(a / b);
  function actsPerToken(h, a, s, t, sp, rec, b) {     // flash, no dropout, ln stats
    if (rec === 'full') return h * b / (sp ? t : 1);
    const rep = 4 * h * b + 16, split = 12 * h * b + 4 * a;
    return rep / (sp ? t : 1) + split / t;
  }
  const blockParams = (h, t) => fdiv(12 * h * h + 7 * h, t) + 6 * h;
  const ringAllreduce = (n, k) => 2 * (k - 1) / k * n;
  function ringBytes(tokens, h, cp, tp, b) {
    const block = fdiv(tokens * h, tp) * b;
    return cp === 1 ? 0 : (2 * (cp - 1) + 2 * (cp - 1) + 2 * cp) * block;
  }
  function moeBytes(tokens, h, E, k, cf, ep, b) {
    const cap = Math.ceil(cf * tokens * k / E);
    return 4 * (E - fdiv(E, ep)) * cap * h * b;
  }
  function flopsPerToken(n, L, h, s, rec) {
    const f = 6 * n + 12 * L * h * s;
    return f + ({none: 0, selective: 4 * L * h * s, full: f / 3})[rec];
  }
  function sharding(n, k, stage, opt, b) {
    let params = n * b, grads = n * b, optim = n * STATE[opt];
    const level = STAGES.indexOf(stage);
    if (level >= 1) optim /= k;
    if (level >= 2) grads /= k;
    if (level >= 3) params /= k;
    const sent = (stage === 'zero3' ? 3 : 2) * (k - 1) / k * n * b;
    return {params, grads, optim, sent};
  }
  function dpCosts(n, k, zero, m, acc, opt, b) {
    const z = sharding(n, k, zero, opt, b);
    if (zero === 'dp' || zero === 'zero1' || m === 1) return z;
    const full = n * b, once = (k - 1) / k * n * b;
    if (acc === 'no_sync') { z.grads = full; if (zero === 'zero3') z.params = full; }
    else if (zero === 'zero2') z.sent = (m + 1) * once;
    else z.sent = 3 * m * once;
    return z;
  }
  function stageParams(M, lay, r) {
    const h = M.width, E = M.experts || 0, blocks = fdiv(M.layers, lay.pp);
    let dense = blocks * blockParams(h, lay.tp), expert = 0;
    if (E) {
      const mlp = fdiv(8 * h * h + 4 * h, lay.tp) + h;
      dense += blocks * (h * E + E - mlp);
      expert = blocks * fdiv(E, lay.ep) * mlp;
    }
    if (r === 0) dense += (M.vocab + M.seq) * h;
    if (r === lay.pp - 1) dense += 2 * h + h * M.vocab;
    return [dense, expert];
  }
  function activeParams(M) {
    const h = M.width, E = M.experts || 0, k = M.k || 2;
    const per = blockParams(h, 1) + (E ? (k - 1) * (8 * h * h + 5 * h) + h * E + E : 0);
    return M.layers * per + (M.vocab + M.seq) * h + 2 * h + h * M.vocab;
  }
  function stageCosts(M, lay, opt, b) {
    const h = M.width, a = M.heads, s = M.seq, V = M.vocab;
    const {dp, tp, pp, cp, m, ep, sp} = lay, rec = lay.recompute;
    const E = M.experts || 0, k = M.k || 2, cf = M.capacity_factor || 1.25;
    const rows = M.batch / (dp * m), tokens = rows * s / cp, blocks = fdiv(M.layers, pp);
    let per = actsPerToken(h, a, s, tp, sp, rec, b);
    if (E && rec !== 'full') per += (k * cf - 1) * 8 * h * b / tp;
    const full = actsPerToken(h, a, s, tp, sp, 'none', b), again = rec !== 'none';
    const out = [];
    for (let r = 0; r < pp; r++) {
      const [dense, expert] = stageParams(M, lay, r);
      const z = dpCosts(dense, dp * cp, lay.zero, m, lay.acc, opt, b);
      if (expert) {
        const e = dpCosts(expert, fdiv(dp * cp, ep), lay.zero, m, lay.acc, opt, b);
        for (const key of ['params', 'grads', 'optim', 'sent']) z[key] += e[key];
      }
      const live = Math.min(pp - r, m);
      let perMb = blocks * tokens * per;
      if (r === 0) perMb += tokens * 8 + s / cp * 8;
      if (r === pp - 1) perMb += tokens * (2 * h * b + 4 * V + 8 + 8);
      const acts = live * perMb + (rec === 'full' ? tokens * full : 0);
      const act = tokens * h * b, tpCalls = (rec === 'full' ? 6 : 4) * blocks * m;
      const ringFwd = 2 * (cp - 1) * fdiv(tokens * h, tp) * b;
      const ppMsgs = m * ((r < pp - 1 ? 1 : 0) + (r > 0 ? 1 : 0));
      const bytes = {tp: tpCalls * ringAllreduce(act, tp), pp: ppMsgs * act, dp: z.sent,
                     cp: blocks * m * (ringBytes(tokens, h, cp, tp, b) + (again ? ringFwd : 0)),
                     ep: E && ep > 1 ? blocks * m * moeBytes(tokens, fdiv(h, tp), E, k, cf, ep, b)
                                     : 0};
      const messages = {tp: tpCalls * 2 * (tp - 1), pp: ppMsgs,
                        ep: E ? 4 * blocks * m * (ep - 1) : 0};
      out.push({memory: z.params + z.grads + z.optim + acts, bytes, messages, tokens});
    }
    return out;
  }
  function ringExposed(tokens, M, lay, rate, link, latency, b) {
    const {cp, tp} = lay;
    if (cp === 1) return 0;
    const kv = 2 * tokens * M.width / tp * b, own = 4 * M.width * M.seq * tokens / (tp * cp) / rate;
    const hop = latency + kv / link;   // the first hop hides behind the own block, later ones half
    const fwd = Math.max(0, hop - own) + (cp - 2) * Math.max(0, hop - own / 2);
    const bwd = Math.max(0, 2 * hop - 2 * own) + (cp - 2) * Math.max(0, 2 * hop - own) + hop;
    return fwd * (lay.recompute !== 'none' ? 2 : 1) + bwd;
  }
  function layoutCosts(M, G, lay, opt, b, mfu) {
    const st = stageCosts(M, lay, opt, b);
    const {dp, tp, pp, cp, m} = lay, rate = mfu * G.flops;
    const flops = flopsPerToken(activeParams(M), M.layers, M.width, M.seq, lay.recompute);
    const compute = flops * M.batch * M.seq / (dp * tp * pp * cp) / rate;
    const link = G.bandwidth, lat = G.latency;
    let exposed = -Infinity, bytes = -Infinity, memory = -Infinity;
    const once = lay.zero === 'dp' || lay.zero === 'zero1' || lay.acc === 'no_sync';
    const win = compute * 2 / 3 / (once ? m : 1);   // no_sync: the last micro-batch's backward
    for (const s of st) {
      let t = 0;
      for (const d of ['tp', 'pp', 'ep']) t += s.bytes[d] / link + s.messages[d] * lat;
      t += Math.max(0, s.bytes.dp / link - win);
      t += fdiv(M.layers, pp) * m * ringExposed(s.tokens, M, lay, rate, link, lat, b);
      exposed = Math.max(exposed, t);
      bytes = Math.max(bytes, s.bytes.tp + s.bytes.pp + s.bytes.dp + s.bytes.cp + s.bytes.ep);
      memory = Math.max(memory, s.memory);
    }
    return Object.assign({}, lay, {memory, bytes, seconds: compute * (m + pp - 1) / m + exposed,
                                   fits: memory <= G.memory});
  }
  const divisors = n => { const d = []; for (let i = 1; i <= n; i++) if (n % i === 0) d.push(i);
                          return d; };
  function candidates(M, n) {
    const E = M.experts || 0, out = [];
    for (const tp of divisors(n)) for (const pp of divisors(n)) for (const cp of divisors(n)) {
      if (n % (tp * pp * cp)) continue;
      const dp = n / (tp * pp * cp);
      if (M.heads % tp || M.width % tp || M.layers % pp || (cp > 1 && M.seq % (2 * cp))
          || M.batch % dp) continue;
      const per = M.batch / dp, ms = [1, 2, 4, 8, 16].filter(m => per % m === 0);
      let eps = divisors(dp).filter(e => E && E % e === 0);
      if (!eps.length) eps = [1];
      const zeros = dp * cp > 1 ? STAGES : ['dp'];
      for (const ep of eps) for (const m of ms) for (const zero of zeros)
        for (const recompute of RECOMPUTE) {
          const accs = (zero === 'dp' || zero === 'zero1') ? ['no_sync']
                     : (m > 1 ? ['every', 'no_sync'] : ['every']);
          for (const acc of accs)
            out.push({dp, tp, pp, cp, ep, zero, acc, recompute, m, sp: tp > 1});
        }
    }
    return out;
  }
  function check(M, G, n) {
    for (const key of ['layers', 'width', 'heads', 'vocab', 'seq', 'batch'])
      if (!(M[key] > 0) || !Number.isInteger(M[key]))
        return `the model's ${key} must be a whole number > 0`;
    if (!(M.experts >= 0)) return "the model's experts must be >= 0";
    for (const key of ['memory', 'flops', 'bandwidth'])
      if (!(G[key] > 0)) return `the gpu's ${key} must be > 0`;
    if (!(G.latency >= 0)) return "the gpu's latency must be >= 0";
    if (!(n >= 1) || !Number.isInteger(n)) return `n_gpus must be a whole number >= 1, not ${n}`;
    return null;
  }
  function plan(M, G, n, opt, b, mfu) {
    const bad = check(M, G, n);
    if (bad) throw new Error(bad);
    const rows = candidates(M, n).map(lay => layoutCosts(M, G, lay, opt, b, mfu || 0.4))
      .filter(r => r.fits);
    rows.sort((x, y) => x.seconds - y.seconds || x.bytes - y.bytes || x.memory - y.memory);
    return rows;
  }
  return {plan, layoutCosts, candidates};
})();
"""

# Binds the twin's form to Planner.plan, and shows what it returns (as _cells formats it).
_BIND_JS = r"""
(function () {
  const root = document.currentScript.closest('.planner');
  const spec = JSON.parse(root.querySelector('script[type="application/json"]').textContent);
  const num = name => Number(root.querySelector(`[data-field="${name}"]`).value);
  function update() {
    const M = {layers: num('layers'), width: num('width'), heads: num('heads'),
               vocab: num('vocab'), seq: num('seq'), batch: num('batch'),
               experts: num('experts')};
    const G = {memory: num('memory') * 1e9, flops: num('tflops') * 1e12,
               bandwidth: num('gbs') * 1e9, latency: num('latency_us') * 1e-6};
    const status = root.querySelector('.pl-status'), body = root.querySelector('tbody');
    let rows;
    try { rows = Planner.plan(M, G, num('gpus'), spec.optimizer, spec.dtype_bytes); }
    catch (e) { status.textContent = 'cannot plan: ' + e.message; body.innerHTML = ''; return; }
    const top = rows.slice(0, spec.top);
    status.textContent = top.length ? `${rows.length} layouts fit; the ${top.length} fastest:`
                                    : (spec.no_fit || 'No layout fits.');
    body.innerHTML = '';
    if (!top.length) {
      body.innerHTML = `<tr><td colspan="11">no layout fits in ${Math.round(G.memory / 1e9)}` +
                       ' GB</td></tr>';
      return;
    }
    for (const r of top) {
      const tr = document.createElement('tr');
      for (const v of [r.dp, r.tp, r.pp, r.cp, r.ep, r.zero, r.acc, r.recompute, r.m,
                       (r.memory / 1e9).toFixed(2), r.seconds.toFixed(2)]) {
        const td = document.createElement('td');
        td.textContent = String(v);
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
  }
  root.querySelectorAll('[data-field]').forEach(el => el.addEventListener('change', update));
  root.querySelector('.pl-form').hidden = false;
  update();
})();
"""
