"""One KafkaShardIngester through real store and Kafka outages (issue 11, item 3).

SQLite: another connection holds the write lock (`BEGIN EXCLUSIVE`) longer than the busy timeout.
Cassandra: the store talks to it through a TCP proxy on 127.0.0.1 that the test freezes
(SIGSTOP), so requests time out, and thaws; the shared Cassandra itself is never touched. Kafka:
the dataset's bootstrap is a frozen proxy, thawed later. Each outage must leave ingestion going
(or paused, never dropping), show as Degraded, count the failed flushes, and end with everything
flushed and checkpointed exactly once, with nobody's help.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka.admin import AdminClient

from core.config import Settings, load_settings
from core.dataset import Dataset, SourceSettings, SpreadSettings
from core.shard_status import IngestionDegraded, IngestionStarted, ShardEvent
from ingest.flush import recover_shard
from ingest.gateway import Gateway
from ingest.ingester import KafkaShardIngester, stale_epoch_rejections
from ingest.memstore import ShardMemstore
from ingest.shard_reader import read_merged
from ingest.topics import ensure_topic
from store import INT64_MAX, INT64_MIN, ColumnStore, MetaStore, open_stores
from tests.ingest.tcp_proxy import TcpProxy
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka

T0 = 1_700_000_000_000
SERIES = 8
GROUPS = 4


def _settings(tmp_path: Path, backend: str, port: int = 9042, **ingest: Any) -> Settings:
    base = load_settings()
    return base.model_copy(
        update={
            "store": base.store.model_copy(
                update={
                    "backend": backend,
                    "sqlite_path": tmp_path / "f.db",
                    "sqlite_busy_timeout_s": 0.3,
                }
            ),
            "cassandra": base.cassandra.model_copy(
                update={
                    "contact_points": ("127.0.0.1",),
                    "port": port,
                    "keyspace": "filopy_outages",
                    "connect_timeout_s": 2.0,
                    "request_timeout_s": 1.0,
                }
            ),
            "ingest": base.ingest.model_copy(
                update={
                    "groups_per_shard": GROUPS,
                    "flush_interval_s": 0.4,
                    "store_retry_initial_s": 0.1,
                    "store_retry_max_s": 0.5,
                    **ingest,
                }
            ),
        }
    )


def _dataset(kafka: str, topic_kafka: str | None = None) -> Dataset:
    return Dataset(
        name=f"out{uuid.uuid4().hex[:8]}",
        num_shards=1,
        spread=SpreadSettings(default=0),
        source=SourceSettings(
            topic=f"outage-{uuid.uuid4().hex[:10]}", bootstrap_servers=topic_kafka or kafka
        ),
    )


def _labels(s: int) -> dict[str, str]:
    return {"_metric_": "m", "_ws_": "w", "_ns_": "n", "instance": f"i{s}"}


def _send(ds: Dataset, kafka: str, rounds: range, per_round: int = 10) -> None:
    """One message per round: every series gets `per_round` samples, 1 s apart."""
    with Gateway(
        ds.model_copy(update={"source": ds.source.model_copy(update={"bootstrap_servers": kafka})})
    ) as gw:
        for r in rounds:
            gw.send(
                [
                    (_labels(s), T0 + 1000 * (r * per_round + i), float(i))
                    for s in range(SERIES)
                    for i in range(per_round)
                ]
            )
            gw.flush()


def _stored(columns: ColumnStore, ds: Dataset) -> dict[str, np.ndarray]:
    keys = [pk.part_key for pk in columns.list_part_keys(ds.ref, 0)]
    chunks = columns.read_chunks(ds.ref, 0, keys, INT64_MIN, INT64_MAX)
    return {
        k: np.concatenate([c.samples()[0] for c in chunks.get(k, [])] or [np.empty(0, np.int64)])
        for k in keys
    }


def _assert_exactly_stored(columns: ColumnStore, ds: Dataset, rounds: int) -> None:
    stored = _stored(columns, ds)
    want = T0 + 1000 * np.arange(rounds * 10, dtype=np.int64)
    assert len(stored) == SERIES
    for key, ts in stored.items():
        assert np.array_equal(ts, want), (key, len(ts), len(want))  # nothing lost or doubled


def _assert_exactly_durable(
    meta: MetaStore, columns: ColumnStore, ds: Dataset, rounds: int, settings: Settings
) -> None:
    """What a new owner would recover from the store (chunks, part keys and the checkpoints'
    open-buffer snapshots; Kafka's end is the last checkpoint + 1, so nothing to replay) is
    exactly every sample of `rounds` rounds: nothing lost or doubled."""
    mem = ShardMemstore(ds, 0, groups_per_shard=settings.ingest.groups_per_shard)
    plan = recover_shard(mem, meta, columns, ds.ref, 0, rounds)
    assert plan.replay_until == -1 and plan.start_offset == rounds, plan
    want = T0 + 1000 * np.arange(rounds * 10, dtype=np.int64)
    assert mem.num_series == SERIES
    for sid in range(mem.num_series):
        ts, _ = read_merged(mem, columns, ds.ref, 0, sid)
        assert np.array_equal(ts, want), (mem.part_key(sid), len(ts), len(want))


@contextmanager
def _running(
    ds: Dataset, settings: Settings, meta: MetaStore, columns: ColumnStore
) -> Iterator[tuple[KafkaShardIngester, list[ShardEvent]]]:
    events: list[ShardEvent] = []
    ingester = KafkaShardIngester(
        ds, 0, "n1", meta=meta, columns=columns, settings=settings, report=events.append
    )
    asyncio.run(ingester.start())
    try:
        yield ingester, events
    finally:
        asyncio.run(ingester.stop())


@contextmanager
def _topic(ds: Dataset, kafka: str) -> Iterator[None]:
    ensure_topic(
        ds.model_copy(update={"source": ds.source.model_copy(update={"bootstrap_servers": kafka})})
    )
    try:
        yield
    finally:
        admin = AdminClient({"bootstrap.servers": kafka})
        admin.delete_topics([ds.topic])[ds.topic].result(timeout=30)


def _ride_out_outage(
    ds: Dataset,
    kafka: str,
    settings: Settings,
    meta: MetaStore,
    columns: ColumnStore,
    cut: Callable[[], None],
    restore: Callable[[], None],
    outage_s: float,
) -> None:
    """Ingest, cut the store off, keep producing, check Degraded and the consumer advancing,
    restore, check the catch-up: Active, every group checkpointed, every sample stored once."""
    meta.create_dataset(ds)
    with _topic(ds, kafka), _running(ds, settings, meta, columns) as (ing, events):
        _send(ds, kafka, range(0, 3))
        wait_for(
            "flushed", lambda: ing.flusher is not None and ing.flusher.totals().checkpoint == 2
        )
        assert isinstance(events[-1], IngestionStarted), events
        cut()
        try:
            cut_at = time.monotonic()
            _send(ds, kafka, range(3, 8))
            # Ingestion goes on into memory: the consumer offset passes everything produced.
            wait_for("consumer offset advances during the outage", lambda: ing.next_offset == 8)
            wait_for(f"degraded: {events}", lambda: isinstance(events[-1], IngestionDegraded))
            assert "store unavailable" in events[-1].message  # type: ignore[attr-defined]
            assert ing.degraded is not None and ing.stats()["degraded"] is not None
            time.sleep(max(0.0, outage_s - (time.monotonic() - cut_at)))
            failures = ing.stats()["flush"].failures
            assert failures >= 2, failures  # retried, and counted each time
            assert ing.flusher is not None and ing.flusher.totals().checkpoint == 2
            assert ing.memstore.unflushed_samples() >= 5 * 10 * SERIES
        finally:
            restore()
        wait_for(f"healthy again: {events}", lambda: isinstance(events[-1], IngestionStarted))
        wait_for("caught up", lambda: ing.flusher.totals().checkpoint == 7)  # type: ignore[union-attr]
        assert ing.degraded is None and ing.flusher.outages >= 1  # type: ignore[union-attr]
        assert meta.read_checkpoints(ds.ref, 0) == dict.fromkeys(range(GROUPS), 7)
        _assert_exactly_durable(meta, columns, ds, 8, settings)
        # And it keeps ingesting normally afterwards.
        _send(ds, kafka, range(8, 9))
        wait_for("flushes after", lambda: ing.flusher.totals().checkpoint == 8)  # type: ignore[union-attr]
        assert not any(type(e).__name__ == "IngestionError" for e in events), events
    _assert_exactly_stored(columns, ds, 9)


def test_sqlite_write_lock_held_past_the_busy_timeout_degrades_then_catches_up(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, "sqlite")
    meta, columns = open_stores(settings)
    locker = sqlite3.connect(tmp_path / "f.db", isolation_level=None, timeout=10)
    try:
        _ride_out_outage(
            _dataset(kafka_bootstrap),
            kafka_bootstrap,
            settings,
            meta,
            columns,
            cut=lambda: locker.execute("BEGIN EXCLUSIVE"),
            restore=lambda: locker.execute("ROLLBACK") if locker.in_transaction else None,
            outage_s=8 * settings.store.sqlite_busy_timeout_s,
        )
    finally:
        locker.close()
        meta.close()
        columns.close()


@pytest.mark.cassandra
def test_cassandra_unreachable_past_its_timeout_degrades_then_catches_up(
    kafka_bootstrap: str, cassandra_address: tuple[str, int], tmp_path: Path
) -> None:
    host, port = cassandra_address
    with TcpProxy(host, port) as proxy:
        settings = _settings(tmp_path, "cassandra", proxy.port)
        meta, columns = open_stores(settings)
        try:
            _ride_out_outage(
                _dataset(kafka_bootstrap),
                kafka_bootstrap,
                settings,
                meta,
                columns,
                cut=proxy.cut,
                restore=proxy.restore,
                outage_s=4 * settings.cassandra.request_timeout_s,
            )
        finally:
            meta.close()
            columns.close()


def test_past_the_memory_bound_consumption_pauses_then_resumes_without_loss(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    per_msg = 10 * SERIES
    settings = _settings(tmp_path, "sqlite", max_unflushed_samples=3 * per_msg)
    meta, columns = open_stores(settings)
    ds = _dataset(kafka_bootstrap)
    meta.create_dataset(ds)
    locker = sqlite3.connect(tmp_path / "f.db", isolation_level=None, timeout=10)
    try:
        with _topic(ds, kafka_bootstrap), _running(ds, settings, meta, columns) as (ing, events):
            _send(ds, kafka_bootstrap, range(0, 1))
            wait_for(
                "1st", lambda: ing.flusher is not None and ing.flusher.totals().checkpoint == 0
            )
            locker.execute("BEGIN EXCLUSIVE")
            _send(ds, kafka_bootstrap, range(1, 10))
            wait_for("paused past the bound", lambda: ing.paused)
            time.sleep(1.0)
            # Stopped short of the end: at most one message past the bound, nothing dropped.
            assert ing.next_offset is not None and ing.next_offset <= 5, ing.next_offset
            assert ing.memstore.unflushed_samples() <= 4 * per_msg
            assert ing.memstore.stats.ingested == ing.memstore.unflushed_samples() + per_msg
            assert isinstance(events[-1], IngestionDegraded), events
            assert "consumption paused" in events[-1].message
            assert ing.stats()["paused"] and ing.stats()["pauses"] == 1
            locker.execute("ROLLBACK")
            wait_for("resumed to the end", lambda: ing.next_offset == 10)
            wait_for(f"healthy: {events}", lambda: isinstance(events[-1], IngestionStarted))
            wait_for("caught up", lambda: ing.flusher.totals().checkpoint == 9)  # type: ignore[union-attr]
            assert not ing.paused
        _assert_exactly_stored(columns, ds, 10)
    finally:
        locker.close()
        meta.close()
        columns.close()


def test_recovery_waits_for_the_store_at_start_as_degraded_not_as_an_error(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, "sqlite")
    meta, columns = open_stores(settings)
    ds = _dataset(kafka_bootstrap)
    meta.create_dataset(ds)
    locker = sqlite3.connect(tmp_path / "f.db", isolation_level=None, timeout=10)
    try:
        with _topic(ds, kafka_bootstrap):
            _send(ds, kafka_bootstrap, range(0, 2))
            locker.execute("BEGIN EXCLUSIVE")  # the epoch claim cannot get through
            with _running(ds, settings, meta, columns) as (ing, events):
                wait_for("degraded", lambda: any(isinstance(e, IngestionDegraded) for e in events))
                assert "while claiming the shard" in events[-1].message  # type: ignore[attr-defined]
                time.sleep(1.0)
                assert ing.epoch is None and ing.messages == 0
                locker.execute("ROLLBACK")
                wait_for(f"started: {events}", lambda: isinstance(events[-1], IngestionStarted))
                wait_for("flushed", lambda: ing.flusher.totals().checkpoint == 1)  # type: ignore[union-attr]
            _assert_exactly_stored(columns, ds, 2)
    finally:
        locker.close()
        meta.close()
        columns.close()


def test_kafka_unreachable_past_the_retry_timeout_shows_degraded_then_recovers(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, "sqlite", kafka_retry_timeout_s=1.0)
    meta, columns = open_stores(settings)
    with TcpProxy("127.0.0.1", int(kafka_bootstrap.rsplit(":", 1)[1])) as proxy:
        ds = _dataset(kafka_bootstrap, topic_kafka=proxy.address)
        meta.create_dataset(ds)
        try:
            with _topic(ds, kafka_bootstrap):
                _send(ds, kafka_bootstrap, range(0, 2))
                proxy.cut()
                with _running(ds, settings, meta, columns) as (ing, events):
                    wait_for("an event", lambda: bool(events))
                    assert isinstance(events[-1], IngestionDegraded), events
                    assert "Kafka unreachable" in events[-1].message
                    proxy.restore()
                    wait_for(f"started: {events}", lambda: isinstance(events[-1], IngestionStarted))
                    wait_for("consumed", lambda: ing.next_offset == 2)
                    assert not any(type(e).__name__ == "IngestionError" for e in events)
        finally:
            meta.close()
            columns.close()


def test_a_stale_epoch_rejection_is_counted_and_logged_as_a_warning(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(tmp_path, "sqlite")
    meta, columns = open_stores(settings)
    ds = _dataset(kafka_bootstrap)
    meta.create_dataset(ds)
    try:
        with _topic(ds, kafka_bootstrap), _running(ds, settings, meta, columns) as (ing, events):
            _send(ds, kafka_bootstrap, range(0, 1))
            wait_for(
                "1st", lambda: ing.flusher is not None and ing.flusher.totals().checkpoint == 0
            )
            assert stale_epoch_rejections(ds.name) == {}
            meta.claim_epoch(ds.ref, 0, "the-new-owner")  # another node took the shard
            _send(ds, kafka_bootstrap, range(1, 2))
            wait_for("stopped", lambda: not ing._worker.running)
            assert stale_epoch_rejections(ds.name) == {0: 1}
        warned = [r for r in caplog.records if "another node owns it now" in r.getMessage()]
        assert [r.levelname for r in warned] == ["WARNING"]
        assert not any(type(e).__name__ == "IngestionError" for e in events), events
    finally:
        meta.close()
        columns.close()


def test_a_backlog_past_the_memory_bound_at_start_is_flushed_as_it_is_replayed(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A new owner that starts with more in Kafka than `max_unflushed_samples` (here: a shard
    nobody ingested yet) must not hold its flushes until it has replayed all of it: consumption
    would pause at the bound, waiting for flushes that wait for the replay's end, forever."""
    per_msg = 10 * SERIES
    settings = _settings(tmp_path, "sqlite", max_unflushed_samples=3 * per_msg)
    meta, columns = open_stores(settings)
    ds = _dataset(kafka_bootstrap)
    meta.create_dataset(ds)
    try:
        with _topic(ds, kafka_bootstrap):
            _send(ds, kafka_bootstrap, range(0, 10))
            with _running(ds, settings, meta, columns) as (ing, events):
                wait_for("replayed to the end", lambda: ing.next_offset == 10)
                wait_for(f"live: {events}", lambda: isinstance(events[-1], IngestionStarted))
                wait_for("caught up", lambda: ing.flusher.totals().checkpoint == 9)  # type: ignore[union-attr]
        _assert_exactly_stored(columns, ds, 10)
    finally:
        meta.close()
        columns.close()
