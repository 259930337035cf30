// The dashboard page and its data (dashboard.h).
#include "serve/dashboard.h"

#include "moesh/serve/ledger.h"

namespace moesh::serve {

nlohmann::json dashboard_json(const SchedulerStats& sched, const RemoteExecutor* remote, double time_s) {
  nlohmann::json j;
  j["status"] = swarm_status_json(remote);
  j["time_s"] = time_s;
  j["generated_tokens"] = sched.generated_tokens;
  j["requests_finished"] = sched.requests_finished;
  j["requests_failed"] = sched.requests_failed;
  j["layer_calls"] = 0;
  j["token_layers"] = 0;
  nlohmann::json layers = nlohmann::json::array();
  int64_t n_expert = 0;
  if (remote != nullptr) {
    const RemoteExecutor::Activations a = remote->activation_snapshot();
    j["layer_calls"] = a.layer_calls;
    j["token_layers"] = a.token_layers;
    n_expert = a.n_expert;
    for (size_t l = 0; l < a.tokens.size(); ++l) {
      if (a.tokens[l] == 0) continue;  // dense layers, or none routed yet
      nlohmann::json share = nlohmann::json::array();
      for (int64_t e = 0; e < n_expert; ++e) {
        share.push_back(static_cast<double>(a.pairs[l * static_cast<size_t>(n_expert) + static_cast<size_t>(e)]) /
                        static_cast<double>(a.tokens[l]));
      }
      layers.push_back({{"layer", l}, {"tokens", a.tokens[l]}, {"share", std::move(share)}});
    }
  }
  j["heatmap"] = {{"n_expert", n_expert}, {"layers", std::move(layers)}};
  return j;
}

const char* dashboard_html() {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>moesh swarm</title>
<style>
 body{font:14px system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}
 h1{font-size:20px;margin:0 0 8px} h2{font-size:15px;margin:14px 0 6px}
 .row{display:flex;gap:16px;flex-wrap:wrap} .card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px}
 table{border-collapse:collapse} td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee} th{background:#f3f3f3}
 td.l,th.l{text-align:left} .up{color:#1a7f37} .down{color:#c62828} .evicted{color:#6a1b9a}
 #heat td{padding:0;width:14px;height:14px;border:1px solid #fff}
 .kpi{font-size:22px;font-weight:600}
</style></head><body>
<h1>moesh swarm — backbone <span id="backbone">?</span></h1>
<div class="row">
 <div class="card"><div>tokens/s</div><div class="kpi" id="tps">–</div></div>
 <div class="card"><div>trips per token</div><div class="kpi" id="tpt">–</div></div>
 <div class="card"><div>generated tokens</div><div class="kpi" id="generated">0</div></div>
 <div class="card"><div>workers up</div><div class="kpi" id="nup">0</div></div>
 <div class="card"><div>updates</div><div class="kpi" id="updates">0</div></div>
</div>
<div class="row">
 <div class="card"><h2>Workers by RTT (solid: direct, dashed: relayed, dotted: joined)</h2><svg id="map" width="420" height="320"></svg></div>
 <div class="card"><h2>tokens/s and trips per token over time</h2><svg id="chart" width="460" height="320"></svg></div>
</div>
<div class="card"><h2>Workers</h2><table id="workers"><thead><tr><th>#</th><th class="l">name</th><th class="l">path</th>
<th class="l">state</th><th>experts</th><th>rtt ms</th><th>min ms</th><th>heard s</th><th>requests</th><th>errors</th><th>rejoins</th><th>threads</th><th>replicas MiB</th></tr></thead><tbody></tbody></table></div>
<div class="card"><h2>Expert activations (share of each layer's tokens)</h2><table id="heat"></table></div>
<script>
const hist = []; let updates = 0;
const el = id => document.getElementById(id);
const svgNS = 'http://www.w3.org/2000/svg';
function node(tag, attrs, text) {
  const n = document.createElementNS(svgNS, tag);
  for (const k in attrs) n.setAttribute(k, attrs[k]);
  if (text !== undefined) n.textContent = text;
  return n;
}
function drawMap(workers) {
  const svg = el('map'); svg.innerHTML = '';
  const cx = 210, cy = 160, rmax = 140;
  const rtts = workers.map(w => Math.max(w.min_latency_ms || w.warmup_rtt_ms || 0.01, 0.01));
  const lo = Math.log10(Math.min(...rtts, 0.1)), hi = Math.log10(Math.max(...rtts, 100));
  workers.forEach((w, i) => {
    const a = 2 * Math.PI * i / Math.max(workers.length, 1) - Math.PI / 2;
    const r = 30 + (rmax - 30) * (Math.log10(rtts[i]) - lo) / Math.max(hi - lo, 1e-9);
    const x = cx + r * Math.cos(a), y = cy + r * Math.sin(a);
    const dash = w.path === 'relay' ? '6,4' : w.path === 'joined' ? '2,3' : '';
    const color = w.state === 'up' ? '#1a7f37' : w.state === 'down' ? '#c62828' : '#6a1b9a';
    svg.appendChild(node('line', {x1: cx, y1: cy, x2: x, y2: y, stroke: color, 'stroke-width': 2, 'stroke-dasharray': dash}));
    svg.appendChild(node('circle', {cx: x, cy: y, r: 9, fill: color, 'data-worker': w.name}));
    svg.appendChild(node('text', {x: x + 12, y: y + 4, 'font-size': 12}, w.name + ' ' + rtts[i].toFixed(2) + ' ms'));
  });
  svg.appendChild(node('circle', {cx, cy, r: 14, fill: '#1565c0'}));
  svg.appendChild(node('text', {x: cx - 30, y: cy + 30, 'font-size': 12}, 'backbone'));
}
function drawChart() {
  const svg = el('chart'); svg.innerHTML = '';
  const W = 460, H = 320, pad = 30, pts = hist.slice(-120);
  if (pts.length < 2) return;
  const series = [['tps', '#1565c0'], ['tpt', '#ef6c00']];
  for (const [key, color] of series) {
    const max = Math.max(...pts.map(p => p[key]), 1e-9);
    const d = pts.map((p, i) => (i ? 'L' : 'M') + (pad + (W - 2 * pad) * i / (pts.length - 1)).toFixed(1) + ',' +
                                 (H - pad - (H - 2 * pad) * p[key] / max).toFixed(1)).join(' ');
    svg.appendChild(node('path', {d, fill: 'none', stroke: color, 'stroke-width': 2}));
    svg.appendChild(node('text', {x: pad, y: key === 'tps' ? 16 : 30, fill: color, 'font-size': 12},
                         key === 'tps' ? 'tokens/s (max ' + max.toFixed(1) + ')' : 'trips/token (max ' + max.toFixed(1) + ')'));
  }
}
function drawWorkers(workers) {
  const tb = el('workers').tBodies[0]; tb.innerHTML = '';
  for (const w of workers) {
    const tr = document.createElement('tr'); tr.className = 'worker'; tr.dataset.name = w.name;
    const cells = [w.index, w.name, w.path, w.state, w.n_experts, w.warmup_rtt_ms.toFixed(3), w.min_latency_ms.toFixed(3),
                   w.last_heard_s < 0 ? '–' : w.last_heard_s.toFixed(1), w.requests, w.errors, w.rejoins,
                   w.threads || '–', w.replica_budget_bytes ? (w.replica_bytes / 1048576).toFixed(1) + ' / ' +
                   (w.replica_budget_bytes / 1048576).toFixed(1) : '–'];
    cells.forEach((c, i) => { const td = document.createElement('td'); td.textContent = c;
      if (i >= 1 && i <= 3) td.className = 'l'; if (i === 3) td.classList.add(w.state); tr.appendChild(td); });
    tb.appendChild(tr);
  }
}
function drawHeat(h) {
  const t = el('heat'); t.innerHTML = '';
  for (const L of h.layers) {
    const tr = document.createElement('tr');
    const th = document.createElement('th'); th.textContent = 'L' + L.layer; tr.appendChild(th);
    const max = Math.max(...L.share, 1e-9);
    L.share.forEach((s, e) => { const td = document.createElement('td');
      td.style.background = 'rgba(198,40,40,' + (s / max).toFixed(3) + ')'; td.title = 'layer ' + L.layer + ' expert ' + e + ': ' + (100 * s).toFixed(1) + '%';
      tr.appendChild(td); });
    t.appendChild(tr);
  }
}
async function update() {
  try {
    const r = await fetch('/swarm/dashboard.json', {cache: 'no-store'});
    const j = await r.json();
    const last = hist[hist.length - 1];
    const p = {t: j.time_s, gen: j.generated_tokens, calls: j.layer_calls, tps: 0, tpt: 0};
    if (last && p.t > last.t) {
      p.tps = (p.gen - last.gen) / (p.t - last.t);
      p.tpt = p.gen > last.gen ? (p.calls - last.calls) / (p.gen - last.gen) : (last.tpt || 0);
    }
    hist.push(p);
    el('backbone').textContent = j.status.backbone;
    el('generated').textContent = j.generated_tokens;
    el('tps').textContent = p.tps.toFixed(1);
    el('tpt').textContent = p.tpt.toFixed(2);
    el('nup').textContent = j.status.workers.filter(w => w.state === 'up').length + ' / ' + j.status.workers.length;
    drawMap(j.status.workers); drawWorkers(j.status.workers); drawHeat(j.heatmap); drawChart();
    updates += 1; el('updates').textContent = updates; document.body.dataset.updates = updates;
    // For tests and scrapers: the first and latest generated-token counts this page saw.
    if (document.body.dataset.genFirst === undefined) document.body.dataset.genFirst = j.generated_tokens;
    document.body.dataset.genLast = j.generated_tokens;
  } catch (e) { document.body.dataset.error = String(e); }
}
update(); setInterval(update, 1000);
</script></body></html>
)HTML";
}

}  // namespace moesh::serve
