// cachecompact proxy dashboard. Everything from the API is inserted with textContent or as SVG
// attributes, never as HTML, so hostile text in an excerpt stays text.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const state = { version: -1, session: null, miss: null };

async function api(path) {
  const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  row.appendChild(td);
  return td;
}

function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); }
const usd = (x) => "$" + Number(x || 0).toFixed(4);

function show(view) {
  for (const v of ["sessions-view", "session-view", "miss-view"]) $(v).hidden = v !== view;
}

async function renderSessions() {
  const data = await api("/api/sessions");
  const body = $("sessions").tBodies[0];
  clear(body);
  $("no-sessions").hidden = data.sessions.length > 0;
  // one row per conversation; its linked sessions (segments, sub-agents) indented under it
  for (const c of data.sessions) {
    for (const s of [c, ...(c.segments || [])]) {
      const tr = document.createElement("tr");
      tr.dataset.sid = s.id;
      cell(tr, s === c ? s.id : `\u21b3 ${s.id} (${s.link.reason})`); cell(tr, s.mode); cell(tr, s.requests);
      cell(tr, usd(s.cost_usd)); cell(tr, (100 * s.hit_rate).toFixed(1) + "%"); cell(tr, usd(s.wasted_usd));
      cell(tr, Object.entries(s.misses).map(([k, v]) => `${k} ${v}`).join(", "));
      tr.addEventListener("click", () => openSession(s.id));
      body.appendChild(tr);
    }
  }
}

function timeline(reqs) {
  const box = $("timeline");
  clear(box);
  const w = Math.max(600, Math.min(1400, reqs.length * 12)), h = 220, pad = 30;
  const max = Math.max(1, ...reqs.map((r) => r.read + r.write + r.input));
  const bw = (w - pad) / Math.max(1, reqs.length);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h);
  svg.setAttribute("role", "img");
  const bar = (x, y, height, cls, title) => {
    const r = document.createElementNS(SVG, "rect");
    r.setAttribute("x", x); r.setAttribute("y", y);
    r.setAttribute("width", Math.max(1, bw - 1)); r.setAttribute("height", Math.max(0, height));
    r.setAttribute("class", cls);
    const t = document.createElementNS(SVG, "title");
    t.textContent = title;
    r.appendChild(t);
    svg.appendChild(r);
    return r;
  };
  reqs.forEach((r, k) => {
    const x = pad + k * bw;
    let y = h - 20;
    for (const [part, cls] of [["read", "read"], ["write", "write"], ["input", "input"]]) {
      const hh = (r[part] / max) * (h - 40);
      y -= hh;
      const rect = bar(x, y, hh, cls, `#${r.i} ${part}: ${r[part]} tokens`);
      rect.setAttribute("fill", { read: "#4c9f70", write: "#e07a5f", input: "#999" }[cls]);
    }
    if (r.cls && r.cls !== "read_as_expected") {
      const m = bar(x, h - 16, 12, "miss-mark", `#${r.i} ${r.cls} at ${r.location || "-"} (${usd(r.wasted_usd)})`);
      m.setAttribute("fill", "#c0392b");
      m.dataset.i = r.i;
      m.addEventListener("click", () => openMiss(r.i));
    }
  });
  box.appendChild(svg);
}

async function openSession(sid) {
  state.session = sid; state.miss = null;
  const data = await api(`/api/sessions/${encodeURIComponent(sid)}`);
  const s = data.session;
  $("session-title").textContent = `session ${s.id}`;
  $("session-summary").textContent = `${s.requests} requests, cost ${usd(s.cost_usd)}, hit rate ` +
    `${(100 * s.hit_rate).toFixed(1)}%, wasted ${usd(s.wasted_usd)}; API diagnostics agreed ` +
    `${s.api_agree} of ${s.api_conclusive}`;
  timeline(data.requests);
  const mb = $("misses").tBodies[0];
  clear(mb);
  for (const r of data.requests.filter((x) => x.cls && x.cls !== "read_as_expected")) {
    const tr = document.createElement("tr");
    tr.dataset.i = r.i;
    cell(tr, r.i); cell(tr, r.cls); cell(tr, r.location || "-"); cell(tr, usd(r.wasted_usd)); cell(tr, r.api_reason || "");
    tr.addEventListener("click", () => openMiss(r.i));
    mb.appendChild(tr);
  }
  const cb = $("compactions").tBodies[0];
  clear(cb);
  for (const c of data.compactions) {
    const tr = document.createElement("tr");
    cell(tr, c.seq); cell(tr, c.level); cell(tr, c.kind); cell(tr, `${c.start}..${c.end}`);
    cell(tr, `${c.tokens_before} -> ${c.tokens_after}`); cell(tr, c.reason);
    cb.appendChild(tr);
  }
  show("session-view");
}

async function openMiss(i) {
  state.miss = i;
  const r = await api(`/api/sessions/${encodeURIComponent(state.session)}/requests/${i}`);
  const f = r.finding || {};
  $("miss-title").textContent = `request #${r.i}: ${f.cls}`;
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
    }
  } catch (e) {
    $("status").textContent = `disconnected (${e.message})`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("back").addEventListener("click", (e) => { e.preventDefault(); state.session = null; show("sessions-view"); renderSessions(); });
  $("back-session").addEventListener("click", (e) => { e.preventDefault(); state.miss = null; openSession(state.session); });
  poll();
  setInterval(poll, 1000);
});
