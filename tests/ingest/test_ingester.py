"""One KafkaShardIngester against the real broker, outside a cluster: transient Kafka errors."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from core.config import load_settings
from core.dataset import Dataset, SourceSettings, StoreOptions
from core.shard_status import IngestionError, IngestionStarted, RecoveryInProgress, ShardEvent
from ingest.gateway import Gateway
from ingest.ingester import KafkaShardIngester, is_transient
from ingest.topics import ensure_topic
from store import open_stores
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka


def test_leaderless_and_unknown_partitions_are_transient_but_bad_requests_are_not() -> None:
    for code in (
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT_QUEUE,  # get_watermark_offsets with the broker cut off (the bed)
    ):
        assert is_transient(KafkaError(code)), code
    for code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.INVALID_REQUEST):
        assert not is_transient(KafkaError(code)), code
    assert not is_transient(KafkaError(KafkaError._TRANSPORT, fatal=True))


def test_an_ingester_waits_for_a_topic_that_appears_late_then_ingests(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    base = load_settings()
    settings = base.model_copy(
        update={
            "store": base.store.model_copy(update={"sqlite_path": tmp_path / "f.db"}),
            "ingest": base.ingest.model_copy(update={"kafka_retry_timeout_s": 60.0}),
        }
    )
    topic = f"late-{uuid.uuid4().hex[:10]}"
    ds = Dataset(
        name="late",
        num_shards=2,
        source=SourceSettings(topic=topic, bootstrap_servers=kafka_bootstrap),
    )
    meta, columns = open_stores(settings)
    meta.create_dataset(ds)
    events: list[ShardEvent] = []
    started = threading.Event()

    def report(e: ShardEvent) -> None:
        events.append(e)
        if isinstance(e, (IngestionStarted, IngestionError)):
            started.set()

    ingester = KafkaShardIngester(
        ds, 0, "n1", meta=meta, columns=columns, settings=settings, report=report
    )
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    try:
        asyncio.run(ingester.start())
        assert not started.wait(2.0), events  # no topic yet: still waiting, no error
        assert ensure_topic(ds) is True
        assert started.wait(30), events
        assert isinstance(events[-1], IngestionStarted), events
        labels = {"_metric_": "up", "_ws_": "w", "_ns_": "n", "instance": "a"}
        with Gateway(ds) as gw:
            gw.send([(labels, 1_700_000_000_000 + 1000 * i, float(i)) for i in range(100)])
        wait_for("100 samples in memory", lambda: ingester.memstore.memory_samples() >= 100)
        assert ingester.memstore.memory_samples() == 100
        # Lag: the partition's end offset (as of the last fetch) minus the next offset to read.
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "lag-check"})
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.close()
        assert end >= 1
        wait_for("the end offset fetched", lambda: ingester.end_offset == end)
        assert (ingester.end_offset, ingester.next_offset, ingester.lag) == (end, end, 0)
        assert ingester.recovery_s is not None and ingester.recovery_s > 2.0  # waited for the topic
    finally:
        asyncio.run(ingester.stop())
        meta.close()
        columns.close()
        admin.delete_topics([topic])[topic].result(timeout=30)


def test_told_to_stop_while_waiting_for_kafka_stops_without_an_error(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    base = load_settings()
    settings = base.model_copy(
        update={"store": base.store.model_copy(update={"sqlite_path": tmp_path / "f.db"})}
    )
    ds = Dataset(
        name="never",
        num_shards=2,
        source=SourceSettings(
            topic=f"never-{uuid.uuid4().hex[:10]}", bootstrap_servers=kafka_bootstrap
        ),
    )
    meta, columns = open_stores(settings)
    meta.create_dataset(ds)
    events: list[ShardEvent] = []
    ingester = KafkaShardIngester(
        ds, 0, "n1", meta=meta, columns=columns, settings=settings, report=events.append
    )
    try:
        asyncio.run(ingester.start())
        time.sleep(1.0)
        t0 = time.monotonic()
        asyncio.run(ingester.stop())
        assert time.monotonic() - t0 < 5
        assert events == []
    finally:
        meta.close()
        columns.close()


def test_the_datasets_store_options_win_over_the_node_defaults(tmp_path: Path) -> None:
    base = load_settings()
    settings = base.model_copy(
        update={"store": base.store.model_copy(update={"sqlite_path": tmp_path / "f.db"})}
    )
    options = StoreOptions(groups_per_shard=3, max_chunk_samples=50, memory_retention_ms=1000)
    ds = Dataset(name="opts", num_shards=2, store=options)
    meta, columns = open_stores(settings)
    try:
        ingester = KafkaShardIngester(
            ds, 0, "n1", meta=meta, columns=columns, settings=settings, report=lambda e: None
        )
        mem = ingester.memstore
        assert (mem.groups_per_shard, mem.max_chunk_samples, mem.retention_ms) == (3, 50, 1000)
        assert mem.chunk_span_ms == settings.ingest.chunk_span_ms  # not set: the node's
        plain = KafkaShardIngester(
            Dataset(name="plain", num_shards=2),
            0,
            "n1",
            meta=meta,
            columns=columns,
            settings=settings,
            report=lambda e: None,
        )
        assert plain.memstore.groups_per_shard == settings.ingest.groups_per_shard != 3
    finally:
        meta.close()
        columns.close()


def test_offsets_retention_dropped_before_the_checkpoint_are_reported_in_an_event(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    base = load_settings()
    settings = base.model_copy(
        update={"store": base.store.model_copy(update={"sqlite_path": tmp_path / "f.db"})}
    )
    topic = f"retained-{uuid.uuid4().hex[:10]}"
    ds = Dataset(
        name="retained",
        num_shards=2,
        source=SourceSettings(topic=topic, bootstrap_servers=kafka_bootstrap),
    )
    ensure_topic(ds)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    meta, columns = open_stores(settings)
    meta.create_dataset(ds)
    labels = {"_metric_": "up", "_ws_": "w", "_ns_": "n", "instance": "a"}
    ingester = None
    try:
        with Gateway(ds) as gw:  # ten messages on the series' shard
            for i in range(10):
                gw.send([(labels, 1_700_000_000_000 + 1000 * i, float(i))])
                gw.flush()
        shard = next(
            s
            for s in range(2)
            if Consumer(
                {"bootstrap.servers": kafka_bootstrap, "group.id": "x"}
            ).get_watermark_offsets(TopicPartition(topic, s), timeout=10)[1]
            == 10
        )
        # Every group checkpointed at offset 2; then "retention" (delete_records) drops 0..6.
        epoch = meta.claim_epoch(ds.ref, shard, "old-owner")
        for g in range(settings.ingest.groups_per_shard):
            meta.commit_checkpoint(ds.ref, shard, g, 2, epoch)
        for future in admin.delete_records([TopicPartition(topic, shard, 7)]).values():
            future.result(timeout=30)
        events: list[ShardEvent] = []
        ingester = KafkaShardIngester(
            ds, shard, "n1", meta=meta, columns=columns, settings=settings, report=events.append
        )
        asyncio.run(ingester.start())
        wait_for("IngestionStarted", lambda: any(isinstance(e, IngestionStarted) for e in events))
        lost = [e for e in events if isinstance(e, RecoveryInProgress) and e.message]
        assert len(lost) == 1, events
        assert lost[0].message == (
            f"Kafka retention dropped offsets 3..6 of partition {shard} before they were "
            "checkpointed: 4 offsets lost"
        )
        assert ingester.offsets_lost == 4
        wait_for("3 samples in memory", lambda: ingester.memstore.memory_samples() >= 3)
        assert ingester.memstore.memory_samples() == 3  # offsets 7, 8, 9
    finally:
        if ingester is not None:
            asyncio.run(ingester.stop())
        meta.close()
        columns.close()
        admin.delete_topics([topic])[topic].result(timeout=30)
