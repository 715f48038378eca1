"""NaN is a value: NaN samples, whatever their payload, and Prometheus' staleness marker travel
bit for bit through the gateway, real Kafka, an ingester's memstore and the store."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka.admin import AdminClient

from core.config import load_settings
from core.dataset import Dataset, SourceSettings
from ingest.gateway import Gateway
from ingest.ingester import KafkaShardIngester
from ingest.shard_reader import read_merged
from ingest.topics import ensure_topic
from store import open_stores
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka

BITS = [
    0x7FF8000000000000,  # NaN as Go and NumPy make it
    0x7FF0000000000002,  # Prometheus' staleness marker (value.StaleNaN)
    0xFFF8000000000000,  # a negative NaN
    0x7FF8DEADBEEF0001,  # a quiet NaN with a payload
    0x8000000000000000,  # -0.0
    0x7FF0000000000000,  # +Inf
    0x3FF0000000000000,  # 1.0
]


def test_nan_payloads_and_the_stale_marker_are_stored_bit_for_bit(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    base = load_settings()
    settings = base.model_copy(
        update={"store": base.store.model_copy(update={"sqlite_path": tmp_path / "f.db"})}
    )
    topic = f"nan-{uuid.uuid4().hex[:10]}"
    ds = Dataset(
        name="nan",
        num_shards=2,
        source=SourceSettings(topic=topic, bootstrap_servers=kafka_bootstrap),
    )
    meta, columns = open_stores(settings)
    meta.create_dataset(ds)
    assert ensure_topic(ds) is True
    values = np.array(BITS, dtype=np.uint64).view(np.float64)
    t0 = 1_700_000_000_000
    labels = {"_metric_": "m", "_ws_": "w", "_ns_": "n"}
    ingesters = [
        KafkaShardIngester(
            ds, shard, "n1", meta=meta, columns=columns, settings=settings, report=lambda e: None
        )
        for shard in range(ds.num_shards)
    ]
    try:
        for ingester in ingesters:
            asyncio.run(ingester.start())
        with Gateway(ds) as gw:
            gw.send([(labels, t0 + 1000 * i, float(v)) for i, v in enumerate(values)])
        wait_for(
            "every sample in memory",
            lambda: sum(i.memstore.memory_samples() for i in ingesters) >= len(BITS),
        )
        (shard,) = [s for s, i in enumerate(ingesters) if i.memstore.memory_samples()]
        mem = ingesters[shard].memstore
        (sid,) = mem.find_series([])
        ts, got = read_merged(mem, columns, ds.ref, shard, sid)
        assert ts.tolist() == [t0 + 1000 * i for i in range(len(BITS))]
        assert got.view(np.uint64).tolist() == BITS  # in memory
        key = mem.part_key(sid)
    finally:
        for ingester in ingesters:
            asyncio.run(ingester.stop())  # flushes everything to the store
    try:
        chunks = columns.read_chunks(ds.ref, shard, [key], t0, t0 + 1000 * len(BITS))[key]
        stored = np.concatenate([c.samples()[1] for c in chunks])
        assert stored.view(np.uint64).tolist() == BITS  # in the store
    finally:
        meta.close()
        columns.close()
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.delete_topics([topic])[topic].result(timeout=30)
