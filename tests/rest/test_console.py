"""The web console in a real browser (headless Chromium, driven by Playwright) against a real
cluster ingesting from Kafka: the grid shows the shards' statuses and owners; killing a node turns
its shards Down, then Active on the spare, on the open page (no reload); a query renders its
table and chart. Screenshots of each step go to $FILOPY_SCREENSHOTS (docs/images/ refreshes
them) or the test's temporary directory."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import ray
from playwright.sync_api import sync_playwright

from coordinator.client import FiloPyClient
from coordinator.cluster_actor import start_cluster_actor
from coordinator.node_coordinator import NAME_LABEL
from filopy.rest.app import create_app
from filopy.testing import LocalRayCluster
from tests.rest.conftest import ServerThread
from tests.runtime.conftest import FiloPyCluster, cluster_settings

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def console(tmp_path: Path, kafka_bootstrap: str) -> Iterator[tuple[FiloPyCluster, str, dict]]:
    settings = cluster_settings(tmp_path, "kafka", flush_interval_s=1.0)
    settings = settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"bootstrap_servers": kafka_bootstrap})}
    )
    ray_cluster = LocalRayCluster()
    try:
        actor = start_cluster_actor(settings)
        ray.get(actor.ready.remote(), timeout=60)
        cluster = FiloPyCluster(ray_cluster, settings, FiloPyClient(actor, settings), actor)
        handles = {
            name: cluster.add_node(labels={NAME_LABEL: name}) for name in ("ingest-a", "ingest-b")
        }
        cluster.wait_for("2 members", lambda: len(cluster.client.members()) == 2)
        with ServerThread(create_app(cluster.client, settings)) as url:
            yield cluster, url, handles
            cluster.client.queries().close()
    finally:
        ray_cluster.shutdown()


WATCH_SHARD_0 = """() => {
  window.shard0 = [];
  const seen = () => {
    const c = document.querySelector('#grid .shard[data-shard="0"]');
    if (c && window.shard0[window.shard0.length - 1] !== c.dataset.status) {
      window.shard0.push(c.dataset.status);
    }
  };
  seen();
  new MutationObserver(seen).observe(document.querySelector('#grid'), {childList: true});
}"""
ALL_ACTIVE_ON = """[...document.querySelectorAll('#grid .shard')]
  .filter(c => c.dataset.status === 'Active' && c.dataset.node === '{node}').length === {n}"""


def _statuses(page) -> dict[int, tuple[str, str]]:
    cells = page.query_selector_all("#grid .shard")
    return {
        int(c.get_attribute("data-shard")): (
            c.get_attribute("data-status"),
            c.get_attribute("data-node"),
        )
        for c in cells
    }


def test_the_console_follows_the_cluster_live_and_runs_a_query(console, tmp_path: Path) -> None:
    assert os.path.exists(CHROMIUM), "chromium is missing: run scripts/system-deps.sh"
    cluster, url, handles = console
    shots = Path(os.environ.get("FILOPY_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    ds = f"web{uuid.uuid4().hex[:6]}"
    body = {"name": ds, "num_shards": 8, "min_num_nodes": 2}
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/api/v1/datasets", json=body).status_code == 201
        cluster.wait_for("all shards active", lambda: cluster.client.shard_map(ds).is_healthy(), 60)
        now_ns = time.time_ns()
        lines = "\n".join(
            f"cpu,_ws_=demo,_ns_=app{i % 4},host=h{i} usage={i} {now_ns - k * 60_000_000_000}"
            for i in range(12)
            for k in range(10)
        )
        assert http.post(f"/ingest/{ds}/write", content=lines).status_code == 204

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/#{ds}")
            page.wait_for_selector("#live.on")
            page.wait_for_function(
                "document.querySelectorAll('#grid .shard[data-status=Active]').length === 8"
            )
            shown = _statuses(page)
            owners = cluster.client.shard_map(ds)
            names = cluster.client.node_names()
            assert shown == {s: ("Active", names[owners.owner(s)]) for s in range(8)}
            page.wait_for_function("document.querySelectorAll('#nodes tbody tr').length === 2")
            assert {
                r.get_attribute("data-node") for r in page.query_selector_all("#nodes tbody tr")
            } == {
                "ingest-a",
                "ingest-b",
            }
            page.screenshot(path=str(shots / "console-grid.png"), full_page=True)

            # A third node joins as a spare; then the owner of shard 0 is killed: on the same page
            # its shards turn Down, then Active on the spare.
            handles["ingest-c"] = cluster.add_node(labels={NAME_LABEL: "ingest-c"})
            cluster.wait_for("3 members", lambda: len(cluster.client.members()) == 3)
            victim = names[owners.owner(0)]
            lost = owners.shards_for_node(owners.owner(0))
            # Every status shard 0 shows, in order (the grid is redrawn on each event).
            page.evaluate(WATCH_SHARD_0)
            cluster.ray.remove_node(handles[victim])
            page.wait_for_function("window.shard0.includes('Down')", timeout=30_000)
            page.screenshot(path=str(shots / "console-node-down.png"), full_page=True)
            page.wait_for_function(
                ALL_ACTIVE_ON.format(node="ingest-c", n=len(lost)), timeout=60_000
            )
            seen = page.evaluate("window.shard0")
            assert "Down" in seen and seen[-1] == "Active", seen
            assert seen.index("Down") < len(seen) - 1 - seen[::-1].index("Active"), seen
            # The nodes table follows too: the victim gone, the spare with the lost shards.
            stayed = next(n for n in ("ingest-a", "ingest-b") if n != victim)
            page.wait_for_function(
                "[...document.querySelectorAll('#nodes tbody tr')].map(r => r.dataset.node)"
                f".sort().join() === '{stayed},ingest-c'",
                timeout=30_000,
            )
            after = _statuses(page)
            assert {s for s, (st, node) in after.items() if node == "ingest-c"} == set(lost)
            assert all(st == "Active" for st, _ in after.values())
            events = page.inner_text("#events")
            assert "ShardDown" in events and "IngestionStarted" in events
            page.screenshot(path=str(shots / "console-recovered.png"), full_page=True)

            # A query renders its table and its chart.
            page.fill("#query", "sum by (_ns_) (cpu_usage)")
            page.click("#query-form button")
            page.wait_for_selector("#result tbody tr td")
            rows = page.inner_text("#result tbody")
            for ns in ("app0", "app1", "app2", "app3"):
                assert f'_ns_="{ns}"' in rows, rows
            assert page.is_visible("#chart")
            page.screenshot(path=str(shots / "console-query.png"), full_page=True)
            browser.close()
