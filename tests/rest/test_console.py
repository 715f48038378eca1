"""The web console in a real browser (headless Chromium, driven by Playwright) against a real
cluster ingesting from Kafka: the page opened before any dataset picks the dataset up once it is
created; the grid shows each shard's status by colour and letter, the legend matching; killing a
node turns its shards Down, then Active on the spare, on the open page (no reload), the node
leaving the nodes table at once and each takeover one history row; a range query renders a table
of rounded values and a chart with axes and legend, an instant query only its table; a drain's
handoffs name nodes, not Ray ids; the storage table shows the retention in force and the bytes
stored, raw and per downsampled resolution, as the retention route says; the browser reports no
error. Screenshots of each step go to
$FILOPY_SCREENSHOTS (docs/images/ refreshes them) or the test's temporary directory."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from playwright.sync_api import Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from coordinator.node_coordinator import NAME_LABEL
from core.config import DownsampleSettings
from filopy.rest.app import create_app
from tests.cluster import FiloPyCluster, cluster_settings, start_cluster
from tests.rest.conftest import ServerThread
from tests.waiting import wait_for

if TYPE_CHECKING:
    from coordinator.local_cluster import LocalRayCluster

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
STATUSES = {"Active", "Recovery", "Assigned", "Degraded", "Handoff", "Down", "Error", "Stopped"}
STATUSES |= {"Unassigned"}
WAIT_MS = 60_000  # generous: the machine may be busy; every wait ends on a condition
RAY_ID = re.compile(r"[0-9a-f]{56}")


@pytest.fixture
def console(
    tmp_path: Path, kafka_bootstrap: str, ray_cluster: LocalRayCluster
) -> Iterator[tuple[FiloPyCluster, str, dict]]:
    settings = cluster_settings(
        tmp_path, "kafka", flush_interval_s=1.0, kafka_bootstrap=kafka_bootstrap
    )
    # Downsampling at once (no delay), so the storage table shows its bytes.
    down = DownsampleSettings(resolutions_ms=[300_000, 3_600_000], delay_s=0.0, interval_s=1.0,
                              retention_days=[90.0, 730.0])  # fmt: skip
    settings = settings.model_copy(
        update={
            "downsample": down,
        }
    )
    cluster = start_cluster(ray_cluster, settings)
    handles = {
        name: cluster.add_node(labels={NAME_LABEL: name}) for name in ("ingest-a", "ingest-b")
    }
    cluster.wait_for("2 members", lambda: len(cluster.client.members()) == 2)
    with ServerThread(create_app(cluster.client, settings)) as url:
        yield cluster, url, handles
        cluster.client.queries().close()


# Installed before the kill; the observer runs right after each DOM change, so what it records
# is what a person saw at that moment: every status shard 0 shows, in order; the nodes table as
# it stood when the grid first showed none of the victim's shards on it (all Down); each
# (status, colour, letter) a cell ever showed.
WATCH = """(victim) => {
  window.shard0 = []; window.nodesAtDown = null; window.looks = new Set();
  const nodes = () => [...document.querySelectorAll('#nodes tbody tr')]
    .map(r => [...r.cells].map(c => c.textContent));
  const seen = () => {
    for (const c of document.querySelectorAll('#grid .shard')) {
      const letter = c.querySelector('.letter');
      window.looks.add(JSON.stringify([c.dataset.status, getComputedStyle(c).backgroundColor,
        letter ? letter.textContent : '']));
    }
    const c = document.querySelector('#grid .shard[data-shard="0"]');
    if (c && window.shard0[window.shard0.length - 1] !== c.dataset.status) {
      window.shard0.push(c.dataset.status);
    }
    const cells = [...document.querySelectorAll('#grid .shard')];
    if (!window.nodesAtDown && cells.length && !cells.some(c => c.dataset.node === victim)) {
      window.nodesAtDown = nodes();
    }
  };
  seen();
  new MutationObserver(seen).observe(document.querySelector('#grid'),
    {childList: true, subtree: true, attributes: true});
}"""
ALL_ACTIVE_ON = """[...document.querySelectorAll('#grid .shard')]
  .filter(c => c.dataset.status === 'Active' && c.dataset.node === '{node}').length === {n}"""
NODE_ROWS = "[...document.querySelectorAll('#nodes tbody tr')].map(r => r.dataset.node).sort()"
HISTORY = """[...document.querySelectorAll('#history tbody tr')]
  .map(r => [...r.cells].map(c => c.textContent))"""
LEGEND = """[...document.querySelectorAll('#legend [data-status]')].map(k => [k.dataset.status,
  getComputedStyle(k.querySelector('.letter')).backgroundColor,
  k.querySelector('.letter').textContent, k.textContent])"""
# Per row of the storage table: what it is about, exact bytes and retention, the cells' text.
STORAGE = """[...document.querySelectorAll('#storage tbody tr')].map(r => [r.dataset.data,
  Number(r.dataset.bytes), Number(r.dataset.retentionMs),
  ...[...r.cells].map(c => [c.textContent, c.title])])"""
NO_RATE = "\u2013"  # the en dash the nodes table shows for "nothing measured"
# Dark pixels inside an element's screenshot (its border left out): glyphs drawn there.
INK = """async (png) => {
  const img = new Image();
  img.src = 'data:image/png;base64,' + png;
  await img.decode();
  const canvas = document.createElement('canvas');
  canvas.width = img.width; canvas.height = img.height;
  const g = canvas.getContext('2d');
  g.drawImage(img, 0, 0);
  const px = g.getImageData(3, 3, img.width - 6, img.height - 6).data;
  let n = 0;
  for (let i = 0; i < px.length; i += 4) if (px[i] + px[i + 1] + px[i + 2] < 600) n++;
  return n;
}"""
# The room an input leaves for its placeholder, and the placeholder's width in the input's font.
PLACEHOLDER_FITS = """(sel) => {
  const input = document.querySelector(sel), cs = getComputedStyle(input);
  const g = document.createElement('canvas').getContext('2d');
  g.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
  const room = input.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  return [g.measureText(input.placeholder).width, room];
}"""
# Space left empty below the last visible child of the section holding `sel` (0 if hidden).
EMPTY_BELOW = """(sel) => {
  const section = document.querySelector(sel).closest('section');
  if (!section || !section.offsetParent) return 0;
  const shown = [...section.children].filter(c => c.getClientRects().length);
  const bottom = Math.max(...shown.map(c => c.getBoundingClientRect().bottom));
  return section.getBoundingClientRect().bottom - bottom;
}"""


# What the page shows, for a wait that ended at its deadline: which condition never held is not
# enough to tell a slow cluster from a page that stopped following it.
PAGE_STATE = """() => ({
  live: document.querySelector('#live')?.textContent,
  grid: [...document.querySelectorAll('#grid .shard')]
    .map(c => `${c.dataset.shard}:${c.dataset.status}@${c.dataset.node}`).join(' '),
  nodes: [...document.querySelectorAll('#nodes tbody tr')].map(r => r.dataset.node),
  plan: document.querySelector('#plan')?.textContent,
  events: [...document.querySelectorAll('#events li')].slice(0, 12).map(li => li.textContent),
  shard0: window.shard0,
  history: [...document.querySelectorAll('#history tbody tr')]
    .map(r => [...r.cells].map(c => c.textContent).join(' | ')),
})"""


def _wait(page: Page, condition: str) -> None:
    """Until `condition` (a JavaScript expression) holds on the page; at the deadline, an
    AssertionError naming the condition and what the page showed."""
    try:
        page.wait_for_function(condition, timeout=WAIT_MS)
    except PlaywrightTimeout:
        shown = json.dumps(page.evaluate(PAGE_STATE), indent=1)
        raise AssertionError(f"not within {WAIT_MS} ms: {condition}\nthe page: {shown}") from None


def _statuses(page: Page) -> dict[int, tuple[str, str]]:
    cells = page.query_selector_all("#grid .shard")
    return {
        int(c.get_attribute("data-shard")): (
            c.get_attribute("data-status"),
            c.get_attribute("data-node"),
        )
        for c in cells
    }


def _duration(ms: int) -> str:
    """A duration as operators write it (the console's way): the largest unit dividing it."""
    units = [("y", 31_536_000_000), ("w", 604_800_000), ("d", 86_400_000), ("h", 3_600_000)]
    units += [("m", 60_000), ("s", 1000)]
    if not ms:
        return "forever"
    return next((f"{ms // size}{u}" for u, size in units if ms % size == 0), f"{ms}ms")


def _ink(page: Page, selector: str) -> int:
    png = page.locator(selector).screenshot()
    return page.evaluate(INK, base64.b64encode(png).decode())


def _watch_problems(page: Page) -> list[str]:
    """Every error the browser reports: console errors, uncaught exceptions, failed requests,
    HTTP errors."""
    problems: list[str] = []
    page.on(
        "console",
        lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on(
        "requestfailed",
        lambda r: (
            problems.append(f"failed: {r.url} {r.failure}")
            if "/events" not in r.url  # the event stream is cut when the page closes
            else None
        ),
    )
    page.on(
        "response",
        lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None,
    )
    return problems


def _query(page: Page, query: str, range_s: str) -> None:
    page.fill("#query", query)
    page.select_option("#range", range_s)
    page.evaluate("document.querySelector('#result tbody').replaceChildren()")
    page.click("#query-form button")
    page.wait_for_selector("#result tbody tr td", timeout=WAIT_MS)


def test_the_console_follows_the_cluster_live_and_runs_a_query(console, tmp_path: Path) -> None:
    assert os.path.exists(CHROMIUM), "chromium is missing: run scripts/system-deps.sh"
    cluster, url, handles = console
    shots = Path(os.environ.get("FILOPY_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    ds = f"web{uuid.uuid4().hex[:6]}"
    with (
        httpx.Client(base_url=url, timeout=30) as http,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        problems = _watch_problems(page)

        # Opened before the dataset exists: no chart frame yet, and the picker picks the
        # dataset up once it is created, without a reload.
        page.goto(f"{url}/#{ds}")
        _wait(page, "document.querySelector('#grid').textContent.includes('no datasets yet')")
        assert not page.is_visible("#chart")
        icon = page.evaluate("document.querySelector('link[rel~=icon]')?.getAttribute('href')")
        assert icon is not None, "no icon: the browser asks for /favicon.ico (404)"
        assert icon.startswith("data:") or http.get(icon).status_code == 200, icon
        body = {"name": ds, "num_shards": 8, "min_num_nodes": 2}
        assert http.post("/api/v1/datasets", json=body).status_code == 201
        _wait(
            page, f"[...document.querySelectorAll('#dataset option')].some(o => o.value === '{ds}')"
        )
        _wait(page, "document.querySelector('#live.on') !== null")
        _wait(page, "document.querySelectorAll('#grid .shard[data-status=Active]').length === 8")
        now_ns = time.time_ns()
        lines = "\n".join(
            f"cpu,_ws_=demo,_ns_=app{i % 4},host=h{i} usage={i} {now_ns - k * 60_000_000_000}"
            for i in range(12)
            for k in range(10)
        )
        assert http.post(f"/ingest/{ds}/write", content=lines).status_code == 204

        shown = _statuses(page)
        owners = cluster.client.shard_map(ds)
        names = cluster.client.node_names()
        assert shown == {s: ("Active", names[owners.owner(s)]) for s in range(8)}
        _wait(page, f"{NODE_ROWS}.join() === 'ingest-a,ingest-b'")

        # Each status its own colour and letter; the cells look as the legend says.
        legend = {status: (bg, letter, text) for status, bg, letter, text in page.evaluate(LEGEND)}
        assert set(legend) == STATUSES, legend
        assert len({bg for bg, _, _ in legend.values()}) == len(STATUSES), legend
        assert len({letter for _, letter, _ in legend.values()}) == len(STATUSES), legend
        assert all(text == letter + status for status, (_, letter, text) in legend.items())

        # No moves planned: a short line, not a large empty box.
        _wait(page, "document.querySelector('#plan').textContent.includes('no moves planned')")
        assert page.evaluate(EMPTY_BELOW, "#plan") < 40
        page.screenshot(path=str(shots / "console-grid.png"), full_page=True)

        # A third node joins as a spare; then the owner of shard 0 is killed: on the same page
        # its shards turn Down, then Active on the spare, and it leaves the nodes table.
        handles["ingest-c"] = cluster.add_node(labels={NAME_LABEL: "ingest-c"})
        cluster.wait_for("3 members", lambda: len(cluster.client.members()) == 3)
        _wait(page, f"{NODE_ROWS}.length === 3")
        victim = names[owners.owner(0)]
        lost = owners.shards_for_node(owners.owner(0))
        stayed = next(n for n in ("ingest-a", "ingest-b") if n != victim)
        page.evaluate(WATCH, victim)
        cluster.ray.remove_node(handles[victim])
        _wait(page, "window.shard0.includes('Down')")
        page.screenshot(path=str(shots / "console-node-down.png"), full_page=True)
        _wait(page, ALL_ACTIVE_ON.format(node="ingest-c", n=len(lost)))
        seen = page.evaluate("window.shard0")
        assert "Down" in seen and seen[-1] == "Active", seen
        assert seen.index("Down") < len(seen) - 1 - seen[::-1].index("Active"), seen
        # When its shards showed Down, the victim showed no shards and no ingestion rate (if
        # still listed: the page reads the members at once); then it leaves the table.
        at_down = {row[0]: row for row in page.evaluate("window.nodesAtDown")}
        if victim in at_down:
            assert at_down[victim][2:4] == ["0", NO_RATE], at_down
        _wait(page, f"{NODE_ROWS}.join() === '{stayed},ingest-c'")
        after = _statuses(page)
        assert {s for s, (st, node) in after.items() if node == "ingest-c"} == set(lost)
        assert all(st == "Active" for st, _ in after.values())
        events = page.inner_text("#events")
        assert "ShardDown" in events and "IngestionStarted" in events
        # Each takeover is one history row, victim -> spare, saying why in plain words.
        took_over = " && ".join(
            f"rows.some(r => r[1] === '{s}' && r[2] === '{victim}' && r[3] === 'ingest-c')"
            for s in lost
        )
        try:
            _wait(page, f"(() => {{ const rows = {HISTORY}; return {took_over}; }})()")
        except AssertionError as e:
            recorded = "\n".join(map(str, cluster.client.history(ds, limit=30)))
            raise AssertionError(f"{e}\nthe coordinator's history:\n{recorded}") from None
        rows = page.evaluate(HISTORY)
        for s in lost:
            of_shard = [r for r in rows if r[1] == str(s)]
            assert [r[2:4] for r in of_shard] == [[victim, "ingest-c"], ["-", victim]], rows
            reason = of_shard[0][4]
            assert reason.startswith(f"failover: {victim} ") and "coordinator" not in reason, reason
        page.screenshot(path=str(shots / "console-recovered.png"), full_page=True)

        # Cells looked as the legend says all along (Active, Down, Assigned, Recovery...).
        for status, bg, letter in map(json.loads, page.evaluate("[...window.looks]")):
            assert (bg, letter) == legend[status][:2], (status, bg, letter, legend[status])

        # A range query: its table of rounded values, its chart with axes and a legend.
        _query(page, "sum by (_ns_) (cpu_usage) / 7", "3600")
        rows = dict(
            r.split("\t") for r in page.inner_text("#result tbody").splitlines() if "\t" in r
        )
        assert rows == {
            '{_ns_="app0"}': "1.71429",
            '{_ns_="app1"}': "2.14286",
            '{_ns_="app2"}': "2.57143",
            '{_ns_="app3"}': "3",
        }, rows
        assert page.is_visible("#chart")
        x_ticks = page.eval_on_selector_all(
            "#chart .x-axis text", "ts => ts.map(t => t.textContent)"
        )
        y_ticks = page.eval_on_selector_all(
            "#chart .y-axis text", "ts => ts.map(t => t.textContent)"
        )
        assert len(x_ticks) >= 3 and all(re.fullmatch(r"\d\d:\d\d", t) for t in x_ticks), x_ticks
        assert len(y_ticks) >= 3 and all(re.fullmatch(r"-?[\d.]+", t) for t in y_ticks), y_ticks
        keyed = page.eval_on_selector_all(
            "#chart-legend li",
            "items => items.map(i => [i.textContent,"
            " getComputedStyle(i.querySelector('i')).backgroundColor])",
        )
        lines_drawn = page.eval_on_selector_all(
            "#chart polyline", "ls => ls.map(l => getComputedStyle(l).stroke)"
        )
        assert [k[0] for k in keyed] == list(rows), keyed
        assert [k[1] for k in keyed] == lines_drawn, (keyed, lines_drawn)
        page.screenshot(path=str(shots / "console-query.png"), full_page=True)

        # An instant query: its table, and no chart left from the range query.
        _query(page, "sum by (_ns_) (cpu_usage) / 7", "0")
        assert page.inner_text("#result thead").split("\t")[-1].strip() == "value"
        assert not page.is_visible("#chart")

        # Storage: the retention in force and the bytes stored, of the raw data and of each
        # downsampled resolution, as the retention route says; a change of retention on the
        # live dataset shows without a reload.
        # Chunks are stored once sealed: a series of more samples than a chunk holds; every
        # 15 minutes for 32 hours, so a day's hourly periods and 2 hours' 5-minute ones are
        # complete and downsampled.
        per_chunk = cluster.settings.ingest.max_chunk_samples
        disk = "\n".join(
            f"disk,_ws_=demo,_ns_=app0,host=h0 used={k} {now_ns - k * 900_000_000_000}"
            for k in range(max(per_chunk + 10, 130))
        )
        assert http.post(f"/ingest/{ds}/write", content=disk).status_code == 204
        put = http.put(f"/api/v1/datasets/{ds}/retention", json={"retention": "30d"})
        assert put.status_code == 200, put.text
        seen: list = []

        def storage_shown() -> list | None:
            info = http.get(f"/api/v1/datasets/{ds}/retention").json()["data"]
            want = [["raw", info["bytes"], info["retention_ms"]]] + [
                [res, d["bytes"], d["retention_ms"]]
                for res, d in sorted(info["downsampled"].items(), key=lambda kv: int(kv[0]))
            ]
            rows = page.evaluate(STORAGE)
            seen[:] = [want, rows]
            stored = [w[1] for w in want]
            return rows if all(b > 0 for b in stored) and [r[:3] for r in rows] == want else None

        try:
            rows = wait_for("the storage table equals the retention route", storage_shown)
        except AssertionError as e:
            raise AssertionError(f"{e}: the route, then the page: {seen}") from None
        raw, *downsampled = rows
        assert raw[2] == 30 * 86_400_000 and raw[4][0] == "30d (dataset's own)", raw
        assert raw[3][0] == "raw samples" and raw[5][1] == f"{raw[1]:,} bytes", raw
        assert re.fullmatch(r"[\d.]+ (B|KiB|MiB)", raw[5][0]), raw
        resolutions = cluster.settings.downsample.resolutions_ms
        assert [int(r[0]) for r in downsampled] == sorted(resolutions), downsampled
        for res, stored_bytes, kept, what, retention, stored in downsampled:
            assert stored_bytes > 0, downsampled
            assert what[0] == f"downsampled, {_duration(int(res))}", what
            assert retention[0].startswith(f"{_duration(kept)} ("), retention
            assert stored[1] == f"{stored_bytes:,} bytes", stored
        page.screenshot(path=str(shots / "console-storage.png"), full_page=True)

        # Underscores show in the query box, its placeholder too; placeholders are not cut off.
        placeholder = page.get_attribute("#query", "placeholder")
        page.fill("#query", "________")
        page.evaluate("document.activeElement.blur()")
        assert _ink(page, "#query") > 20
        page.fill("#query", "")
        page.evaluate("document.querySelector('#query').placeholder = '________'")
        assert _ink(page, "#query") > 20
        page.evaluate("(p) => { document.querySelector('#query').placeholder = p; }", placeholder)
        for box in ("#query", "#at"):
            text, room = page.evaluate(PLACEHOLDER_FITS, box)
            assert text <= room, (box, text, room)

        # An operator drains the other survivor: its shards move to ingest-c through handoffs,
        # which the events panel names by node name, as the whole page does.
        assert http.post(f"/api/v1/nodes/{stayed}/drain").status_code == 200
        _wait(page, "document.querySelector('#events').textContent.includes('Handoff(ingest-c')")
        _wait(page, ALL_ACTIVE_ON.format(node="ingest-c", n=8))
        text = page.inner_text("body")
        assert not RAY_ID.search(text), RAY_ID.search(text)
        page.screenshot(path=str(shots / "console-drain.png"), full_page=True)

        assert problems == [], problems
        browser.close()
