// FiloPy's web console: reads the REST API of the server that serves it (same origin, read
// only). The shard grid follows the dataset's SSE event stream, so it changes without a reload.
"use strict";

const $ = (sel) => document.querySelector(sel);
const STATUSES = ["Active", "Recovery", "Assigned", "Degraded", "Handoff", "Down", "Error", "Stopped", "Unassigned"];
const state = { ds: null, shards: [], source: null, counters: null, names: {} };
const nameOf = (id) => (id ? state.names[id] || id.slice(0, 12) : "-");

async function api(path) {
  const resp = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await resp.json().catch(() => ({}));
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

// ----- shards ------------------------------------------------------------------------------

function renderGrid() {
  const grid = $("#grid");
  grid.replaceChildren(...state.shards.map((s) => {
    const owner = s.node ? `${s.node} (${s.address})` : "no owner";
    return el("div", {
      class: `shard s-${kind(s.status)}`, role: "gridcell", "data-shard": s.shard,
      "data-status": kind(s.status), "data-node": s.node || "", title: `shard ${s.shard}: ${s.status} — ${owner}`,
    }, s.shard);
  }));
  const counts = {};
  for (const s of state.shards) counts[kind(s.status)] = (counts[kind(s.status)] || 0) + 1;
  $("#shard-summary").textContent = Object.entries(counts).map(([k, n]) => `${n} ${k}`).join(", ");
}

function renderLegend() {
  $("#legend").replaceChildren(...STATUSES.map((s) => el("span", {}, el("i", { class: `s-${s}` }), s)));
}

let statusTimer = null;
function refetchStatusSoon() {
  // An event carries the shard's new status; owners are read back from the map once the burst ends.
  clearTimeout(statusTimer);
  statusTimer = setTimeout(async () => {
    try { state.shards = await api(`/api/v1/cluster/${state.ds}/status`); renderGrid(); } catch (e) { /* the stream says */ }
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
      if (["Down", "Stopped", "Unassigned"].includes(kind(ev.status))) { shard.node = ""; shard.address = ""; }
      renderGrid();
    }
    addEvent(ev);
    refetchStatusSoon();
  });
  source.addEventListener("dataset_removed", () => { source.close(); loadDatasets(); });
}

function addEvent(ev) {
  const when = new Date().toISOString().slice(11, 19);
  const text = `${when}  shard ${ev.shard}  ${ev.event}  ${ev.node || "-"}${ev.status ? "  → " + ev.status : ""}`;
  const list = $("#events");
  list.prepend(el("li", { class: `e-${ev.event}` }, text));
  while (list.children.length > 50) list.lastChild.remove();
}

// ----- nodes -------------------------------------------------------------------------------

function parseMetrics(text) {
  // Per node: sums of the per-shard series the nodes export (Prometheus text format).
  const out = {};
  const line = /^(filopy_ingested_samples_total|filopy_consumer_lag_offsets|filopy_memstore_samples)\{([^}]*)\} (\S+)$/;
  for (const row of text.split("\n")) {
    const m = line.exec(row);
    if (!m) continue;
    const labels = Object.fromEntries([...m[2].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((x) => [x[1], x[2]]));
    if (labels.dataset !== state.ds) continue;
    const n = (out[labels.node] ||= { samples: 0, lag: 0, memory: 0 });
    const v = Number(m[3]);
    if (m[1] === "filopy_ingested_samples_total") n.samples += v;
    else if (m[1] === "filopy_consumer_lag_offsets") n.lag += v;
    else n.memory += v;
  }
  return out;
}

async function refreshNodes() {
  const [nodes, text] = await Promise.all([api("/api/v1/nodes"), fetch("/metrics").then((r) => r.text())]);
  // Kept for nodes that left: the history still names them.
  Object.assign(state.names, Object.fromEntries(nodes.members.map((n) => [n.address, n.name])));
  const now = performance.now() / 1000;
  const stats = parseMetrics(text);
  const prev = state.counters;
  state.counters = { at: now, stats };
  const shardsOf = {};
  for (const s of state.shards) if (s.node) shardsOf[s.node] = (shardsOf[s.node] || 0) + 1;
  const fmt = (x) => (x === undefined || Number.isNaN(x) ? "–" : Math.round(x).toLocaleString("en"));
  $("#nodes tbody").replaceChildren(...nodes.members.map((n) => {
    const st = stats[n.name] || {};
    let rate;
    if (prev && prev.stats[n.name] && st.samples !== undefined) {
      rate = Math.max(0, st.samples - prev.stats[n.name].samples) / Math.max(0.001, now - prev.at);
    }
    return el("tr", { "data-node": n.name },
      el("td", { title: n.address }, n.name), el("td", {}, n.version),
      el("td", { class: "num" }, shardsOf[n.name] || 0), el("td", { class: "num" }, fmt(rate)),
      el("td", { class: "num" }, fmt(st.lag)), el("td", { class: "num" }, fmt(st.memory)));
  }));
  const refused = Object.entries(nodes.refused).map(([id, why]) => `refused ${id}: ${why}`);
  $("#refused").textContent = refused.join("\n");
}

// ----- plan and history --------------------------------------------------------------------

async function refreshPlanAndHistory() {
  const ds = encodeURIComponent(state.ds);
  const [plan, history] = await Promise.all([
    api(`/api/v1/cluster/${ds}/plan`).catch((e) => ({ error: e.message })),
    api(`/api/v1/cluster/${ds}/history?limit=20`).catch(() => []),
  ]);
  const box = $("#plan");
  if (plan.error) box.textContent = plan.error;
  else if (!plan.moves.length) box.textContent = `no moves (${plan.held_back})`;
  else {
    box.replaceChildren(el("p", {}, `${plan.moves.length} moves would start (${plan.held_back}):`),
      el("ul", {}, ...plan.moves.map((m) => el("li", {}, `shard ${m.shard}: ${nameOf(m.source)} → ${nameOf(m.target)}`))));
  }
  $("#history tbody").replaceChildren(...history.map((h) => el("tr", {},
    el("td", {}, new Date(h.at_ms).toISOString().replace("T", " ").slice(0, 19)),
    el("td", { class: "num" }, h.shard), el("td", {}, nameOf(h.source)), el("td", {}, nameOf(h.target)),
    el("td", {}, h.reason), el("td", { class: "num" }, h.epoch ?? "-"),
    el("td", { class: "num" }, h.replayed_offsets ?? "-"))));
}

// ----- query -------------------------------------------------------------------------------

function labelText(metric) {
  const name = metric.__name__ || "";
  const rest = Object.entries(metric).filter(([k]) => k !== "__name__").map(([k, v]) => `${k}="${v}"`);
  return rest.length ? `${name}{${rest.join(", ")}}` : name || "{}";
}

function renderResult(data) {
  const head = $("#result thead"), body = $("#result tbody"), chart = $("#chart");
  chart.hidden = true;
  if (data.resultType === "scalar" || data.resultType === "string") {
    head.replaceChildren(el("tr", {}, el("th", {}, "value")));
    body.replaceChildren(el("tr", {}, el("td", { class: "num" }, data.result[1])));
    return;
  }
  const rows = data.result.map((r) => {
    const last = r.value || r.values[r.values.length - 1];
    return el("tr", {}, el("td", {}, labelText(r.metric)), el("td", { class: "num" }, last ? last[1] : ""));
  });
  head.replaceChildren(el("tr", {}, el("th", {}, "series"), el("th", { class: "num" }, data.resultType === "matrix" ? "last value" : "value")));
  body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 2 }, "no data"))]));
  if (data.resultType === "matrix" && data.result.length) drawChart(data.result);
}

function drawChart(series) {
  const chart = $("#chart");
  const pts = series.flatMap((s) => s.values.map(([t, v]) => [t, Number(v)])).filter(([, v]) => Number.isFinite(v));
  if (!pts.length) return;
  const [t0, t1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  const [v0, v1] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
  const x = (t) => (t1 === t0 ? 400 : ((t - t0) / (t1 - t0)) * 780 + 10);
  const y = (v) => (v1 === v0 ? 120 : 230 - ((v - v0) / (v1 - v0)) * 220);
  const colours = ["#3b7bd6", "#2e9d4a", "#d0383f", "#d7a21a", "#8e44ad", "#16a2b8"];
  chart.replaceChildren(...series.slice(0, 30).map((s, i) => {
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", s.values.map(([t, v]) => `${x(t).toFixed(1)},${y(Number(v)).toFixed(1)}`).join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", colours[i % colours.length]);
    line.setAttribute("stroke-width", "1.5");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
    title.textContent = labelText(s.metric);
    line.append(title);
    return line;
  }));
  chart.hidden = false;
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
    $("#chart").hidden = true;
  }
}

// ----- datasets ----------------------------------------------------------------------------

async function select(ds) {
  state.ds = ds;
  state.counters = null;
  $("#events").replaceChildren();
  history.replaceState(null, "", `#${encodeURIComponent(ds)}`);
  state.shards = await api(`/api/v1/cluster/${encodeURIComponent(ds)}/status`);
  renderGrid();
  follow(ds);
  await refreshNodes().catch(() => {});
  await refreshPlanAndHistory();
}

async function loadDatasets() {
  const names = await api("/api/v1/cluster");
  const picker = $("#dataset");
  picker.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  const wanted = decodeURIComponent(location.hash.slice(1));
  if (!names.length) { $("#grid").textContent = "no datasets yet"; return; }
  picker.value = names.includes(wanted) ? wanted : names[0];
  await select(picker.value);
}

renderLegend();
$("#dataset").addEventListener("change", (e) => select(e.target.value));
$("#query-form").addEventListener("submit", runQuery);
setInterval(() => { if (state.ds) refreshNodes().catch(() => {}); }, 3000);
setInterval(() => { if (state.ds) refreshPlanAndHistory().catch(() => {}); }, 10000);
loadDatasets().catch((e) => { $("#grid").textContent = `cannot reach the cluster: ${e.message}`; });
