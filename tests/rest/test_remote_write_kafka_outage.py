"""Kafka stopped mid-stream under a real remote-write sender: nothing lost, nothing doubled.

A private Kafka broker (scripts/services.sh on its own ports and data directory, so the shared
broker of the other tests is untouched) takes a dataset's topic. A real Prometheus scrapes itself
every second and remote-writes to a `filopy gateway` app. The broker is stopped for a while:
the gateway answers 503 with Retry-After (it cannot get Kafka's acks), Prometheus keeps its
samples and retries. The broker comes back; once Prometheus has sent past the end of the range,
FiloPy's own ingesters read the topic, and every series holds exactly the timestamps
Prometheus' own TSDB has for the range: no loss, no duplicate.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from core.config import Settings, load_settings
from core.dataset import Dataset, SourceSettings
from filopy.ingest_http import create_gateway_app
from ingest.ingester import KafkaShardIngester
from ingest.topics import ensure_topic
from store import open_stores
from tests import prometheus
from tests.rest.conftest import ServerThread
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "scripts" / "services.sh"
SHARDS = 2


def _port_pair() -> int:
    """A free port P with P+1 free too (the broker and its KRaft controller)."""
    for _ in range(200):
        p = random.randrange(21000, 29000)
        ok = True
        for q in (p, p + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", q))
                except OSError:
                    ok = False
        if ok:
            return p
    raise AssertionError("no free port pair")


class PrivateKafka:
    """A Kafka broker of its own, started and stopped with scripts/services.sh."""

    def __init__(self, root: Path) -> None:
        self.port = _port_pair()
        self.bootstrap = f"127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        shared_cache = ROOT / ".services" / "cache"
        shared_cache.mkdir(parents=True, exist_ok=True)
        (root / "cache").symlink_to(shared_cache)  # the jars the shared broker uses
        self.env = {
            **os.environ,
            "FILOPY_SERVICES_DIR": str(root),
            "FILOPY_KAFKA_PORT": str(self.port),
            "FILOPY_KAFKA_HEAP": "384m",
        }

    def _run(self, action: str) -> None:
        subprocess.run(
            ["bash", str(SERVICES), action, "kafka"], env=self.env, check=True, timeout=300
        )

    def up(self) -> None:
        self._run("up")

    def down(self) -> None:
        self._run("down")


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[PrivateKafka]:
    k = PrivateKafka(tmp_path / "services")
    k.up()
    try:
        yield k
    finally:
        k.down()


def _settings(tmp_path: Path, bootstrap: str) -> Settings:
    base = load_settings()
    return base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"bootstrap_servers": bootstrap}),
            "store": base.store.model_copy(
                update={"backend": "sqlite", "sqlite_path": tmp_path / "filopy.db"}
            ),
            "gateway": base.gateway.model_copy(update={"ack_timeout_s": 3.0, "retry_after_s": 1}),
            "ingest": base.ingest.model_copy(update={"flush_interval_s": 1.0}),
            "auth": base.auth.model_copy(update={"enabled": False}),  # tests/auth/'s subject
        }
    )


def _counter(metrics_text: str, name: str, **labels: str) -> float:
    """The sum of a counter's samples whose labels include `labels`."""
    total = 0.0
    for line in metrics_text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _read_back(ds: Dataset, settings: Settings) -> dict[str, list[int]]:
    """Every series' timestamps as FiloPy's ingesters hold them, Prometheus' labels as JSON."""
    meta, columns = open_stores(settings)
    ingesters = [
        KafkaShardIngester(
            ds, s, "n1", meta=meta, columns=columns, settings=settings, report=lambda e: None
        )
        for s in range(SHARDS)
    ]
    consumer = Consumer({"bootstrap.servers": ds.source.bootstrap_servers, "group.id": "check"})
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition(ds.topic, s), timeout=30)[1]
            for s in range(SHARDS)
        ]
        for ing in ingesters:
            asyncio.run(ing.start())
        wait_for(
            "the ingesters to read the whole topic",
            lambda: all(
                (ing.next_offset or 0) >= end for ing, end in zip(ingesters, ends, strict=True)
            ),
        )
        out: dict[str, list[int]] = {}
        for ing in ingesters:
            for key, timestamps in ing.series_samples().items():
                labels = json.loads(key)
                labels["__name__"] = labels.pop("_metric_")
                out[json.dumps(labels, sort_keys=True)] = [int(t) for t in timestamps]
        return out
    finally:
        consumer.close()
        for ing in ingesters:
            asyncio.run(ing.stop())
        meta.close()
        columns.close()


@pytest.mark.kafka
def test_kafka_stopped_mid_stream_is_503_then_the_sender_retries_and_nothing_is_lost(
    tmp_path: Path, kafka: PrivateKafka
) -> None:
    prometheus.require()
    settings = _settings(tmp_path, kafka.bootstrap)
    ds = Dataset(
        name=f"out{uuid.uuid4().hex[:8]}",
        num_shards=SHARDS,
        source=SourceSettings(bootstrap_servers=kafka.bootstrap),
    )
    ensure_topic(ds)
    meta, columns = open_stores(settings)
    meta.create_dataset(ds)
    meta.close()
    columns.close()

    port = _port_pair()
    with ServerThread(create_gateway_app(settings)) as gateway:
        config = f"""
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ["127.0.0.1:{port}"]
remote_write:
  - url: {gateway}/ingest/{ds.name}/api/v1/write
{prometheus.QUEUE}
"""
        with (
            prometheus.running(config, tmp_path, port) as prom,
            httpx.Client(base_url=gateway, timeout=10) as http,
        ):

            def gateway_count(name: str, **labels: str) -> float:
                return _counter(http.get("/metrics").text, name, **labels)

            wait_for(
                "samples acknowledged before the outage",
                lambda: prom.sent_past(time.time() - 3),
            )
            accepted_before = gateway_count("filopy_http_ingest_samples_accepted_total")
            assert accepted_before > 0

            kafka.down()  # a stopped broker, mid-stream
            wait_for(
                "503 answers while Kafka is down",
                lambda: gateway_count("filopy_http_ingest_requests_total", code="503") >= 2,
            )
            assert gateway_count("filopy_http_ingest_kafka_errors_total") >= 2
            time.sleep(3)  # a few more scrapes pile up in Prometheus' queue
            kafka.up()

            end_ms = int(time.time() * 1000)
            end = end_ms / 1000
            wait_for("Prometheus to send past the outage", lambda: prom.sent_past(end + 1), 180)
            want = {
                json.dumps(s["metric"], sort_keys=True): [
                    round(float(t) * 1000) for t, _ in s["values"]
                ]
                for s in prom.query('{job="prometheus"}[1h]', at=end)
            }
            retried = prom.scalar("sum(prometheus_remote_storage_samples_retried_total)")
            assert prom.stop() == 0

    assert retried > 0, "Prometheus retried nothing"
    assert len(want) > 100
    got = _read_back(ds, settings)
    held = {k: [t for t in ts if t <= end_ms] for k, ts in got.items()}
    held = {k: ts for k, ts in held.items() if ts}
    assert set(held) == set(want)
    lost = {k: sorted(set(want[k]) - set(held[k])) for k in want if set(want[k]) - set(held[k])}
    assert not lost, f"{len(lost)} series lost samples, e.g. {next(iter(lost.items()))}"
    doubled = {k: ts for k, ts in held.items() if len(ts) != len(set(ts))}
    assert not doubled, f"{len(doubled)} series hold a sample twice"
    assert held == want
