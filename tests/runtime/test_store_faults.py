"""A store outage on a real cluster (issue 11, item 3): two Ray nodes ingest from Kafka into one
SQLite file; another connection holds its write lock (`BEGIN EXCLUSIVE`) well past the busy
timeout. Ingestion must go on into memory, the shards show as Degraded (map, /__health, metrics),
nothing moves or errors, and once the lock is gone everything is flushed and checkpointed, exactly
once, with no operator action."""

from __future__ import annotations

import re
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import ray

from coordinator.client import FiloPyClient
from coordinator.cluster_actor import start_cluster_actor
from coordinator.local_cluster import LocalRayCluster
from core.dataset import Dataset, SourceSettings
from core.shard_status import Active, Degraded
from filopy.rest import create_app
from ingest.gateway import Gateway
from store import encode_part_key, open_stores
from tests.durable import durable_series
from tests.rest.conftest import ServerThread
from tests.runtime.conftest import FiloPyCluster, cluster_settings

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

T0 = 1_700_000_000_000
SERIES = 32
SHARDS = 4


@pytest.fixture
def cluster(ray_cluster: LocalRayCluster, tmp_path: Path, kafka_bootstrap: str) -> FiloPyCluster:
    settings = cluster_settings(
        tmp_path,
        "kafka",
        flush_interval_s=1.0,
        groups_per_shard=2,
        store_retry_initial_s=0.2,
        store_retry_max_s=1.0,
        kafka_bootstrap=kafka_bootstrap,
    )
    settings = settings.model_copy(
        update={
            "store": settings.store.model_copy(update={"sqlite_busy_timeout_s": 0.5}),
        }
    )
    actor = start_cluster_actor(settings)
    ray.get(actor.ready.remote(), timeout=60)
    return FiloPyCluster(ray_cluster, settings, FiloPyClient(actor, settings), actor)


def _labels(i: int) -> dict[str, str]:
    return {"_metric_": "m", "_ws_": "w", "_ns_": f"app{i % 8}", "instance": f"i{i}"}


def _send(ds: Dataset, kafka: str, rounds: range) -> None:
    with Gateway(ds, kafka) as gw:
        for r in rounds:
            gw.send(
                [
                    (_labels(i), T0 + 1000 * (10 * r + k), float(k))
                    for i in range(SERIES)
                    for k in range(10)
                ]
            )
        gw.flush()


def _totals(c: FiloPyCluster, ds: Dataset) -> dict[str, int]:
    """Summed over every ingester: samples ingested, durable (in chunks or a flushed open-buffer
    snapshot), unflushed; flush failures."""
    out = dict.fromkeys(("ingested", "durable", "unflushed", "failures", "degraded"), 0)
    for by_shard in c.client.ingest_stats(ds.ref).values():
        for st in by_shard.values():
            out["ingested"] += st["memstore"].ingested
            out["unflushed"] += st["unflushed_samples"]
            out["durable"] += st["memstore"].ingested - st["unflushed_samples"]
            out["degraded"] += st["degraded"] is not None
            if st["flush"] is not None:
                out["failures"] += st["flush"].failures
    return out


def _metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M))


@pytest.fixture
def http(cluster: FiloPyCluster) -> Iterator[httpx.Client]:
    app = create_app(cluster.client, cluster.settings)
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def test_a_store_stall_past_its_timeout_degrades_shards_then_heals_without_help(
    cluster: FiloPyCluster, http: httpx.Client, kafka_bootstrap: str, tmp_path: Path
) -> None:
    c = cluster
    for _ in range(2):
        c.add_node()
    c.wait_for("2 members", lambda: len(c.client.members()) == 2)
    ds = Dataset(
        name=f"sf{uuid.uuid4().hex[:8]}",
        num_shards=SHARDS,
        min_num_nodes=2,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    assert c.client.setup_dataset(ds)
    c.wait_for("all active", lambda: c.client.shard_map(ds.name).is_healthy(), 60)
    owners = [c.client.shard_map(ds.name).owner(s) for s in range(SHARDS)]
    _send(ds, kafka_bootstrap, range(0, 3))
    per_round = SERIES * 10
    c.wait_for("durable", lambda: _totals(c, ds)["durable"] == 3 * per_round, 60)

    locker = sqlite3.connect(c.settings.store.sqlite_path, isolation_level=None, timeout=10)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        _send(ds, kafka_bootstrap, range(3, 8))
        # Ingestion goes on into memory while nothing can be written.
        c.wait_for("ingested", lambda: _totals(c, ds)["ingested"] == 8 * per_round, 60)
        degraded = c.wait_for(
            "degraded shards",
            lambda: [
                s
                for s in range(SHARDS)
                if isinstance(c.client.shard_map(ds.name).status(s), Degraded)
            ],
            30,
        )
        mapper = c.client.shard_map(ds.name)
        for s in degraded:
            assert "store unavailable" in mapper.status(s).message  # type: ignore[attr-defined]
        health = http.get("/__health")
        assert health.status_code == 503, health.text
        assert "Degraded" in health.text and "store unavailable" in health.text
        # Degraded shards still answer queries (memory + store), with a warning (item 10).
        answer = http.get(
            f"/promql/{ds.name}/api/v1/query",
            params={"query": 'count(m{_ws_="w"})', "time": (T0 + 79_000) / 1000},
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["data"]["result"][0]["value"][1] == str(SERIES)  # every series, in memory
        assert any("degraded (store unavailable" in w for w in body["warnings"]), body
        time.sleep(8 * c.settings.store.sqlite_busy_timeout_s)
        totals = _totals(c, ds)
        assert totals["failures"] >= 2 * len(degraded), totals  # retried, each one counted
        assert totals["durable"] == 3 * per_round and totals["unflushed"] == 5 * per_round
        metrics = http.get("/metrics").text
        assert _metric(metrics, "filopy_flush_failures_total") >= totals["failures"] - 1
        assert _metric(metrics, "filopy_shard_degraded") >= len(degraded)
        shards_degraded = re.search(
            rf'^filopy_shards\{{dataset="{ds.name}",status="Degraded"\}} (\S+)$', metrics, re.M
        )
        assert shards_degraded is not None and float(shards_degraded.group(1)) >= len(degraded)
    finally:
        if locker.in_transaction:
            locker.execute("ROLLBACK")
        locker.close()

    # Healed by itself: Active everywhere, same owners, everything flushed and checkpointed.
    c.wait_for("all active again", lambda: c.client.shard_map(ds.name).is_healthy(), 60)
    c.wait_for("caught up", lambda: _totals(c, ds)["durable"] == 8 * per_round, 60)
    totals = _totals(c, ds)
    assert totals["unflushed"] == 0 and totals["degraded"] == 0, totals
    mapper = c.client.shard_map(ds.name)
    assert [mapper.owner(s) for s in range(SHARDS)] == owners
    assert all(isinstance(mapper.status(s), Active) for s in range(SHARDS))
    assert http.get("/__health").status_code == 200
    assert c.client.reassignment_stats().get(ds.name, (0, 0)) == (0, 0)
    meta, columns = open_stores(c.settings)
    try:
        want = T0 + 1000 * np.arange(80, dtype=np.int64)
        stored: dict[str, np.ndarray] = {}
        for s in range(SHARDS):
            durable = durable_series(meta, columns, ds, s)
            for key, (ts, _) in durable.items():
                stored[key] = ts
            if durable:  # every group checkpointed at the shard's last offset
                assert len(set(meta.read_checkpoints(ds.ref, s).values())) == 1
        assert set(stored) == {encode_part_key(_labels(i)) for i in range(SERIES)}
        for key, ts in stored.items():
            assert np.array_equal(ts, want), f"{key}: {len(ts)} samples"  # none lost, none twice
    finally:
        meta.close()
        columns.close()
