// The bridge console: polls api/overview every 2 seconds and renders it;
// follows the live tail over the feeds SSE API (api/v1/feed), sending the
// token in the Authorization header, never in the URL. Plain DOM,
// no framework, no build step. Text is always set with textContent.
"use strict";

const POLL_MS = 2000;
const TAIL_MAX = 100;
const NS = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function token() { return sessionStorage.getItem("bridge-token") || ""; }

async function api(path, opts) {
  opts = opts || {};
  const headers = Object.assign({}, opts.headers || {});
  if (token()) headers["Authorization"] = "Bearer " + token();
  const r = await fetch(path, Object.assign({}, opts, { headers }));
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    const msg = body && (body.detail || body.error) ? (body.error + (body.detail ? ": " + body.detail : "")) : r.status + " " + r.statusText;
    throw new Error(msg);
  }
  return body;
}

function problem(msg) {
  const p = document.getElementById("problem");
  p.textContent = msg || "";
  p.hidden = !msg;
}

function bytes(n) {
  if (n === undefined || n === null || n < 0) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + u[i];
}
function secs(s) {
  if (s === undefined || s === null || s < 0) return "–";
  if (s < 1) return (s * 1000).toFixed(0) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  return (s / 60).toFixed(1) + " min";
}
function num(n, digits) {
  if (n === undefined || n === null || n < 0) return "–";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: digits || 0 });
}

// sparkline draws the known (≥ 0) values of a series over the last hour.
function sparkline(values, label) {
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 140 28");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  const pts = [];
  const known = values.filter(v => v >= 0);
  const top = Math.max(1e-9, ...known);
  values.forEach((v, i) => {
    if (v < 0) return;
    const x = values.length < 2 ? 140 : (i / (values.length - 1)) * 140;
    const y = 26 - (v / top) * 24;
    pts.push((pts.length ? "L" : "M") + x.toFixed(1) + " " + y.toFixed(1));
  });
  const title = document.createElementNS(NS, "title");
  title.textContent = label;
  svg.append(title);
  if (pts.length) {
    const p = document.createElementNS(NS, "path");
    p.setAttribute("d", pts.join(" "));
    svg.append(p);
  }
  return svg;
}

// histogram draws the per-bucket counts of a cumulative histogram.
function histogram(h, label) {
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "hist");
  svg.setAttribute("viewBox", "0 0 220 40");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  const title = document.createElementNS(NS, "title");
  title.textContent = label;
  svg.append(title);
  const counts = h.buckets.map((b, i) => b.count - (i ? h.buckets[i - 1].count : 0));
  const top = Math.max(1, ...counts);
  const w = 220 / counts.length;
  counts.forEach((c, i) => {
    const r = document.createElementNS(NS, "rect");
    const height = (c / top) * 38;
    r.setAttribute("x", (i * w + 1).toFixed(1));
    r.setAttribute("width", Math.max(1, w - 2).toFixed(1));
    r.setAttribute("y", (40 - height).toFixed(1));
    r.setAttribute("height", height.toFixed(1));
    svg.append(r);
  });
  return svg;
}

// quantile estimates a quantile from a cumulative histogram (the bucket's
// upper bound, as Prometheus' histogram_quantile would interpolate to).
function quantile(h, q) {
  if (!h || !h.count) return null;
  const want = q * h.count;
  for (const b of h.buckets) if (b.count >= want) return b.le;
  return Infinity;
}

let state = { actions: false };
let loadProblem = false;
let snapshotArmed = null; // {source, until}: the snapshot button awaits its confirmation

// renderSources draws a card per source. The cards and their buttons are
// kept from one refresh to the next and updated in place, so that a click
// whose press and release straddle a refresh still lands, and a button
// keeps the keyboard focus; only the figures are drawn anew.
function renderSources(sources, interval) {
  const box = document.getElementById("sources");
  const have = new Map([...box.children].map(c => [c.id, c]));
  const cards = sources.map(s => {
    const id = "src-" + s.name;
    return have.get(id) || el("article", { class: "source", id, "data-source": s.name, "aria-labelledby": id + "-h" });
  });
  if (cards.length !== box.children.length || cards.some((c, i) => box.children[i] !== c)) box.replaceChildren(...cards);
  sources.forEach((s, i) => fillSource(cards[i], s, interval));
}

function fillSource(card, s, interval) {
  const id = card.id;
  const parts = [];
  const stateText = s.state + (s.paused && s.state !== "paused" ? " (pause requested)" : "");
  parts.push(el("h3", { id: id + "-h" }, s.name + " ", el("span", { class: "muted" }, "(" + s.type + ")"),
    el("span", { class: "state state-" + s.state, "data-field": "state" }, stateText)));
  if (s.paused && s.pause_reason) parts.push(el("p", { class: "muted" }, "Paused by " + (s.paused_by || "?") + ": " + s.pause_reason));
  if (s.last_error && s.state !== "streaming") parts.push(el("p", { class: "error", "data-field": "last_error" }, s.last_error));
  const h = s.history || { series: {} };
  const series = h.series || {};
  const span = interval ? " over the last " + Math.round(((h.at || []).length * interval) / 60) + " min" : "";
  const row = (dt, field, text, serie) => {
    return [el("dt", {}, dt), el("dd", { "data-field": field }, text),
      serie ? el("dd", {}, sparkline(series[serie] || [], dt + span)) : el("dd", {})];
  };
  const slot = s.slot;
  parts.push(el("dl", { class: "figures" },
    ...row("Changes per second", "rate", num(s.changes_per_second, 1), "rate"),
    ...row("Delivered", "delivered", num(s.delivered)),
    ...row("Lag (bytes)", "lag_bytes", s.lag_bytes === undefined ? "–" : bytes(s.lag_bytes), "lag_bytes"),
    ...row("Lag (seconds)", "lag_seconds", secs(s.lag_seconds), "lag_seconds"),
    ...row("Checkpoint age", "checkpoint_age", secs(s.checkpoint_age_seconds), "checkpoint_age"),
    ...row("Slot retained WAL", "retained", slot ? bytes(slot.retained_wal_bytes) + (slot.wal_status ? " (" + slot.wal_status + ")" : "") : "–", "retained_wal"),
    ...row("Checkpoint", "checkpoint", s.checkpoint || "–")));

  // Everything but the buttons is replaced; the buttons stay where they
  // are (removing a focused button would drop its focus).
  let act = card.querySelector(":scope > .actions");
  if (act && !state.actions) { act.remove(); act = null; }
  for (const c of [...card.childNodes]) if (c !== act) c.remove();
  card.prepend(...parts);
  if (!state.actions) return;
  if (!act) {
    act = el("div", { class: "actions" });
    for (const action of ["pause", "resume", "snapshot"]) {
      const btn = el("button", { type: "button", "data-action": action });
      btn.addEventListener("click", () => act_(s.name, action, btn));
      act.append(btn);
    }
    card.append(act);
  }
  const armed = snapshotArmed && snapshotArmed.source === s.name && snapshotArmed.until > Date.now();
  const set = (action, label, aria, enabled) => {
    const btn = act.querySelector("[data-action=" + action + "]");
    btn.disabled = !enabled || btn.dataset.pending === "1";
    if (btn.textContent !== label) btn.textContent = label;
    btn.setAttribute("aria-label", aria);
  };
  set("pause", "Pause", "Pause source " + s.name, s.holder && !s.paused);
  set("resume", "Resume", "Resume source " + s.name, s.paused);
  set("snapshot", armed ? "Confirm snapshot of every table" : "Snapshot",
    armed ? "Confirm the snapshot of every table of source " + s.name : "Snapshot source " + s.name, s.holder);
}

async function act_(source, action, btn) {
  let body = {};
  if (action === "pause") body = { reason: "paused from the console" };
  if (action === "snapshot") {
    // A snapshot re-reads every table: the first click arms the button,
    // a second one within 10 seconds sends the request.
    if (!snapshotArmed || snapshotArmed.source !== source || snapshotArmed.until < Date.now()) {
      snapshotArmed = { source, until: Date.now() + 10000 };
      btn.textContent = "Confirm snapshot of every table";
      btn.setAttribute("aria-label", "Confirm the snapshot of every table of source " + source);
      return;
    }
    snapshotArmed = null;
  }
  // Disabled until the bridge answers, whatever a refresh meanwhile says.
  btn.dataset.pending = "1";
  btn.disabled = true;
  try {
    await api("api/sources/" + encodeURIComponent(source) + "/" + action, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    problem("");
  } catch (e) {
    problem(action + " of " + source + ": " + e.message);
  } finally {
    delete btn.dataset.pending;
  }
  refresh();
}

function renderSnapshots(sources) {
  const box = document.getElementById("snapshots");
  box.replaceChildren();
  let any = false;
  for (const s of sources) {
    const sn = s.snapshot;
    if (!sn || !sn.running) continue;
    any = true;
    const part = el("div", { class: "snapshot", "data-source": s.name },
      el("h3", {}, s.name + ": " + sn.tables_remaining + " table(s) to go"));
    for (const t of sn.tables) {
      const id = "snap-" + s.name + "-" + t.table;
      const max = t.estimate > 0 ? Math.max(t.estimate, t.rows) : undefined;
      part.append(el("div", {},
        el("label", { for: id }, t.table),
        el("progress", { id, max: max, value: max ? t.rows : undefined }),
        el("span", { class: "muted" }, " " + num(t.rows) + (t.estimate > 0 ? " / ~" + num(t.estimate) : "") + " rows" + (t.eta_seconds > 0 ? ", " + secs(t.eta_seconds) + " left" : ""))));
    }
    box.append(part);
  }
  if (!any) box.append(el("p", { class: "muted" }, "No snapshot in progress."));
}

// renderHeld lists the tables a breaking schema change holds
// (on_schema_change: pause or dead_letter); resuming the source accepts
// the change.
// It is drawn anew only when what it shows changed, so that its buttons,
// like the sources', survive the refreshes in between.
let heldShown = null;
function renderHeld(sources) {
  const box = document.getElementById("held");
  const shown = JSON.stringify([state.actions, sources.map(s => [s.name, s.held || []])]);
  if (shown === heldShown) return;
  heldShown = shown;
  box.replaceChildren();
  const rows = [];
  for (const s of sources) {
    for (const h of s.held || []) {
      const cells = [el("td", {}, s.name), el("td", {}, h.table), el("td", { "data-field": "version" }, h.version),
        el("td", { "data-field": "policy" }, h.policy), el("td", {}, h.since ? new Date(h.since).toLocaleString() : "–"),
        el("td", { "data-field": "dead_lettered" }, h.policy === "dead_letter" ? num(h.dead_lettered) : "–"),
        el("td", { class: "reason" }, h.reason, el("div", { class: "muted" }, "registry key " + h.registry_key))];
      if (state.actions) {
        const btn = el("button", { type: "button", "data-action": "resume", "aria-label": "Accept " + h.table + " version " + h.version + ": resume source " + s.name }, "Accept (resume)");
        btn.addEventListener("click", () => act_(s.name, "resume", btn));
        cells.push(el("td", {}, btn));
      }
      rows.push(el("tr", { "data-source": s.name, "data-table": h.table }, ...cells));
    }
  }
  if (!rows.length) {
    box.append(el("p", { class: "muted" }, "No table is held by a schema change."));
    return;
  }
  const head = ["Source", "Table", "Version", "Policy", "Held since", "Dead-lettered", "Why"];
  if (state.actions) head.push("");
  box.append(el("table", { id: "held-tables" },
    el("thead", {}, el("tr", {}, ...head.map(h => el("th", { scope: "col" }, h)))),
    el("tbody", {}, ...rows)));
}

function renderSinks(sinks) {
  const tb = document.querySelector("#sinks tbody");
  tb.replaceChildren();
  for (const k of sinks) {
    const lat = k.latency;
    let latCell = el("td", {}, "–");
    if (lat && lat.count) {
      const p50 = quantile(lat, 0.5), p99 = quantile(lat, 0.99);
      latCell = el("td", {}, histogram(lat, "publish latency of sink " + k.name + ": " + lat.count + " batches"),
        el("div", { class: "muted" }, "p50 ≤ " + secs(p50) + ", p99 ≤ " + secs(p99) + ", " + num(lat.count) + " batches"));
    }
    tb.append(el("tr", { "data-sink": k.name, "data-source": k.source },
      el("td", {}, k.name), el("td", {}, k.source), el("td", { "data-field": "delivered" }, num(k.delivered)),
      el("td", { "data-field": "write_errors" }, num(k.write_errors)),
      el("td", { "data-field": "dead_letters" }, k.dead_letters === undefined ? "–" : num(k.dead_letters)), latCell));
  }
}

async function refresh() {
  let o;
  try {
    o = await api("api/overview");
  } catch (e) {
    problem("Reading the bridge: " + e.message);
    loadProblem = true;
    return;
  }
  if (loadProblem) { problem(""); loadProblem = false; }
  state.actions = o.actions;
  document.getElementById("bridge-name").textContent = o.bridge;
  document.getElementById("identity").textContent = "instance " + o.instance + " · " + (o.version || "") + " · configuration " + o.config_rev + " (" + o.config_from + ")";
  renderSources(o.sources, o.interval_seconds);
  renderHeld(o.sources);
  renderSnapshots(o.sources);
  renderSinks(o.sinks);
  document.getElementById("tail-start").disabled = !o.tail;
  if (!o.tail) document.getElementById("tail-status").textContent = "No live tail: the bridge writes no JetStream stream the console can read.";
}

// The live tail: the feeds SSE API read with fetch, so that the token
// travels in the Authorization header, as every listener accepts it, and
// never in the URL (EventSource cannot set headers). It reconnects as
// EventSource does, with the last event id, until stopped.
let tail = null; // {ctrl, lastId, stopped}
function stopTail(msg) {
  if (tail) { tail.stopped = true; tail.ctrl.abort(); tail = null; }
  document.getElementById("tail-status").textContent = msg || "Not following.";
}
function refusal(body, r) {
  return body && (body.detail || body.error) ? (body.error + (body.detail ? ": " + body.detail : "")) : r.status + " " + r.statusText;
}
function showChanges(data) {
  const b = JSON.parse(data);
  const tb = document.querySelector("#tail tbody");
  for (const c of b.changes) {
    const row = c.after || c.before || c.key || {};
    tb.prepend(el("tr", { "data-op": c.op, "data-table": c.table },
      el("td", {}, c.seq), el("td", {}, c.op + (c.moved ? " (moved " + c.moved + ")" : "")), el("td", {}, c.table),
      el("td", {}, c.commit_lsn || ""), el("td", { class: "row" }, JSON.stringify(row))));
  }
  while (tb.children.length > TAIL_MAX) tb.lastElementChild.remove();
}
// dispatch handles one event of the stream; false ends the tail.
function dispatch(t, ev) {
  if (!ev.data.length) return true; // a keep-alive: its id was kept
  const data = ev.data.join("\n");
  switch (ev.event) {
    case "changes": showChanges(data); return true;
    case "must-refetch": stopTail("The feed must be restarted: " + data); return false;
    case "error": stopTail("The feed ended: " + data); return false;
  }
  return true;
}
async function follow(t, q, following) {
  const status = document.getElementById("tail-status");
  while (!t.stopped) {
    const headers = { Accept: "text/event-stream" };
    if (token()) headers["Authorization"] = "Bearer " + token();
    if (t.lastId) headers["Last-Event-ID"] = t.lastId;
    let r;
    try {
      r = await fetch("api/v1/feed?" + q, { headers, signal: t.ctrl.signal, cache: "no-store" });
    } catch (e) {
      if (t.stopped) return;
      status.textContent = "Reconnecting…";
      await new Promise(res => setTimeout(res, 1000));
      continue;
    }
    if (!r.ok) {
      let body = null;
      try { body = await r.json(); } catch (e) { body = null; }
      if (!t.stopped) stopTail("The feed was refused: " + refusal(body, r));
      return;
    }
    status.textContent = following;
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "", ev = { event: "", data: [] };
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          let line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (line.endsWith("\r")) line = line.slice(0, -1);
          if (line === "") {
            if (!dispatch(t, ev)) return;
            ev = { event: "", data: [] };
            continue;
          }
          if (line.startsWith(":")) continue;
          const c = line.indexOf(":");
          const field = c < 0 ? line : line.slice(0, c);
          let val = c < 0 ? "" : line.slice(c + 1);
          if (val.startsWith(" ")) val = val.slice(1);
          if (field === "event") ev.event = val;
          else if (field === "data") ev.data.push(val);
          else if (field === "id") t.lastId = val;
        }
      }
    } catch (e) {
      if (t.stopped) return;
    }
    if (t.stopped) return;
    status.textContent = "Reconnecting…";
    await new Promise(res => setTimeout(res, 1000));
  }
}
function startTail(ev) {
  if (ev) ev.preventDefault();
  stopTail();
  const q = new URLSearchParams({ sse: "1", token: "now" });
  const tables = document.getElementById("tail-tables").value.trim();
  const op = document.getElementById("tail-op").value;
  const where = document.getElementById("tail-where").value.trim();
  if (tables) q.set("tables", tables.split(",").map(t => t.trim()).filter(Boolean).map(t => t.includes(".") ? t : "public." + t).join(","));
  if (op) q.set("ops", op);
  if (where) q.set("where", where);
  document.querySelector("#tail tbody").replaceChildren();
  document.getElementById("tail-status").textContent = "Connecting…";
  tail = { ctrl: new AbortController(), lastId: "", stopped: false };
  follow(tail, q.toString(), "Following" + (tables || op || where ? " (filtered)" : "") + ".");
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("token").value = token();
  document.getElementById("token-form").addEventListener("submit", e => {
    e.preventDefault();
    sessionStorage.setItem("bridge-token", document.getElementById("token").value.trim());
    refresh();
  });
  document.getElementById("tail-form").addEventListener("submit", startTail);
  document.getElementById("tail-stop").addEventListener("click", () => stopTail());
  refresh();
  setInterval(refresh, POLL_MS);
});
