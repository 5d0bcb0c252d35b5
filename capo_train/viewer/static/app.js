// capo view: plain JavaScript, no libraries, no network beyond this folder's data/*.js files.
// Every text from a run (observations, actions, task ids) goes into the page as text nodes, never as HTML.
"use strict";

const CAPO = (window.CAPO = { data: {}, pending: {}, renders: 0 });
CAPO.put = function (key, value) { CAPO.data[key] = value; };

const PAGE_SIZE = 50;
const RUN_COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#0a7ea4"];
const CHARTS = [
  { title: "success", range: [0, 1], keys: [["rollout/success", "training"], ["eval/success", "held-out"]] },
  { title: "invalid-action rate", range: [0, null], keys: [["rollout/invalid_action_rate", "training"], ["eval/invalid_action_rate", "held-out"]] },
  { title: "KL", keys: [["actor/approx_kl", "to rollout policy"], ["actor/kl_ref", "to reference"]] },
  { title: "clip fraction", range: [0, null], keys: [["actor/clip_frac", "all"], ["actor/clip_frac_high", "high"], ["actor/clip_frac_low", "low"]] },
  { title: "explained variance", keys: [["critic/explained_variance", "critic"]] },
  { title: "entropy", keys: [["actor/entropy", "policy"]] },
  { title: "reward", keys: [["rollout/reward_mean", "training"]] },
];

// ------------------------------------------------------------------ data loading (script tags: work from file:// too)

function load(key) {
  if (key in CAPO.data) return Promise.resolve(CAPO.data[key]);
  if (CAPO.pending[key]) return CAPO.pending[key];
  CAPO.pending[key] = new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = "data/" + key + ".js";
    s.onload = () => { delete CAPO.pending[key]; key in CAPO.data ? resolve(CAPO.data[key]) : reject(new Error("no data in " + key)); };
    s.onerror = () => { delete CAPO.pending[key]; reject(new Error("cannot load data/" + key + ".js")); };
    document.head.appendChild(s);
  });
  return CAPO.pending[key];
}

// ------------------------------------------------------------------ small DOM helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style") el.style.cssText = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const SVG_NS = "http://www.w3.org/2000/svg";
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined) el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}
function fmt(x, digits = 3) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (!isFinite(x)) return String(x);
  if (x !== 0 && (Math.abs(x) < 1e-3 || Math.abs(x) >= 1e5)) return x.toExponential(2);
  return x.toFixed(digits);
}
function advColor(a, scale) {
  if (a === null || a === undefined) return "#eeeeee";
  const t = Math.max(-1, Math.min(1, a / (scale || 1)));
  const rgb = t >= 0 ? "37,99,235" : "220,38,38";
  return "rgba(" + rgb + "," + (0.08 + 0.92 * Math.abs(t)).toFixed(3) + ")";
}
function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, query] = raw.split("?");
  return { parts: path.split("/").filter(Boolean), params: new URLSearchParams(query || "") };
}
function link(parts, params) {
  const q = params && [...params].length ? "?" + params.toString() : "";
  return "#/" + parts.join("/") + q;
}

// ------------------------------------------------------------------ charts (SVG)

function lineChart(title, lines, opts = {}) {
  const W = opts.width || 300, H = opts.height || 150, L = 50, R = 8, T = 8, B = 20;
  const pts = lines.flatMap((l) => l.points);
  const box = h("div", { class: "chart", "data-chart": title });
  box.appendChild(h("div", { class: "title" }, title));
  if (!pts.length) { box.appendChild(h("div", { class: "muted" }, "not logged")); return box; }
  let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
  let y0 = Math.min(...pts.map((p) => p[1])), y1 = Math.max(...pts.map((p) => p[1]));
  if (opts.range) { if (opts.range[0] !== null) y0 = Math.min(y0, opts.range[0]); if (opts.range[1] !== null) y1 = Math.max(y1, opts.range[1]); }
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R), Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const svg = s("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  svg.appendChild(s("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#d0d7de" }));
  svg.appendChild(s("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#d0d7de" }));
  if (y0 < 0 && y1 > 0) svg.appendChild(s("line", { x1: L, y1: Y(0), x2: W - R, y2: Y(0), stroke: "#d0d7de", "stroke-dasharray": "2 2" }));
  svg.appendChild(s("text", { x: L - 3, y: T + 8, "text-anchor": "end" }, fmt(y1, 2)));
  svg.appendChild(s("text", { x: L - 3, y: H - B, "text-anchor": "end" }, fmt(y0, 2)));
  svg.appendChild(s("text", { x: L, y: H - 6 }, fmt(x0, 0)));
  svg.appendChild(s("text", { x: W - R, y: H - 6, "text-anchor": "end" }, (opts.xlabel || "iteration") + " " + fmt(x1, 0)));
  for (const l of lines) {
    if (!l.points.length) continue;
    const d = l.points.map((p, i) => (i ? "L" : "M") + X(p[0]).toFixed(1) + " " + Y(p[1]).toFixed(1)).join(" ");
    svg.appendChild(s("path", { d, fill: "none", stroke: l.color, "stroke-width": 1.6, "stroke-dasharray": l.dash || null }));
    if (l.points.length <= 60 || l.marks) {
      for (const p of l.points) {
        svg.appendChild(s("circle", { cx: X(p[0]), cy: Y(p[1]), r: l.points.length <= 12 ? 2.8 : 1.6, fill: l.color },
          s("title", {}, `${l.label}: ${fmt(p[1], 4)} at ${opts.xlabel || "iteration"} ${p[0]}`)));
      }
    }
  }
  box.appendChild(svg);
  box.appendChild(h("div", { class: "legend" }, lines.filter((l) => l.points.length).map((l) =>
    h("span", {}, h("i", { style: `background:${l.color}` }), l.label))));
  return box;
}

function runCharts(runs) {
  // runs: [{payload, label, color}]; one chart per CHARTS entry, every run's lines on it
  const wrap = h("div", { class: "charts" });
  const palette = ["#0969da", "#cf222e", "#1a7f37", "#8250df"];
  for (const c of CHARTS) {
    const lines = [];
    runs.forEach((r, ri) => c.keys.forEach(([key, label], ki) => {
      const points = (r.payload.series || {})[key] || [];
      if (points.length) lines.push({ label: runs.length > 1 ? `${r.label}: ${label}` : label, points,
        color: runs.length > 1 ? RUN_COLORS[ri % RUN_COLORS.length] : palette[ki % palette.length],
        dash: runs.length > 1 && ki ? "4 3" : null });
    }));
    if (lines.length) wrap.appendChild(lineChart(c.title, lines, { range: c.range }));
  }
  return wrap;
}

function anyKeyChart(payload) {
  const keys = Object.keys(payload.series || {}).sort();
  const holder = h("div", {});
  const select = h("select", { "aria-label": "any logged key" }, h("option", { value: "" }, "plot any logged key…"),
    keys.map((k) => h("option", { value: k }, k)));
  select.addEventListener("change", () => {
    holder.textContent = "";
    if (select.value) holder.appendChild(lineChart(select.value, [{ label: select.value, points: payload.series[select.value], color: "#8250df" }], { width: 420 }));
  });
  return h("div", {}, select, holder);
}

function notesBox(notes, what) {
  // what the viewer could not read (a file, a line, an episode) and left out: data.py's notes
  if (!notes || !notes.length) return null;
  return h("div", { class: "notes", role: "note" }, h("b", {}, `${notes.length} note${notes.length > 1 ? "s" : ""} on ${what}: left out, the rest is shown`),
    h("ul", {}, notes.map((n) => h("li", {}, n))));
}

// ------------------------------------------------------------------ where each iteration's time goes

const PHASE_COLORS = ["#8c959f", "#0969da", "#54aeff", "#bc4c00", "#1a7f37", "#4ac26b", "#d4a72c", "#8250df",
  "#cf222e", "#a475f9", "#0a7ea4", "#57606a"];
const MAX_TIME_ROWS = 100;

function timeBreakdown(payload) {
  // one row per logged record: its time/* phases (report.ITERATION_PHASES) as seconds and a stacked bar
  const series = payload.series || {};
  const phases = (payload.time_phases || []).filter((k) => (series[k] || []).length);
  const extra = ["time/sft_s"].filter((k) => (series[k] || []).length);
  const keys = [...extra, ...phases];
  if (!keys.length) return null;
  const byIt = new Map();
  for (const k of [...keys, "time/iteration_s"]) for (const [it, v] of series[k] || []) {
    if (!byIt.has(it)) byIt.set(it, {});
    byIt.get(it)[k] = v;
  }
  let its = [...byIt.keys()].sort((a, b) => a - b);
  if (its.length > MAX_TIME_ROWS) { const step = Math.ceil(its.length / MAX_TIME_ROWS); its = its.filter((_, j) => j % step === 0 || j === its.length - 1); }
  const total = (r) => r["time/iteration_s"] ?? keys.reduce((a, k) => a + (r[k] || 0), 0);
  const widest = Math.max(...its.map((it) => total(byIt.get(it))), 1e-9);
  const label = (k) => k.replace(/^time\//, "").replace(/_s$/, "");
  const secs = (x) => (typeof x === "number" && isFinite(x) ? x.toFixed(Math.abs(x) >= 100 ? 0 : 2) : "");
  const color = (k) => PHASE_COLORS[keys.indexOf(k) % PHASE_COLORS.length];
  const table = h("table", { class: "timing" },
    h("tr", {}, h("th", { class: "num" }, "iter"), keys.map((k) => h("th", { class: "num", title: k }, h("i", { class: "swatch", style: `background:${color(k)}` }), label(k))),
      h("th", { class: "num", title: "time/iteration_s" }, "iteration"), h("th", { class: "num", title: "iteration - the phases" }, "other"), h("th", {}, "seconds, stacked")),
    its.map((it) => {
      const r = byIt.get(it), sum = keys.reduce((a, k) => a + (r[k] || 0), 0);
      const whole = r["time/iteration_s"];
      return h("tr", { "data-it": it, "data-total": whole ?? "", "data-sum": sum },
        h("td", { class: "num" }, it), keys.map((k) => h("td", { class: "num", "data-key": k }, secs(r[k]))),
        h("td", { class: "num" }, secs(whole)),
        h("td", { class: "num" }, whole === undefined ? "" : secs(whole - sum)),
        h("td", {}, h("span", { class: "stack", style: `width:${(100 * total(r) / widest).toFixed(1)}%` },
          keys.filter((k) => r[k] > 0).map((k) => h("span", { style: `width:${(100 * r[k] / Math.max(total(r), sum, 1e-9)).toFixed(2)}%;background:${color(k)}`, title: `${label(k)}: ${fmt(r[k], 3)} s` })))));
    }));
  return h("details", { class: "timing", open: true }, h("summary", {}, "where each iteration's time goes (time/*, seconds)"), table,
    its.length < byIt.size ? h("p", { class: "muted" }, `${its.length} of ${byIt.size} records shown (evenly spaced, and the last)`) : null);
}

// ------------------------------------------------------------------ episode browser

function filterEpisodes(idx, params) {
  const it = params.get("it"), task = (params.get("task") || "").toLowerCase();
  const succ = params.get("succ"), inv = params.get("inv"), clip = params.get("clip"), split = params.get("split");
  const out = [];
  const n = idx.it.length;
  for (let i = 0; i < n; i++) {
    if (split === "train" && idx.eval[i]) continue;
    if (split === "held-out" && !idx.eval[i]) continue;
    if (it && String(idx.it[i]) !== it) continue;
    if (task && !String(idx.task[i]).toLowerCase().includes(task)) continue;
    if (succ === "1" && !(idx.succ[i] > 0)) continue;
    if (succ === "0" && idx.succ[i] > 0) continue;
    if (inv === "1" && !(idx.inv[i] > 0)) continue;
    if (inv === "0" && idx.inv[i] > 0) continue;
    if (clip === "1" && !(idx.clip[i] > 0)) continue;
    out.push(i);
  }
  return out;
}

function advScale(idx) {
  // the 95th percentile of |advantage| over the run's recorded actions: colours comparable across episodes
  const all = [];
  for (const a of idx.adv) for (const v of a) if (v !== null) all.push(Math.abs(v));
  if (!all.length) return 1;
  all.sort((a, b) => a - b);
  return all[Math.min(all.length - 1, Math.floor(0.95 * all.length))] || 1;
}

function filterBar(payload, params, onChange, runsForTasks) {
  const idx = payload.episodes;
  const set = (k, v) => { const p = new URLSearchParams(params); v ? p.set(k, v) : p.delete(k); p.delete("page"); onChange(p); };
  const sel = (k, label, options) => h("label", {}, label + " ",
    h("select", { name: k, onchange: (e) => set(k, e.target.value) },
      options.map(([v, t]) => h("option", { value: v, selected: (params.get(k) || "") === v }, t))));
  const tasks = [...new Set((runsForTasks || [idx]).flatMap((x) => x.task))].slice(0, 500);
  const list = h("datalist", { id: "tasks-" + CAPO.renders }, tasks.map((t) => h("option", { value: t })));
  const taskInput = h("input", { name: "task", list: list.id, placeholder: "task id contains…", value: params.get("task") || "", size: 22 });
  taskInput.addEventListener("change", (e) => set("task", e.target.value.trim()));
  return h("div", { class: "filters" },
    sel("split", "episodes", [["", "all"], ["train", "training"], ["held-out", "held-out"]]),
    sel("it", "iteration", [["", "all"], ...[...new Set([...payload.iterations, ...(payload.eval_iterations || [])])].sort((a, b) => a - b).map((i) => [String(i), String(i)])]),
    h("label", {}, "task ", taskInput, list),
    sel("succ", "success", [["", "any"], ["1", "succeeded"], ["0", "failed"]]),
    sel("inv", "invalid actions", [["", "any"], ["1", "some"], ["0", "none"]]),
    sel("clip", "clipped actions", [["", "any"], ["1", "some"]]),
    h("span", { class: "scale" }, "advantage", h("span", {}), "− / +"));
}

function episodeTable(runIndex, payload, params, scale, compact = false) {
  const idx = payload.episodes;
  const rows = filterEpisodes(idx, params);
  const pages = Math.max(1, Math.ceil(rows.length / PAGE_SIZE));
  const page = Math.min(pages - 1, Math.max(0, parseInt(params.get("page") || "0", 10) || 0));
  const shown = rows.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE);
  const back = new URLSearchParams(params);
  const table = h("table", { class: "episodes", "data-run": runIndex, "data-count": rows.length },
    h("tr", {}, ["iter", "ep", "task", "success", "return", "actions", "invalid", "clipped", "actions by advantage"].map((t, i) =>
      compact && (i === 5 || i === 7) ? null : h("th", { class: i >= 3 && i <= 7 ? "num" : null }, compact && i === 8 ? "advantage" : t))),
    shown.map((i) => {
      const href = link(["run", runIndex, idx.eval[i] ? "eval" : "ep", idx.it[i], idx.ep[i]], back);
      const valid = idx.valid[i] || "";
      return h("tr", { class: "episode", "data-it": idx.it[i], "data-ep": idx.ep[i], "data-task": idx.task[i],
        "data-success": idx.succ[i], "data-split": idx.eval[i] ? "held-out" : "train", onclick: () => { location.hash = href; } },
        h("td", { class: "num" }, idx.it[i], idx.eval[i] ? [" ", h("span", { class: "badge", title: "held-out evaluation (greedy)" }, "held-out")] : null), h("td", { class: "num" }, h("a", { href }, idx.ep[i])),
        h("td", {}, idx.task[i]),
        h("td", { class: "num" }, h("span", { class: "badge " + (idx.succ[i] > 0 ? "ok" : "bad") }, fmt(idx.succ[i], 2))),
        h("td", { class: "num" }, fmt(idx.ret[i], 2)), compact ? null : h("td", { class: "num" }, idx.n[i]),
        h("td", { class: "num" }, idx.inv[i]), compact ? null : h("td", { class: "num" }, idx.clip[i]),
        h("td", {}, h("span", { class: "strip" }, idx.adv[i].map((a, t) =>
          h("span", { class: valid[t] === "0" ? "invalid" : null, style: `background:${advColor(a, scale)}`, title: `step ${t}: advantage ${fmt(a)}` })))));
    }));
  const nav = (p) => { const q = new URLSearchParams(params); q.set("page", p); return link(parseHash().parts, q); };
  const pager = h("div", { class: "pager" },
    h("span", { class: "count" }, `${rows.length} of ${idx.it.length} recorded episodes`),
    pages > 1 ? [page > 0 ? h("a", { href: nav(page - 1) }, "‹ previous") : null,
      h("span", { class: "muted" }, `page ${page + 1} / ${pages}`),
      page < pages - 1 ? h("a", { href: nav(page + 1) }, "next ›") : null] : null);
  return h("div", {}, pager, table);
}

// ------------------------------------------------------------------ views

async function viewHome(app, site) {
  app.appendChild(h("h1", {}, "Runs"));
  const picked = new Set();
  const compare = h("button", { disabled: true, onclick: () => { const [a, b] = [...picked]; location.hash = link(["compare", a, b]); } }, "compare the two selected runs side by side");
  const update = () => { compare.disabled = picked.size !== 2; };
  app.appendChild(h("table", { class: "runs" },
    h("tr", {}, ["", "run", "algo", "env", "seed", "iterations", "held-out success", "training success", "recorded iterations"].map((t) => h("th", {}, t))),
    site.runs.map((r, i) => h("tr", { "data-run": i },
      h("td", {}, h("input", { type: "checkbox", "aria-label": "select " + r.name, onchange: (e) => { e.target.checked ? picked.add(i) : picked.delete(i); update(); } })),
      h("td", {}, h("a", { href: link(["run", i]) }, r.name), (r.notes || []).length ? [" ", h("span", { class: "badge bad note-count", title: r.notes.join("\n") }, `${r.notes.length} note${r.notes.length > 1 ? "s" : ""}`)] : null),
      h("td", {}, r.algo || "–"), h("td", {}, r.env || "–"),
      h("td", { class: "num" }, r.seed ?? "–"), h("td", { class: "num" }, r.iterations),
      h("td", { class: "num" }, fmt(r.eval_success)), h("td", { class: "num" }, fmt(r.rollout_success)),
      h("td", { class: "num" }, r.recorded_iterations)))));
  app.appendChild(h("p", {}, compare));
  if (site.grids.length) {
    app.appendChild(h("h1", {}, "Benchmark grids"));
    site.grids.forEach((g, gi) => app.appendChild(h("p", {}, h("a", { href: link(["grid", gi]) }, g.name), " ", h("span", { class: "muted" }, g.path))));
  }
}

function kv(obj) {
  return h("table", { class: "kv" }, Object.entries(obj || {}).map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, typeof v === "number" ? fmt(v, 4) : JSON.stringify(v)))));
}

async function viewRun(app, site, i, params) {
  const payload = await load("run-" + i);
  const r = site.runs[i];
  app.appendChild(h("h1", {}, payload.name, " ", h("span", { class: "muted" }, [r.algo, r.env].filter(Boolean).join(" · "))));
  app.appendChild(h("p", { class: "muted" }, payload.path));
  app.append(...[notesBox(payload.notes, "this run's files")].filter(Boolean));
  app.appendChild(runCharts([{ payload, label: payload.name }]));
  app.appendChild(anyKeyChart(payload));
  app.append(...[timeBreakdown(payload)].filter(Boolean));
  app.appendChild(h("details", { class: "config" }, h("summary", {}, "config"), h("pre", {}, JSON.stringify(payload.config, null, 2))));
  if (payload.summary) app.appendChild(h("details", {}, h("summary", {}, "summary"), kv(payload.summary)));
  if (payload.meta) app.appendChild(h("p", { class: "muted" }, `recorded with ${payload.meta.algo}: ratio ${payload.meta.ratio}, clip range [1 − ${payload.meta.clip_low}, 1 + ${payload.meta.clip_high}]` + (payload.meta.critic ? `, critic at ${payload.meta.critic}` : ", no critic")));
  app.appendChild(h("h2", {}, "Episodes"));
  if (!payload.episodes.it.length) { app.appendChild(h("p", { class: "muted" }, "no recorded episodes (record_every=0, or the run has not reached a recorded iteration)")); return; }
  const scale = advScale(payload.episodes);
  const go = (p) => { location.hash = link(["run", i], p); };
  app.appendChild(filterBar(payload, params, go));
  app.appendChild(episodeTable(i, payload, params, scale));
}

function valueChart(actions) {
  const pick = (k) => actions.map((a, t) => [t, a[k]]).filter((p) => typeof p[1] === "number");
  const cum = []; let sum = 0; actions.forEach((a, t) => { sum += a.reward || 0; cum.push([t, sum]); });
  return lineChart("value over the episode's actions", [
    { label: "V(s_t) (critic)", points: pick("value"), color: "#0969da", marks: true },
    { label: "return (target)", points: pick("return"), color: "#1a7f37", dash: "4 3", marks: true },
    { label: "advantage", points: pick("advantage"), color: "#8250df", marks: true },
    { label: "reward so far", points: cum, color: "#bc4c00", dash: "1 3", marks: true },
  ], { width: 460, height: 180, xlabel: "action" });
}

function numbers(a) {
  const keys = ["tokens", "reward", "value", "return", "advantage_raw", "advantage", "ratio", "ratio_min", "ratio_max", "clip_frac", "dual_clip_frac", "clipped"];
  return h("table", { class: "kv" }, keys.filter((k) => k in a).map((k) => h("tr", {}, h("td", {}, k), h("td", { class: "num", "data-key": k, "data-value": a[k] }, k === "tokens" ? String(a[k]) : typeof a[k] === "number" ? fmt(a[k], 4) : String(a[k])))));
}

async function viewEpisode(app, site, i, it, ep, params, kind = "iter") {
  const [payload, chunk] = await Promise.all([load("run-" + i), load(`run-${i}-${kind}-${it}`)]);
  const e = chunk.episodes.find((x) => String(x.episode) === String(ep));
  app.appendChild(h("p", {}, h("a", { href: link(["run", i], params) }, "‹ " + payload.name + ": all episodes")));
  app.append(...[notesBox(chunk.notes, "this iteration's episodes file")].filter(Boolean));
  if (!e) { app.appendChild(h("p", {}, `no episode ${ep} in iteration ${it}`)); return; }
  const scale = advScale(payload.episodes);
  app.appendChild(h("h1", { class: "episode-title" }, `iteration ${e.iteration} · episode ${e.episode} · task ${e.task_id}` + (kind === "eval" ? " · held-out (greedy, not trained on)" : "")));
  app.appendChild(h("p", {}, h("span", { class: "badge " + (e.success > 0 ? "ok" : "bad"), id: "episode-success" }, "success " + fmt(e.success, 2)), " ",
    `return ${fmt(e.return, 3)} · ${e.num_actions} actions · ${e.invalid_actions} invalid · ` + (e.terminated ? "terminated" : e.truncated ? "truncated" : "cut")));
  app.appendChild(h("details", {}, h("summary", {}, "env metrics"), kv(e.metrics)));
  app.appendChild(h("h2", {}, "Actions, coloured by advantage"));
  app.appendChild(h("div", { class: "timeline" }, e.actions.map((a, t) =>
    h("div", { class: "step" + (a.valid ? "" : " invalid") + (a.clipped ? " clipped" : ""), "data-step": t, "data-adv": a.advantage ?? "",
      style: `background:${advColor(a.advantage, scale)}`, title: a.valid ? "valid" : "invalid: " + a.reason,
      onclick: () => { const d = document.getElementById("act-" + t); d.open = true; d.scrollIntoView({ block: "nearest" }); } },
      h("b", {}, "step " + t + (a.valid ? "" : " ✗")), "adv " + fmt(a.advantage), h("br", {}), "w " + fmt(a.ratio, 4) + (a.clipped ? " clipped" : "")))));
  app.appendChild(h("div", { class: "scale" }, "advantage", h("span", {}), `− / + (colour saturates at ±${fmt(scale, 2)}); dashed border: clipped; dotted outline: invalid`));
  app.appendChild(valueChart(e.actions));
  if (e.prompt) app.appendChild(h("details", {}, h("summary", {}, "the first prompt, as the model saw it"), h("pre", {}, e.prompt)));
  for (const [t, a] of e.actions.entries()) {
    app.appendChild(h("details", { class: "action" + (a.valid ? "" : " invalid"), id: "act-" + t, "data-step": t, open: e.actions.length <= 4 },
      h("summary", {}, `step ${t} · ${a.tokens} tokens · ` + (a.valid ? "valid" : "invalid: " + a.reason) + ` · reward ${fmt(a.reward)} · V ${fmt(a.value)} · advantage ${fmt(a.advantage)} · ratio ${fmt(a.ratio, 4)}` + (a.clipped ? " · clipped" : "")),
      h("div", { class: "cols" },
        h("div", {}, h("h3", {}, "observation"), h("pre", { class: "observation" }, a.observation), h("h3", {}, "action"), h("pre", { class: "action-text" }, a.action)),
        h("div", {}, h("h3", {}, "credit"), numbers(a)))));
  }
}

async function viewCompare(app, site, a, b, params) {
  const [pa, pb] = await Promise.all([load("run-" + a), load("run-" + b)]);
  app.appendChild(h("h1", {}, "Side by side"));
  app.appendChild(runCharts([{ payload: pa, label: pa.name }, { payload: pb, label: pb.name }]));
  const go = (p) => { location.hash = link(["compare", a, b], p); };
  // one filter bar for both (iterations: the union; tasks: both runs')
  const both = { episodes: pa.episodes, iterations: [...new Set([...pa.iterations, ...pb.iterations])],
    eval_iterations: [...(pa.eval_iterations || []), ...(pb.eval_iterations || [])] };
  app.appendChild(filterBar(both, params, go, [pa.episodes, pb.episodes]));
  const cols = h("div", { class: "cols" });
  for (const [i, p] of [[a, pa], [b, pb]]) {
    cols.appendChild(h("div", { "data-run": i }, h("h2", {}, h("a", { href: link(["run", i]) }, p.name), " ",
      h("span", { class: "muted" }, [site.runs[i].algo, site.runs[i].env].filter(Boolean).join(" · "))),
      episodeTable(i, p, params, advScale(p.episodes), true)));
  }
  app.appendChild(cols);
}

async function viewGrid(app, site, gi) {
  const g = site.grids[gi];
  app.appendChild(h("h1", {}, "Benchmark grid: " + g.name));
  app.appendChild(h("p", { class: "muted" }, g.path));
  app.append(...[notesBox(g.notes, "this grid's files")].filter(Boolean));
  const metric = g.header.filter((c) => c.endsWith("_mean"));
  app.appendChild(h("table", { class: "grid" },
    h("tr", {}, ["env", "algo", "seeds", ...metric.map((c) => c.slice(0, -5).replace(/_/g, " ")), "runs"].map((t) => h("th", {}, t))),
    g.rows.map((r) => h("tr", { "data-algo": r.algo },
      h("td", {}, r.env), h("td", {}, r.algo), h("td", { class: "num" }, r.seeds_done ?? "–"),
      metric.map((c) => { const m = parseFloat(r[c]), sd = parseFloat(r[c.slice(0, -5) + "_std"]);
        return h("td", { class: "num" }, isNaN(m) ? "–" : fmt(m) + (isNaN(sd) ? "" : " ± " + fmt(sd))); }),
      h("td", {}, r.runs.map((c) => [h("a", { href: link(["run", c.run]) }, c.seed), " "]))))));
  if (g.grid) app.appendChild(h("details", {}, h("summary", {}, "grid.json"), h("pre", {}, JSON.stringify(g.grid, null, 2))));
}

// ------------------------------------------------------------------ router

async function render() {
  const app = document.getElementById("app");
  const crumbs = document.getElementById("crumbs");
  const { parts, params } = parseHash();
  const next = h("main", { id: "app" });
  document.body.removeAttribute("data-ready");
  const started = performance.now();
  try {
    const site = await load("site");
    crumbs.textContent = "";
    if (parts[0] === "run" && parts[2] === "ep") await viewEpisode(next, site, +parts[1], +parts[3], parts[4], params);
    else if (parts[0] === "run" && parts[2] === "eval") await viewEpisode(next, site, +parts[1], +parts[3], parts[4], params, "eval");
    else if (parts[0] === "run") await viewRun(next, site, +parts[1], params);
    else if (parts[0] === "compare") await viewCompare(next, site, +parts[1], +parts[2], params);
    else if (parts[0] === "grid") await viewGrid(next, site, +parts[1]);
    else await viewHome(next, site);
  } catch (err) {
    next.appendChild(h("p", { class: "error" }, "cannot show this page: " + err.message));
  }
  app.replaceWith(next);
  CAPO.renders += 1;
  CAPO.lastRenderMs = performance.now() - started;
  CAPO.readyAt = performance.now(); // since navigation start: the page-load figure benchmarks/bench_viewer.py reports
  document.body.setAttribute("data-ready", parts[0] || "home");
}

window.addEventListener("hashchange", render);
render();
