// cachecompact proxy dashboard. Everything from the API is inserted with textContent or as SVG
// attributes, never as HTML, so hostile text in an excerpt stays text.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const state = { version: -1, session: null, miss: null, sort: { key: "last_time", dir: -1 }, filter: "" };
const COLORS = { read: "#4c9f70", write: "#e07a5f", input: "#999", miss: "#c0392b", idle: "#5b8bd0",
  compaction: "#6c3483", rewrite: "#3d5a80", cost: "#2c6e9b" };
const PARTS = [["system", "system prompt", "#8e6c8a"], ["tools", "tools", "#b08d57"],
  ["mcp_tools", "MCP tools", "#d4a373"], ["user", "user messages", "#5b8bd0"],
  ["assistant", "assistant messages", "#4c9f70"], ["tool_use", "tool calls", "#7fb8a4"],
  ["tool_result", "tool results", "#e07a5f"], ["thinking", "thinking", "#9b9b9b"],
  ["image", "images and documents", "#c9b458"]];

async function api(path) {
  const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); }
// "1 request", "2 requests": a count and its noun, in the number it takes
function plural(n, one, many = one + "s") { return `${n} ${Number(n) === 1 ? one : many}`; }
const usd = (x) => "$" + Number(x || 0).toFixed(4);
const tokens = (n) => Number(n || 0).toLocaleString("en-US");
const when = (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : "");
function duration(s) {
  s = Math.max(0, Number(s || 0));
  if (s < 60) return `${s.toFixed(0)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}
function seconds(s) {
  if (s < 60) return `${Number(s).toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 3600) return `${(s / 60).toFixed(s < 600 ? 1 : 0)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function show(view) {
  for (const v of ["sessions-view", "session-view", "miss-view"]) $(v).hidden = v !== view;
}

// A request's finding is a miss unless our own compaction caused it: that re-write was paid on
// purpose (its own class, compaction_rewrite) and is never shown as a miss.
const isMiss = (r) => r.cls && r.cls !== "read_as_expected" && !r.ours;

// One row saying a table is empty, across its columns.
function emptyRow(body, columns, message) {
  const tr = document.createElement("tr");
  const td = cell(tr, message, "muted empty");
  td.colSpan = columns;
  body.appendChild(tr);
}

// Every view has an address (#/session/<id>, #/session/<id>/request/<i>), so a session or a miss
// can be linked to, bookmarked and reached with the back button.
function route() {
  const m = location.hash.match(/^#\/session\/([^/]+)(?:\/request\/(\d+))?$/);
  if (!m) { state.session = null; state.miss = null; show("sessions-view"); renderSessions(); return; }
  const sid = decodeURIComponent(m[1]);
  if (m[2] === undefined) { openSession(sid); return; }
  state.session = sid;
  openMiss(Number(m[2]));
}
const sessionLink = (sid) => `#/session/${encodeURIComponent(sid)}`;
const missLink = (sid, i) => `${sessionLink(sid)}/request/${i}`;

// -- the session list ---------------------------------------------------------------------------

function sortValue(s, key) {  // the value the row shows: the conversation's first session's own
  const v = s[key];
  return typeof v === "string" ? v.toLowerCase() : Number(v || 0);
}

function row(body, s, segment) {
  const tr = document.createElement("tr");
  tr.dataset.sid = s.id;
  if (segment) tr.className = "segment";
  const name = s.title ? `${s.title} (${s.id})` : s.id;
  const td = cell(tr, "");
  const a = document.createElement("a");
  a.href = sessionLink(s.id);
  a.textContent = segment ? `\u21b3 ${name}, ${(s.link && s.link.reason) || "linked"}` : name;
  td.appendChild(a);
  cell(tr, s.model || "");
  // a conversation's first row: its own figures and the conversation's beside them (issue 50: the root
  // row showed $0.12 of a $1.79 conversation, read as the whole)
  const c = !segment && s.conversation && s.conversation.sessions > 1 ? s.conversation : null;
  // requests not answered 200 (the proxy's refusals, the upstream's errors) are the session's too (issue 62)
  const unanswered = (x) => (x.errors ? `, ${x.errors} not answered` : "");
  cell(tr, c ? `${s.requests}${unanswered(s)} (all ${c.requests}${unanswered(c)})`
    : `${s.requests}${unanswered(s)}`, "num");
  cell(tr, c ? `${usd(s.cost_usd)} (all ${usd(c.cost_usd)})` : usd(s.cost_usd), "num");
  cell(tr, c ? `${usd(s.wasted_usd)} (all ${usd(c.wasted_usd)})` : usd(s.wasted_usd), "num");
  cell(tr, (100 * s.hit_rate).toFixed(1) + "%", "num");
  cell(tr, when(s.first_time)); cell(tr, when(s.last_time)); cell(tr, duration(s.duration_s), "num");
  cell(tr, Object.entries(s.misses).map(([k, v]) => `${k} ${v}`).join(", "));
  tr.addEventListener("click", () => { location.hash = sessionLink(s.id); });
  body.appendChild(tr);
}

async function renderSessions() {
  const data = await api("/api/sessions");
  const body = $("sessions").tBodies[0];
  clear(body);
  const f = state.filter.trim().toLowerCase();
  const match = (s) => !f || [s.id, s.model, s.title].some((x) => String(x || "").toLowerCase().includes(f));
  const shown = data.sessions.filter((c) => [c, ...(c.segments || [])].some(match));
  const { key, dir } = state.sort;
  shown.sort((a, b) => {
    const x = sortValue(a, key), y = sortValue(b, key);
    return x < y ? -dir : x > y ? dir : 0;
  });
  for (const th of $("sessions").tHead.rows[0].cells) {
    th.classList.toggle("sorted-asc", th.dataset.key === key && dir === 1);
    th.classList.toggle("sorted-desc", th.dataset.key === key && dir === -1);
  }
  // one row per conversation, its linked sessions (segments, sub-agents) under it
  const all = [];
  for (const c of shown) {
    row(body, c, false);
    all.push(c);
    for (const s of c.segments || []) { row(body, s, true); all.push(s); }
  }
  const totals = $("totals");
  clear(totals);
  const sum = (k) => all.reduce((a, s) => a + Number(s[k] || 0), 0);
  const prompt = sum("prompt_tokens");  // the hit rate of them all: tokens read over prompt tokens
  cell(totals, `total: ${shown.length} conversations, ${all.length} sessions`); cell(totals, "");
  const errors = sum("errors");
  cell(totals, errors ? `${sum("requests")}, ${errors} not answered` : sum("requests"), "num");
  cell(totals, usd(sum("cost_usd")), "num");
  cell(totals, usd(sum("wasted_usd")), "num");
  cell(totals, prompt ? (100 * sum("read_tokens") / prompt).toFixed(1) + "%" : "", "num");
  cell(totals, ""); cell(totals, ""); cell(totals, ""); cell(totals, "");
  $("no-sessions").hidden = data.sessions.length > 0 || data.rejected_only.requests > 0;
  const rej = $("rejected-only");  // rejected before any answer: counted, not listed (no empty rows)
  rej.hidden = data.rejected_only.requests === 0;
  const n = data.rejected_only.requests;
  rej.textContent = `${plural(n, "request")} of conversations that got no answer (rejected, failed or cut off; ` +
    `${plural(data.rejected_only.sessions, "session id")}) ${n === 1 ? "is" : "are"} not listed; /metrics counts ` +
    `${n === 1 ? "it" : "them"}.`;
  if (data.sessions.length > 0 && shown.length === 0) emptyRow(body, 10, `no session matches "${state.filter}"`);
}

// -- charts: axes with labels and ticks, a value on hover -------------------------------------------

function el(name, attrs, parent) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function text(parent, x, y, s, attrs = {}) {
  const t = el("text", { x, y, ...attrs }, parent);
  t.textContent = s;
  return t;
}

function niceTicks(max, n = 5) {
  if (max <= 0) return [0];
  const raw = max / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * p).find((s) => s >= raw) || raw;
  const out = [];
  for (let v = 0; v <= max * 1.0001; v += step) out.push(v);
  return out;
}

// A chart frame: x over request indices 0..n-1, y from 0 to yMax (or a log scale), the axes
// labelled; returns the svg and the mapping functions.
function frame(box, n, yMax, { xLabel, yLabel, yFormat, log }) {
  clear(box);
  const W = 1000, H = 230, L = 74, R = 14, T = 10, B = 40;
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": yLabel }, box);
  const band = (W - L - R) / Math.max(1, n);
  const x = (i) => L + (i + 0.5) * band;  // each request at the middle of its band
  const lo = log ? Math.log10(log) : 0, hi = log ? Math.log10(Math.max(yMax, log * 10)) : yMax;
  const y = (v) => {
    const f = log ? (Math.log10(Math.max(v, log)) - lo) / (hi - lo || 1) : v / (hi || 1);
    return H - B - f * (H - T - B);
  };
  const ticks = log ? [1, 10, 60, 300, 3600, 86400].filter((v) => v <= Math.pow(10, hi) && v >= log)
    : niceTicks(yMax);
  for (const v of ticks) {
    el("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }, svg);
    text(svg, L - 6, y(v) + 4, yFormat(v), { "text-anchor": "end" });
  }
  const xt = niceTicks(Math.max(1, n - 1), Math.min(10, Math.max(1, n - 1))).filter((v) => Number.isInteger(v));
  for (const v of xt) text(svg, x(v), H - B + 15, String(v), { "text-anchor": "middle" });
  el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }, svg);
  el("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }, svg);
  text(svg, (L + W - R) / 2, H - 6, xLabel, { "text-anchor": "middle", class: "x-label" });
  text(svg, 14, (T + H - B) / 2, yLabel, { "text-anchor": "middle", class: "y-label",
    transform: `rotate(-90 14 ${(T + H - B) / 2})` });
  return { svg, x, y, W, H, L, R, T, B, bw: Math.max(1, Math.min(band * 0.8, band - 1)) };
}

function hover(shape, readout, words) {
  el("title", {}, shape).textContent = words;
  shape.addEventListener("mouseenter", () => { $(readout).textContent = words; });
}

function costChart(reqs) {
  let total = 0;
  const pts = reqs.map((r) => (total += Number(r.cost_usd || 0)));
  const f = frame($("chart-cost"), reqs.length, Math.max(...pts, 1e-6),
    { xLabel: "request", yLabel: "cumulative cost ($)", yFormat: (v) => "$" + v.toFixed(v < 1 ? 3 : 2) });
  el("polyline", { points: pts.map((v, i) => `${f.x(i)},${f.y(v)}`).join(" "), fill: "none",
    stroke: COLORS.cost, "stroke-width": 2 }, f.svg);
  pts.forEach((v, i) => {
    const c = el("circle", { cx: f.x(i), cy: f.y(v), r: 4, fill: COLORS.cost, class: "point" }, f.svg);
    hover(c, "readout-cost", `request #${reqs[i].i}: ${usd(reqs[i].cost_usd)} (total ${usd(v)})`);
  });
}

function contextChart(reqs) {
  const size = (r) => r.read + r.write + r.input;
  const f = frame($("chart-context"), reqs.length, Math.max(1, ...reqs.map(size)),
    { xLabel: "request", yLabel: "tokens", yFormat: (v) => (v >= 1000 ? `${Math.round(v / 1000)}k` : String(v)) });
  let before = 0;
  reqs.forEach((r, k) => {
    const x0 = f.x(k) - f.bw / 2;
    let top = 0;
    for (const part of ["read", "write", "input"]) {
      const y1 = f.y(top + r[part]), y0 = f.y(top);
      const bar = el("rect", { x: x0, y: y1, width: f.bw, height: Math.max(0, y0 - y1), fill: COLORS[part],
        class: `bar ${part}` }, f.svg);
      hover(bar, "readout-context", `request #${r.i}: ${tokens(size(r))} tokens (${tokens(r.read)} read, ` +
        `${tokens(r.write)} written, ${tokens(r.input)} uncached)`);
      top += r[part];
    }
    const n = Number(r.compactions_so_far || 0);
    if (n > before) {
      const tri = el("path", { d: `M${f.x(k) - 5},${f.T} h10 l-5,9 z`, fill: COLORS.compaction, class: "compaction" },
        f.svg);
      hover(tri, "readout-context", `request #${r.i}: compaction (${n - before} ledger entr${n - before > 1 ? "ies" : "y"})`);
    }
    before = Math.max(before, n);
    if (isMiss(r)) {
      const m = el("rect", { x: x0, y: f.H - f.B + 20, width: f.bw, height: 6, fill: COLORS.miss, class: "miss-mark" },
        f.svg);
      m.dataset.i = r.i;
      hover(m, "readout-context", `request #${r.i}: ${r.cls} at ${r.location || "-"} (${usd(r.wasted_usd)})`);
      m.addEventListener("click", () => { location.hash = missLink(state.session, r.i); });
    } else if (r.ours) {  // the re-write our own compaction caused: paid on purpose, not a miss
      const m = el("rect", { x: x0, y: f.H - f.B + 20, width: f.bw, height: 6, fill: COLORS.rewrite,
        class: "rewrite-mark" }, f.svg);
      hover(m, "readout-context", `request #${r.i}: cache re-written after our compaction (ledger entry ` +
        `#${r.explained_by}), ${usd(r.wasted_usd)} over reading`);
    }
  });
}

function idleChart(reqs) {
  const gaps = reqs.map((r, k) => (r.idle_s !== null && r.idle_s !== undefined ? Number(r.idle_s) :
    k > 0 && r.time && reqs[k - 1].time ? Math.max(0, r.time - reqs[k - 1].time) : null));
  const f = frame($("chart-idle"), reqs.length, Math.max(3600, ...gaps.filter((g) => g !== null)),
    { xLabel: "request", yLabel: "idle before (s, log)", yFormat: seconds, log: 1 });
  for (const [ttl, name] of [[300, "5 min TTL"], [3600, "1 h TTL"]]) {
    el("line", { x1: f.L, x2: f.W - f.R, y1: f.y(ttl), y2: f.y(ttl), class: "ttl" }, f.svg);
    text(f.svg, f.W - f.R - 4, f.y(ttl) - 3, name, { "text-anchor": "end" });
  }
  reqs.forEach((r, k) => {
    const g = gaps[k];
    if (g === null) return;
    const y1 = f.y(Math.max(g, 1));
    const expired = r.cls === "ttl_expiry";
    const bar = el("rect", { x: f.x(k) - f.bw / 2, y: y1, width: f.bw, height: Math.max(1, f.y(1) - y1),
      fill: expired ? COLORS.miss : COLORS.idle, class: "idle-bar" }, f.svg);
    hover(bar, "readout-idle", `request #${r.i}: idle ${seconds(g)} before it, TTL ${r.ttl || "5m"}` +
      (expired ? ": the cache had expired" : ""));
  });
}

function contextView(latest, window) {
  const parts = (latest && latest.context) || null;
  const bar = $("context-bar"), body = $("context-parts").tBodies[0];
  clear(bar); clear(body);
  if (!parts) {
    const tr = document.createElement("tr");
    cell(tr, "no request with usage yet"); body.appendChild(tr);
    return;
  }
  const used = PARTS.reduce((a, [k]) => a + Number(parts[k] || 0), 0);
  const whole = Math.max(window || 0, used);
  const rows = [...PARTS.map(([k, name, color]) => [name, Number(parts[k] || 0), color]),
    ["free space", Math.max(0, whole - used), "#f2f2f2"]];
  for (const [name, n, color] of rows) {
    if (n > 0) {
      const d = document.createElement("div");
      d.style.width = `${(100 * n) / whole}%`; d.style.background = color; d.title = `${name}: ${tokens(n)} tokens`;
      bar.appendChild(d);
    }
    const tr = document.createElement("tr");
    cell(tr, name); cell(tr, tokens(n), "num"); cell(tr, `${((100 * n) / whole).toFixed(1)}%`, "num");
    body.appendChild(tr);
  }
}

// The sentence over a session's page: its figures, each count with its noun in the right number.
function sessionSummary(s) {
  const th = s.thinking || {};
  return `${s.model || "model unknown"}: ${plural(s.requests, "request")} over ` +
    `${duration(s.duration_s)} (${when(s.first_time)} to ${when(s.last_time)})` +
    (s.errors ? ` (${s.errors} not answered 200` + (s.refused ? `, ${s.refused} of them refused by the proxy: the ` +
      "context was full" : "") + ")" : "") +
    `, cost ${usd(s.cost_usd)}` + (s.summaries_usd ? ` (summaries ${usd(s.summaries_usd)})` : "") +
    ", hit rate " +
    `${(100 * s.hit_rate).toFixed(1)}%, wasted ${usd(s.wasted_usd)}; API diagnostics agreed ` +
    `${s.api_agree} of ${s.api_conclusive}` + (s.compaction_rewrites ? `; ${plural(s.compaction_rewrites, "re-write")} ` +
    `after our compactions (${usd(s.compaction_rewrite_usd)}, paid on purpose, not misses)` : "") +
    (th.turns || th.drop_block_requests ? `; thinking: the blocks of ${plural(th.turns, "turn")} invalidated by our ` +
      `edits, ${tokens(th.left_out_tokens)} tokens of them left out of requests; ` +
      `${plural(th.drop_block_requests, "request")} asked the API to drop a tool-loop turn's thinking it could ` +
      "not leave out" : "");
}

async function openSession(sid) {
  state.session = sid; state.miss = null;
  const data = await api(`/api/sessions/${encodeURIComponent(sid)}`);
  if (state.session !== sid || state.miss !== null) return;  // the reader moved on while this was fetched
  const s = data.session;
  $("session-title").textContent = s.title ? `${s.title} (session ${s.id})` : `session ${s.id}`;
  $("session-summary").textContent = sessionSummary(s);
  $("window-note").textContent = `the window: ${tokens(data.window)} tokens (${data.window_source})`;
  const rel = $("session-related");  // the other sessions of its conversation: segments, sub-agents
  clear(rel);
  const others = (data.conversation || []).filter((x) => x.id !== s.id);
  if (others.length) {
    rel.append(`one of ${others.length + 1} sessions of a conversation: `);
    others.forEach((x, k) => {
      const a = document.createElement("a");
      a.href = sessionLink(x.id);
      a.textContent = x.reason ? `${x.id} (${x.reason})` : `${x.id} (the first)`;
      if (k) rel.append(", ");
      rel.append(a);
    });
  }
  const reqs = data.requests.filter((r) => r.status === 200 || r.status === undefined || r.status === null);
  costChart(reqs); contextChart(reqs); idleChart(reqs);
  contextView([...reqs].reverse().find((r) => r.context), data.window);
  const mb = $("misses").tBodies[0];
  clear(mb);
  const misses = data.requests.filter(isMiss);
  for (const r of misses) {
    const tr = document.createElement("tr");
    tr.dataset.i = r.i;
    const td = cell(tr, "");
    const a = document.createElement("a");
    a.href = missLink(s.id, r.i); a.textContent = `#${r.i}`;
    td.appendChild(a);
    cell(tr, r.cls); cell(tr, r.location || "-"); cell(tr, usd(r.wasted_usd)); cell(tr, r.api_reason || "");
    tr.addEventListener("click", () => { location.hash = missLink(s.id, r.i); });
    mb.appendChild(tr);
  }
  if (!misses.length) emptyRow(mb, 5, "no cache misses in this session");
  const cb = $("compactions").tBodies[0];
  clear(cb);
  for (const c of data.compactions) {
    const tr = document.createElement("tr");
    cell(tr, c.seq); cell(tr, c.level); cell(tr, c.kind); cell(tr, `${c.start}..${c.end}`);
    cell(tr, `${c.tokens_before} -> ${c.tokens_after}`); cell(tr, c.reason);
    cb.appendChild(tr);
  }
  if (!data.compactions.length) emptyRow(cb, 6, "no compactions in this session");
  show("session-view");
}

async function openMiss(i) {
  state.miss = i;
  const r = await api(`/api/sessions/${encodeURIComponent(state.session)}/requests/${i}`);
  if (state.miss !== i) return;
  const f = r.finding || {};
  $("miss-title").textContent = `request #${r.i}: ${f.cls}`;
  $("miss-link").href = missLink(state.session, r.i);
  const dl = $("miss-facts");
  clear(dl);
  const fact = (k, v) => {
    const dt = document.createElement("dt"); dt.textContent = k; dl.appendChild(dt);
    const dd = document.createElement("dd"); dd.textContent = v === null || v === undefined ? "-" : String(v);
    dl.appendChild(dd);
  };
  fact("divergent block", f.location); fact("character offset", f.offset); fact("what happened", f.detail);
  fact("tokens that could have been read", f.wasted_tokens); fact("wasted", usd(f.wasted_usd));
  fact("read / expected", `${f.read} / ${f.expected}`); fact("API diagnostics", f.api_reason);
  fact("idle before (s)", f.idle_s === null || f.idle_s === undefined ? null : Number(f.idle_s).toFixed(1));
  $("miss-before").textContent = f.before || "(no excerpt)";
  $("miss-after").textContent = f.after || "(no excerpt)";
  const hasBody = typeof r.body === "string";
  $("body-title").hidden = !hasBody; $("miss-body").hidden = !hasBody;
  $("miss-body").textContent = hasBody ? r.body : "";
  show("miss-view");
}

async function poll() {
  try {
    const v = await api("/api/version");
    $("status").textContent = `${v.mode} mode, upstream ${v.upstream}`;
    if (v.version !== state.version) {
      state.version = v.version;
      if (state.miss === null && state.session !== null && !$("session-view").hidden) await openSession(state.session);
      if (!$("sessions-view").hidden) await renderSessions();
      $("updated").textContent = `updated ${new Date().toLocaleTimeString()} (${plural(v.requests, "request")} ` +
        "recorded)";
    }
  } catch (e) {
    $("status").textContent = `disconnected (${e.message})`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("back").addEventListener("click", (e) => { e.preventDefault(); location.hash = "#/"; });
  $("back-session").addEventListener("click", (e) => { e.preventDefault(); location.hash = sessionLink(state.session); });
  window.addEventListener("hashchange", route);
  $("filter").addEventListener("input", (e) => { state.filter = e.target.value; renderSessions(); });
  for (const th of $("sessions").tHead.rows[0].cells) {
    if (!th.dataset.key) continue;
    th.addEventListener("click", () => {
      const k = th.dataset.key;
      state.sort = { key: k, dir: state.sort.key === k ? -state.sort.dir : (k === "id" || k === "model" ? 1 : -1) };
      renderSessions();
    });
  }
  route();
  poll();
  setInterval(poll, 1000);
});
