"""REST on a cluster ingesting from the real Kafka: topic mismatch is a 409, ingestion metrics."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from core.dataset import RecordFormat, SourceSettings
from core.hashing import shard_for_series
from filopy import Dataset
from ingest.topics import ensure_topic
from tests.cluster import cluster_settings
from tests.rest.conftest import Rest, start_rest
from tests.rest.test_cluster import all_active
from tests.rest.test_datasets import error_of
from tests.rest.test_operations import metrics, value

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

T0_NS = 1_700_000_000_000 * 1_000_000


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Rest]:
    # Flushing every second, so the flush metrics move within the test.
    settings = cluster_settings(
        tmp_path_factory.mktemp("rest-kafka"),
        "kafka",
        flush_interval_s=1.0,
        kafka_bootstrap=kafka_bootstrap,
    )
    yield from start_rest(tmp_path_factory.mktemp("rest-kafka"), nodes=2, settings=settings)


def test_a_topic_with_another_partition_count_is_409(rest, kafka_bootstrap: str) -> None:
    name = f"ds{uuid.uuid4().hex[:8]}"
    source = {"bootstrap_servers": kafka_bootstrap, "topic": f"rest-{name}"}
    ensure_topic(Dataset(name=name, num_shards=2, source=SourceSettings(**source)), timeout_s=30)
    resp = rest.http.post(
        "/api/v1/datasets", json={"name": name, "num_shards": 4, "source": source}
    )
    message = error_of(resp, 409, "conflict")
    assert message == (
        f"Kafka topic 'rest-{name}' has 2 partitions but the dataset has 4 shards (one partition "
        "per shard); use another topic or recreate this one with 4 partitions"
    )
    assert name not in rest.http.get("/api/v1/cluster").json()["data"]


def test_ingestion_counters_per_shard(rest, kafka_bootstrap: str) -> None:
    name = f"ds{uuid.uuid4().hex[:8]}"
    source = {"bootstrap_servers": kafka_bootstrap, "record_format": "influx-line"}
    body = {"name": name, "num_shards": 2, "min_num_nodes": 2, "source": source}
    assert rest.http.post("/api/v1/datasets", json=body).status_code == 201
    rest.wait_for("all shards active", lambda: all_active(rest, name))
    ds = Dataset(
        name=name,
        num_shards=2,
        min_num_nodes=2,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap, record_format=RecordFormat.INFLUX),
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    expected = {0: 0, 1: 0}
    for i in range(20):
        labels = {"_ws_": "demo", "_ns_": f"app{i}", "_metric_": "up"}
        shard = shard_for_series(ds, labels)
        lines = [
            f"up,_ns_=app{i},_ws_=demo value={k} {T0_NS + k * 15_000_000_000}" for k in range(5)
        ]
        producer.produce(ds.topic, "\n".join(lines).encode(), partition=shard)
        expected[shard] += 5
    producer.produce(ds.topic, b'up,_ns_=x,_ws_=demo value="text" 1', partition=0)
    assert producer.flush(30) == 0
    assert all(expected.values()), expected  # both shards got samples

    def ingested() -> dict | None:
        # Every message read, the bad one too: an ingester counts a message's bad records before
        # the message itself (a scrape can fall between the two), so the wait is on both.
        m = metrics(rest)
        got = {
            int(s.labels["shard"]): s.value
            for s in m["filopy_ingested_samples"]
            if s.labels["dataset"] == name
        }
        read = sum(s.value for s in m["filopy_ingested_messages"] if s.labels["dataset"] == name)
        return m if got == expected and read == 21 else None

    m = rest.wait_for("every sample and message counted", ingested)
    owners = {
        s["shard"]: s["node"]  # metrics name nodes by their readable names
        for s in rest.http.get(f"/api/v1/cluster/{name}/status").json()["data"]
    }
    for shard in (0, 1):
        labels = {"dataset": name, "shard": str(shard), "node": owners[shard]}
        assert (
            value(m["filopy_ingested_samples"], "filopy_ingested_samples_total", **labels)
            == expected[shard]
        )
        # Flushed chunks of old samples (these are from 2023) may already be evicted.
        held = value(m["filopy_memstore_samples"], "filopy_memstore_samples", **labels)
        assert 0 <= held <= expected[shard]
        assert value(m["filopy_offsets_lost"], "filopy_offsets_lost_total", **labels) == 0
    bad = m["filopy_bad_records"]
    assert (
        value(bad, "filopy_bad_records_total", dataset=name, shard="0", reason="non_numeric") == 1
    )
    messages = {
        int(s.labels["shard"]): s.value
        for s in m["filopy_ingested_messages"]
        if s.labels["dataset"] == name
    }
    assert sum(messages.values()) == 21

    lag_metrics = (
        "filopy_unflushed_samples",
        "filopy_consumer_lag_offsets",
        "filopy_consumer_lag_seconds",
    )

    def flushed_and_caught_up() -> dict | None:
        m = metrics(rest)
        mine = [s for fam in m.values() for s in fam if s.labels.get("dataset") == name]
        got = {(s.name, int(s.labels["shard"])): s.value for s in mine if s.name in lag_metrics}
        # durable: these few samples per series stay in open buffers (their chunks are not
        # complete), stored in the flush groups' snapshots, so nothing is left unflushed
        want = {("filopy_unflushed_samples", s): 0 for s in expected}
        want |= {("filopy_consumer_lag_offsets", s): 0 for s in expected}
        # caught up with nothing new: nothing waits, so no lag in time either
        want |= {("filopy_consumer_lag_seconds", s): 0 for s in expected}
        return m if got == want else None

    m = rest.wait_for("everything flushed, no lag", flushed_and_caught_up)
    for shard in (0, 1):
        labels = {"dataset": name, "shard": str(shard), "node": owners[shard]}
        flushes = value(
            m["filopy_flush_duration_seconds"], "filopy_flush_duration_seconds_count", **labels
        )
        took = value(
            m["filopy_flush_duration_seconds"], "filopy_flush_duration_seconds_sum", **labels
        )
        assert flushes >= 1 and took > 0
        assert value(m["filopy_flush_failures"], "filopy_flush_failures_total", **labels) == 0
        recovery = value(
            m["filopy_recovery_duration_seconds"], "filopy_recovery_duration_seconds", **labels
        )
        assert 0 < recovery < 30
    rest.http.delete(f"/api/v1/datasets/{name}")


DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "filopy.json"


def test_every_metric_the_grafana_dashboard_queries_is_exported(rest, kafka_bootstrap: str) -> None:
    """docs/grafana/filopy.json queries only what /metrics really exports: after HTTP ingestion,
    flushes and a query, every sample name in the dashboard's expressions is in the exposition."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]
    wanted = {m for e in exprs for m in re.findall(r"\bfilopy_[a-z_]+", e)}
    assert len(wanted) >= 20, wanted  # the dashboard covers the exported families

    name = f"ds{uuid.uuid4().hex[:8]}"
    source = {"bootstrap_servers": kafka_bootstrap}
    body = {"name": name, "num_shards": 2, "min_num_nodes": 2, "source": source}
    assert rest.http.post("/api/v1/datasets", json=body).status_code == 201
    rest.wait_for("all shards active", lambda: all_active(rest, name))
    lines = "\n".join(f"up,_ns_=app{i},_ws_=demo value=1 {T0_NS}" for i in range(20))
    written = rest.http.post(f"/ingest/{name}/write", content=lines)
    assert written.status_code == 204, written.text
    assert rest.http.get(f"/promql/{name}/api/v1/query", params={"query": "up"}).is_success

    # A family counts once exported (a counter of errors that never happened has no sample yet).
    families = {re.sub(r"_(total|bucket|sum|count)$", "", m) for m in wanted}
    missing: list[set[str]] = []

    def exported() -> bool:
        text = rest.http.get("/metrics").text
        missing.append(families - {f.name for f in text_string_to_metric_families(text)})
        return not missing[-1]

    try:
        rest.wait_for("every dashboard metric exported", exported, 30)
    except AssertionError:
        raise AssertionError(
            f"the dashboard queries metrics never exported: {missing[-1]}"
        ) from None


def test_the_calls_grafana_makes_on_a_dashboard_load_all_answer(rest, kafka_bootstrap: str) -> None:
    """scripts/grafana_calls.py, as a subprocess against a dataset holding data, replays what
    Grafana's Prometheus data source asks (health check, buildinfo, label names and values,
    metadata, a variable's series, a panel's query_range, exemplars, format_query) and checks
    each answer's shape."""
    name = f"ds{uuid.uuid4().hex[:8]}"
    source = {"bootstrap_servers": kafka_bootstrap}
    body = {"name": name, "num_shards": 2, "min_num_nodes": 2, "source": source}
    assert rest.http.post("/api/v1/datasets", json=body).status_code == 201
    rest.wait_for("all shards active", lambda: all_active(rest, name))
    now_ns = time.time_ns()
    lines = "\n".join(
        f"http_requests,_ns_=app{i % 3},_ws_=demo,path=/p{i} value={i} {now_ns - k * 15 * 10**9}"
        for i in range(6)
        for k in range(8)
    )
    assert rest.http.post(f"/ingest/{name}/write", content=lines).status_code == 204
    query = {"query": "count(http_requests)"}

    def held() -> bool:
        got = rest.http.get(f"/promql/{name}/api/v1/query", params=query).json()
        return got["data"]["result"] and got["data"]["result"][0]["value"][1] == "6"

    rest.wait_for("the samples queryable", held)
    script = Path(__file__).resolve().parents[2] / "scripts" / "grafana_calls.py"
    done = subprocess.run(
        [sys.executable, str(script), f"{rest.url}/promql/{name}", "--label", "path"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "http_requests: 6 series, 6 values of path, 6 panel series" in done.stdout
    for call in ("buildinfo", "metadata", "exemplars", "format_query", "query_range"):
        assert call in done.stdout
    rest.http.delete(f"/api/v1/datasets/{name}")
