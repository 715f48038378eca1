// FiloPy's web console: reads the REST API of the server that serves it (same origin, read
// only). The shard grid follows the dataset's SSE event stream, so it changes without a reload.
"use strict";

const $ = (sel) => document.querySelector(sel);
// One table for the grid's cells and the legend, so they cannot disagree. Colours from the
// Okabe-Ito palette (told apart with the common colour-vision deficiencies), each with a letter
// too: the letters `filopy status` prints.
const STATUS = {
  Active: { letter: "A", bg: "#009E73", ink: "#000" },
  Recovery: { letter: "R", bg: "#56B4E9", ink: "#000" },
  Assigned: { letter: "N", bg: "#F0E442", ink: "#000" },
  Degraded: { letter: "!", bg: "#E69F00", ink: "#000" },
  Handoff: { letter: "H", bg: "#0072B2", ink: "#fff" },
  Down: { letter: "D", bg: "#D55E00", ink: "#000" },
  Error: { letter: "E", bg: "#CC79A7", ink: "#000" },
  Stopped: { letter: "S", bg: "#4d4d4d", ink: "#fff" },
  Unassigned: { letter: ".", bg: "#e4e7eb", ink: "#1d232a" },
};
const looks = (status) => STATUS[status] || STATUS.Unassigned;
const state = {
  ds: null, shards: [], source: null, names: {}, members: [], events: [],
  counters: null, stats: {}, rates: {},
};
const nameOf = (id) => (id ? state.names[id] || id.slice(0, 12) : "-");

// The API wants a token (docs/security.md): the page keeps the one typed into the login form in
// a cookie, which the browser sends with every read, the event stream's too (an EventSource
// cannot send a header). Without one, or with one refused, the form shows.
const TOKEN_COOKIE = "filopy_token";

function askForToken(message) {
  $("#login").hidden = false;
  $("#login-error").textContent = message;
  $("#live").textContent = "no token";
  $("#live").className = "badge off";
}

function useToken(event) {
  event.preventDefault();
  const token = $("#token").value.trim();
  if (!token) return;
  document.cookie = `${TOKEN_COOKIE}=${token}; path=/; SameSite=Strict`;
  $("#token").value = "";
  $("#login").hidden = true;
  loadDatasets().catch((e) => { $("#grid").textContent = `cannot reach the cluster: ${e.message}`; });
}

const tokenInUse = () =>
  document.cookie.split("; ").find((c) => c.startsWith(`${TOKEN_COOKIE}=`)) || "";

async function api(path) {
  const token = tokenInUse();
  const resp = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await resp.json().catch(() => ({}));
  // A refusal of a request sent with an earlier token (a poll under way while the user typed a
  // new one) says nothing of the token now in use.
  const current = tokenInUse() === token;
  if ((resp.status === 401 || resp.status === 403) && current) askForToken(body.error || resp.statusText);
  if (!resp.ok || body.status === "error") {
    throw new Error(body.error || `${resp.status} ${resp.statusText}`);
  }
  return body.data;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

const kind = (status) => (status || "Unassigned").split("(")[0];
// A status names nodes by Ray id (Handoff(<56 hex digits>)): shown by name.
const statusText = (status) => (status || "").replace(/\b[0-9a-f]{56}\b/g, nameOf);

// ----- shards ------------------------------------------------------------------------------

function renderGrid() {
  const grid = $("#grid");
  grid.replaceChildren(...state.shards.map((s) => {
    const owner = s.node ? `${s.node} (${s.address})` : "no owner";
    const { letter, bg, ink } = looks(kind(s.status));
    return el("div", {
      class: "shard", role: "gridcell", style: `background: ${bg}; color: ${ink}`, "data-shard": s.shard,
      "data-status": kind(s.status), "data-node": s.node || "",
      title: `shard ${s.shard}: ${statusText(s.status)} — ${owner}`,
    }, el("span", { class: "letter" }, letter), el("span", { class: "num" }, s.shard));
  }));
  const counts = {};
  for (const s of state.shards) counts[kind(s.status)] = (counts[kind(s.status)] || 0) + 1;
  $("#shard-summary").textContent = Object.entries(counts).map(([k, n]) => `${n} ${k}`).join(", ");
}

function renderLegend() {
  $("#legend").replaceChildren(...Object.entries(STATUS).map(([status, { letter, bg, ink }]) =>
    el("span", { "data-status": status },
      el("i", { class: "letter", style: `background: ${bg}; color: ${ink}` }, letter), status)));
}

let statusTimer = null;
function refetchStatusSoon() {
  // An event carries the shard's new status; owners are read back from the map once the burst ends.
  clearTimeout(statusTimer);
  statusTimer = setTimeout(async () => {
    try { state.shards = await api(`/api/v1/cluster/${encodeURIComponent(state.ds)}/status`); renderGrid(); } catch (e) { /* the stream says */ }
    await refreshNodes().catch(() => {});  // names first: the history shows them
    refreshPlanAndHistory().catch(() => {});
  }, 300);
}

function follow(ds) {
  if (state.source) state.source.close();
  const source = new EventSource(`/api/v1/cluster/${encodeURIComponent(ds)}/events`);
  state.source = source;
  const live = $("#live");
  source.addEventListener("open", () => { live.textContent = "live"; live.className = "badge on"; });
  source.addEventListener("error", () => { live.textContent = "reconnecting…"; live.className = "badge off"; });
  source.addEventListener("snapshot", (msg) => {
    state.shards = JSON.parse(msg.data).shards;
    renderGrid();
  });
  source.addEventListener("shard_event", (msg) => {
    const ev = JSON.parse(msg.data);
    const shard = state.shards[ev.shard];
    if (shard && ev.status) {
      shard.status = ev.status;
      // The event's node owns the shard while it is owned (a handoff's source until the target
      // takes over), so the nodes table counts right before the map is read back.
      const owned = ["Assigned", "Active", "Recovery", "Degraded", "Handoff"].includes(kind(ev.status));
      shard.node = owned ? ev.node : "";
      shard.address = owned ? ev.address : "";
      renderGrid();
      renderNodes();
    }
    addEvent(ev);
    // Shards go Down when their node leaves: read the members now, not after the burst.
    // A node this page has not named yet (a handoff's target that just joined): read names.
    const unnamed = [...(ev.status || "").matchAll(/[0-9a-f]{56}/g)].some((m) => !state.names[m[0]]);
    if (ev.event === "ShardDown" || unnamed) refreshNodes().catch(() => {});
    refetchStatusSoon();
  });
  source.addEventListener("dataset_removed", () => { source.close(); loadDatasets().catch(() => {}); });
}

function addEvent(ev) {
  state.events.unshift({ when: new Date().toISOString().slice(11, 19), ...ev });
  state.events.length = Math.min(state.events.length, 50);
  renderEvents();
}

function renderEvents() {
  // Rendered from the events kept, so a node named after its event still shows by name.
  $("#events").replaceChildren(...state.events.map((ev) => el("li", { class: `e-${ev.event}` },
    `${ev.when}  shard ${ev.shard}  ${ev.event}  ${statusText(ev.node) || "-"}${ev.status ? "  → " + statusText(ev.status) : ""}`)));
}

// ----- nodes -------------------------------------------------------------------------------

function parseMetrics(text) {
  // Per node: sums of the per-shard series the nodes export (Prometheus text format); how far
  // behind in seconds is its slowest shard's.
  const out = {};
  const line = /^(filopy_ingested_samples_total|filopy_consumer_lag_offsets|filopy_consumer_lag_seconds|filopy_memstore_samples)\{([^}]*)\} (\S+)$/;
  for (const row of text.split("\n")) {
    const m = line.exec(row);
    if (!m) continue;
    const labels = Object.fromEntries([...m[2].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((x) => [x[1], x[2]]));
    if (labels.dataset !== state.ds) continue;
    const n = (out[labels.node] ||= { samples: 0, lag: 0, behind: 0, memory: 0 });
    const v = Number(m[3]);
    if (m[1] === "filopy_ingested_samples_total") n.samples += v;
    else if (m[1] === "filopy_consumer_lag_offsets") n.lag += v;
    else if (m[1] === "filopy_consumer_lag_seconds") n.behind = Math.max(n.behind, v);
    else n.memory += v;
  }
  return out;
}

function renderNodes() {
  // Shards per node from the grid, which follows the event stream: a node whose shards just
  // went Down shows none at once, before the next read of the members drops it.
  const shardsOf = {};
  for (const s of state.shards) if (s.node) shardsOf[s.node] = (shardsOf[s.node] || 0) + 1;
  const fmt = (x) => (x === undefined || Number.isNaN(x) ? "–" : Math.round(x).toLocaleString("en"));
  $("#nodes tbody").replaceChildren(...state.members.map((n) => {
    const shards = shardsOf[n.name] || 0;
    const st = (shards && state.stats[n.name]) || {};
    return el("tr", { "data-node": n.name },
      el("td", { title: n.address }, n.name), el("td", {}, n.version),
      el("td", { class: "num" }, shards), el("td", { class: "num" }, fmt(shards ? state.rates[n.name] : undefined)),
      el("td", { class: "num" }, fmt(st.lag)), el("td", { class: "num" }, fmt(st.behind)),
      el("td", { class: "num" }, fmt(st.memory)));
  }));
}

function noteMetrics(text) {
  const now = performance.now() / 1000;
  state.stats = parseMetrics(text);
  // Rates over at least a second: the table is also read right after events.
  const prev = state.counters;
  if (prev && now - prev.at < 1) return;
  state.counters = { at: now, stats: state.stats };
  state.rates = {};
  if (!prev) return;
  for (const [node, st] of Object.entries(state.stats)) {
    if (prev.stats[node]) state.rates[node] = Math.max(0, st.samples - prev.stats[node].samples) / (now - prev.at);
  }
}

async function readNodes() {
  const metrics = fetch("/metrics").then((r) => r.text()).then(noteMetrics).catch(() => {});
  const nodes = await api("/api/v1/nodes");
  state.members = nodes.members;
  // Kept for nodes that left: the history still names them.
  Object.assign(state.names, Object.fromEntries(nodes.members.map((n) => [n.address, n.name])));
  renderNodes();
  renderEvents();  // names learnt since
  const refused = Object.entries(nodes.refused).map(([id, why]) => `refused ${id}: ${why}`);
  $("#refused").textContent = refused.join("\n");
  await metrics;  // the members are shown without waiting for a scrape of every node
  renderNodes();
}

// One read at a time, and one more if asked meanwhile: an older answer never overwrites a newer.
let nodesRead = null, nodesAgain = false;
function refreshNodes() {
  if (nodesRead) { nodesAgain = true; return nodesRead; }
  nodesRead = (async () => {
    try {
      do { nodesAgain = false; await readNodes(); } while (nodesAgain);
    } finally { nodesRead = null; }
  })();
  return nodesRead;
}

// ----- plan and history --------------------------------------------------------------------

async function refreshPlanAndHistory() {
  const ds = encodeURIComponent(state.ds);
  const [plan, history] = await Promise.all([
    api(`/api/v1/cluster/${ds}/plan`).catch((e) => ({ error: e.message })),
    api(`/api/v1/cluster/${ds}/history?limit=60`).catch(() => []),
  ]);
  const box = $("#plan");
  const why = plan.held_back ? ` (${plan.held_back})` : "";
  if (plan.error) box.textContent = `Plan: ${plan.error}`;
  else if (!plan.moves.length) box.textContent = `Plan: no moves planned${why}`;
  else {
    const more = plan.held_back ? ` (no more: ${plan.held_back})` : "";
    box.replaceChildren(el("span", {}, `Plan: ${plan.moves.length} moves would start${more}:`),
      el("ul", {}, ...plan.moves.map((m) => el("li", {}, `shard ${m.shard}: ${nameOf(m.source)} → ${nameOf(m.target)}`))));
  }
  $("#history tbody").replaceChildren(...takeovers(history).slice(0, 25).map((h) => el("tr", {},
    el("td", {}, new Date(h.at_ms).toISOString().replace("T", " ").slice(0, 19)),
    el("td", { class: "num" }, h.shard), el("td", {}, nameOf(h.source)), el("td", {}, nameOf(h.target)),
    el("td", { title: h.reason }, reasonText(h)), el("td", { class: "num" }, h.epoch ?? "-"),
    el("td", { class: "num" }, h.replayed_offsets ?? "-"))));
}

function takeovers(history) {
  // The coordinator records a failover as two changes of one instant and one reason: the
  // owner leaving (X → none), then the new owner taking over (none → Y). Shown as one row X → Y.
  const rows = [], merged = new Set();
  history.forEach((h, i) => {  // newest first
    if (merged.has(i)) return;
    const j = history.findIndex((o, k) => k > i && o.shard === h.shard);
    const left = history[j];
    if (!h.source && h.target && left && left.source && !left.target && left.reason === h.reason
        && h.at_ms - left.at_ms < 60000) {
      merged.add(j);
      rows.push({ ...h, source: left.source, at_ms: left.at_ms });
    } else rows.push(h);
  });
  return rows;
}

function reasonText(h) {
  // "left (its node died)" as "failover: node-2 left (its node died)": who, by name, and why.
  const m = /^(left|failed) \((.*)\)$/.exec(h.reason || "");
  if (!m || !h.source) return h.reason;
  return `failover: ${nameOf(h.source)} ${m[1]} (${m[2]})`;
}

// ----- storage -----------------------------------------------------------------------------

function fmtDuration(ms) {
  // As operators write retentions (30d, 12h, 90m): the largest unit that divides it.
  if (!ms) return "forever";
  for (const [unit, size] of [["y", 31536000000], ["w", 604800000], ["d", 86400000], ["h", 3600000], ["m", 60000], ["s", 1000]]) {
    if (ms % size === 0) return `${ms / size}${unit}`;
  }
  return `${ms}ms`;
}

function fmtBytes(n) {
  // Binary units, 3 significant digits; the exact count shows on hover.
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0, v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i ? `${Number(v.toPrecision(3))} ${units[i]}` : `${n} B`;
}

async function refreshStorage() {
  // The retention in force and bytes stored: raw chunks, then each downsampled resolution.
  const ds = state.ds;
  const info = await api(`/api/v1/datasets/${encodeURIComponent(ds)}/retention`);
  if (ds !== state.ds) return;  // another dataset was picked meanwhile
  const whose = info.own_retention_ms === null ? "cluster default" : "dataset's own";
  const row = (data, what, retention, bytes, note) => el("tr", { "data-data": data, "data-bytes": bytes, "data-retention-ms": retention },
    el("td", {}, what), el("td", { title: note }, `${fmtDuration(retention)} (${note})`),
    el("td", { class: "num", title: `${bytes.toLocaleString("en")} bytes` }, fmtBytes(bytes)));
  const raw = row("raw", "raw samples", info.retention_ms, info.bytes, whose);
  const limit = info.max_bytes === null ? [] : [el("span", { class: "limit" }, ` at most ${fmtBytes(info.max_bytes)}`)];
  raw.cells[2].append(...limit);
  const resolutions = Object.entries(info.downsampled || {}).sort((a, b) => Number(a[0]) - Number(b[0]));
  $("#storage tbody").replaceChildren(raw, ...resolutions.map(([res, d]) =>
    row(res, `downsampled, ${fmtDuration(Number(res))}`, d.retention_ms, d.bytes, "[downsample] retention_days")));
  const sweep = info.sweep || {};
  $("#sweep").textContent = sweep.last_ms
    ? `last sweep ${new Date(sweep.last_ms).toISOString().slice(11, 19)} UTC: ${fmtBytes(sweep.bytes_freed || 0)} freed in all${sweep.last_error ? `; failing: ${sweep.last_error}` : ""}`
    : "";
}

// ----- query -------------------------------------------------------------------------------

function labelText(metric) {
  const name = metric.__name__ || "";
  const rest = Object.entries(metric).filter(([k]) => k !== "__name__").map(([k, v]) => `${k}="${v}"`);
  return rest.length ? `${name}{${rest.join(", ")}}` : name || "{}";
}

function fmtValue(text) {
  // Up to 6 significant digits (56.94166666666666 → 56.9417); the exact value shows on hover.
  const v = Number(text);
  if (!Number.isFinite(v) || Number.isInteger(v)) return String(text);
  if (Math.abs(v) >= 1e6) return v.toFixed(0);
  return String(Number(v.toPrecision(6)));
}

function renderResult(data) {
  const head = $("#result thead"), body = $("#result tbody");
  $("#chart-box").hidden = true;  // an instant query must not leave the last range's chart
  state.chart = null;
  const value = (text) => el("td", { class: "num", title: text }, fmtValue(text));
  if (data.resultType === "scalar" || data.resultType === "string") {
    head.replaceChildren(el("tr", {}, el("th", { class: "num" }, "value")));
    body.replaceChildren(el("tr", {}, value(data.result[1])));
    return;
  }
  const rows = data.result.map((r) => {
    const last = r.value || r.values[r.values.length - 1];
    return el("tr", {}, el("td", {}, labelText(r.metric)), last ? value(last[1]) : el("td", {}));
  });
  head.replaceChildren(el("tr", {}, el("th", {}, "series"), el("th", { class: "num" }, data.resultType === "matrix" ? "last value" : "value")));
  body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 2 }, "no data"))]));
  if (data.resultType === "matrix" && data.result.length) {
    state.chart = data.result;
    drawChart(data.result);
  }
}

// Series colours: Okabe-Ito again (the yellow left out: unreadable on white).
const SERIES_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"];
const MAX_SERIES = 30;

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function niceTicks(lo, hi, count) {
  // Round steps (1, 2 or 5 times a power of ten) covering [lo, hi] with about `count` ticks.
  if (lo === hi) { const pad = Math.abs(lo) * 0.1 || 1; lo -= pad; hi += pad; }
  const raw = (hi - lo) / count, mag = 10 ** Math.floor(Math.log10(raw)), r = raw / mag;
  const step = mag * (r >= 5 ? 10 : r >= 2 ? 5 : r >= 1 ? 2 : 1);
  const first = Math.floor(lo / step) * step, last = Math.ceil(hi / step) * step;
  const ticks = [];
  for (let v = first; v <= last + step / 2; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

function timeTicks(t0, t1) {
  // Ticks on whole minutes or hours (UTC, as the history), at most about 8.
  const steps = [60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
  const step = steps.find((s) => (t1 - t0) / s <= 8) || 86400;
  const ticks = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) ticks.push(t);
  return ticks;
}

function drawChart(series) {
  const box = $("#chart-box"), chart = $("#chart");
  box.hidden = false;  // first, so the chart can be measured
  const drawn = series.slice(0, MAX_SERIES);
  const pts = drawn.flatMap((s) => s.values.map(([t, v]) => [t, Number(v)])).filter(([, v]) => Number.isFinite(v));
  const W = Math.max(300, chart.clientWidth), H = 240;
  chart.setAttribute("viewBox", `0 0 ${W} ${H}`);
  if (!pts.length) { chart.replaceChildren(); $("#chart-legend").replaceChildren(); return; }
  const t0 = Math.min(...pts.map((p) => p[0])), t1 = Math.max(...pts.map((p) => p[0]));
  const yTicks = niceTicks(Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1])), 5);
  const v0 = yTicks[0], v1 = yTicks[yTicks.length - 1];
  const yLabel = (v) => String(Number(v.toPrecision(6)));
  const left = 12 + 7 * Math.max(...yTicks.map((v) => yLabel(v).length)), right = 14, top = 10, bottom = 24;
  const x = (t) => (t1 === t0 ? (left + W - right) / 2 : left + ((t - t0) / (t1 - t0)) * (W - left - right));
  const y = (v) => top + (1 - (v - v0) / (v1 - v0)) * (H - top - bottom);
  const hhmm = (t) => new Date(t * 1000).toISOString().slice(11, 16);
  const yAxis = svg("g", { class: "y-axis" }, ...yTicks.map((v) => svg("g", {},
    svg("line", { x1: left, x2: W - right, y1: y(v), y2: y(v), class: "grid" }),
    svg("text", { x: left - 6, y: y(v), "text-anchor": "end", "dominant-baseline": "middle" }, yLabel(v)))));
  const xAxis = svg("g", { class: "x-axis" },
    svg("line", { x1: left, x2: W - right, y1: H - bottom, y2: H - bottom, class: "axis" }),
    ...timeTicks(t0, t1).map((t) => svg("g", {},
      svg("line", { x1: x(t), x2: x(t), y1: H - bottom, y2: H - bottom + 4, class: "axis" }),
      svg("text", { x: x(t), y: H - 6, "text-anchor": "middle" }, hhmm(t)))));
  const lines = drawn.map((s, i) => {
    const colour = SERIES_COLOURS[i % SERIES_COLOURS.length];
    const points = s.values.filter(([, v]) => Number.isFinite(Number(v)))
      .map(([t, v]) => `${x(t).toFixed(1)},${y(Number(v)).toFixed(1)}`);
    const line = svg("polyline", { points: points.join(" "), style: `stroke: ${colour}` }, svg("title", {}, labelText(s.metric)));
    // A series of one point is a dot.
    return points.length === 1 ? svg("g", {}, line, svg("circle", { cx: points[0].split(",")[0], cy: points[0].split(",")[1], r: 2.5, fill: colour })) : line;
  });
  chart.replaceChildren(yAxis, xAxis, svg("text", { x: W - right, y: H - 6, "text-anchor": "end", class: "unit" }, "UTC"), ...lines);
  const keys = drawn.map((s, i) => el("li", {},
    el("i", { style: `background: ${SERIES_COLOURS[i % SERIES_COLOURS.length]}` }), labelText(s.metric)));
  if (series.length > drawn.length) keys.push(el("li", { class: "more" }, `${series.length - drawn.length} more series not drawn`));
  $("#chart-legend").replaceChildren(...keys);
}

async function runQuery(event) {
  event.preventDefault();
  const query = $("#query").value.trim();
  if (!query || !state.ds) return;
  const range = Number($("#range").value);
  const atText = $("#at").value.trim();
  const at = atText ? (/^\d+(\.\d+)?$/.test(atText) ? Number(atText) : Date.parse(atText) / 1000) : Date.now() / 1000;
  const params = new URLSearchParams({ query });
  let path = `/promql/${encodeURIComponent(state.ds)}/api/v1/`;
  if (range) {
    params.set("start", String(at - range)); params.set("end", String(at));
    params.set("step", String(Math.max(1, Math.round(range / 240))));
    path += "query_range";
  } else {
    params.set("time", String(at));
    path += "query";
  }
  $("#query-error").textContent = "";
  try {
    renderResult(await api(`${path}?${params}`));
  } catch (e) {
    $("#query-error").textContent = e.message;
    $("#result thead").replaceChildren();
    $("#result tbody").replaceChildren();
    $("#chart-box").hidden = true;
    state.chart = null;
  }
}

// ----- datasets ----------------------------------------------------------------------------

async function select(ds) {
  state.ds = ds;
  state.counters = null;
  state.events = [];
  renderEvents();
  history.replaceState(null, "", `#${encodeURIComponent(ds)}`);
  state.shards = await api(`/api/v1/cluster/${encodeURIComponent(ds)}/status`);
  renderGrid();
  follow(ds);
  await refreshNodes().catch(() => {});
  refreshStorage().catch((e) => { $("#sweep").textContent = `storage: ${e.message}`; });
  await refreshPlanAndHistory();
}

async function loadDatasets() {
  // Polled, as nodes are: a dataset created (or removed) after the page opened shows up.
  const names = await api("/api/v1/cluster");
  const picker = $("#dataset");
  const listed = [...picker.options].map((o) => o.value);
  if (names.join("\n") !== listed.join("\n")) {
    picker.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  }
  if (!names.length) {
    if (state.source) state.source.close();
    state.ds = null;
    state.shards = [];
    $("#grid").textContent = "no datasets yet";
    $("#shard-summary").textContent = "";
    $("#live").textContent = "no dataset";
    $("#live").className = "badge";
    return;
  }
  if (names.includes(state.ds)) { picker.value = state.ds; return; }
  const wanted = decodeURIComponent(location.hash.slice(1));
  picker.value = names.includes(wanted) ? wanted : names[0];
  await select(picker.value);
}

renderLegend();
$("#dataset").addEventListener("change", (e) => select(e.target.value));
$("#query-form").addEventListener("submit", runQuery);
$("#login").addEventListener("submit", useToken);
setInterval(() => { if (state.ds) refreshNodes().catch(() => {}); }, 3000);
setInterval(() => { if (state.ds) refreshPlanAndHistory().catch(() => {}); }, 10000);
setInterval(() => { if (state.ds) refreshStorage().catch(() => {}); }, 5000);
setInterval(() => loadDatasets().catch(() => {}), 3000);
window.addEventListener("resize", () => { if (state.chart) drawChart(state.chart); });
loadDatasets().catch((e) => { $("#grid").textContent = `cannot reach the cluster: ${e.message}`; });
