"""Samples a producer wrote to a partition their series' shard key does not hash to are kept and
counted as `misrouted` (memstore stats, metrics, the log), since queries routed by shard key
will not look for them there.

The end-to-end test uses kcat, a Kafka producer FiloPy did not write, as a direct-to-Kafka
producer would: it picks the partition itself.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka.admin import AdminClient

from core.dataset import Dataset, RecordFormat, SourceSettings, SpreadSettings
from core.hashing import shard_for_series
from ingest.batch import SampleBatch
from ingest.ingester import KafkaShardIngester
from ingest.memstore import ShardMemstore
from ingest.topics import ensure_topic
from store import open_stores
from tests.ingest.test_outages import _settings
from tests.waiting import wait_for

T0 = 1_700_000_000_000
SHARDS = 4


def _dataset(**source: object) -> Dataset:
    return Dataset(
        name=f"mis{uuid.uuid4().hex[:8]}",
        num_shards=SHARDS,
        spread=SpreadSettings(default=1),
        source=SourceSettings(topic=f"misrouted-{uuid.uuid4().hex[:10]}", **source),
    )


def _series_on(ds: Dataset, shard: int, other: bool) -> dict[str, str]:
    """A series whose shard is `shard` (other=False) or any other shard (other=True)."""
    for i in range(10_000):
        labels = {"_metric_": "m", "_ws_": "w", "_ns_": f"n{i % 7}", "instance": f"i{i}"}
        if (shard_for_series(ds, labels) == shard) != other:
            return labels
    raise AssertionError("no such series")


def test_the_memstore_counts_misrouted_samples_and_keeps_them() -> None:
    ds = _dataset()
    mine, theirs = _series_on(ds, 2, other=False), _series_on(ds, 2, other=True)
    mem = ShardMemstore(ds, 2)
    batch = SampleBatch(
        [mine, theirs],
        np.array([0, 1, 1, 0, 1], np.int32),
        T0 + np.arange(5, dtype=np.int64),
        np.arange(5, dtype=np.float64),
    )
    st = mem.ingest(batch, 0)
    assert (st.ingested, st.misrouted) == (5, 3)
    assert mem.labels(st.first_misrouted) == theirs
    assert mem.stats.misrouted == 3
    assert mem.num_series == 2 and mem.memory_samples() == 5  # kept
    more = SampleBatch([mine], np.zeros(2, np.int32), T0 + 10 + np.arange(2), np.ones(2))
    st = mem.ingest(more, 1)
    assert st.misrouted == 0 and mem.stats.misrouted == 3


@pytest.mark.kafka
def test_kcat_writing_to_the_wrong_partition_is_counted_and_logged(
    tmp_path: Path, kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    kcat = shutil.which("kcat")
    assert kcat, "kcat is missing: run scripts/system-deps.sh"
    ds = _dataset(bootstrap_servers=kafka_bootstrap, record_format=RecordFormat.INFLUX)
    shard = 1
    mine, theirs = _series_on(ds, shard, other=False), _series_on(ds, shard, other=True)

    def line(labels: dict[str, str], t: int) -> str:
        tags = f"_ws_=w,_ns_={labels['_ns_']},instance={labels['instance']}"
        return f"m,{tags} value=1 {t * 1_000_000}"

    lines = [line(mine, T0), line(theirs, T0), line(theirs, T0 + 1000)]
    settings = _settings(tmp_path, "sqlite")
    meta, columns = open_stores(settings)
    ensure_topic(ds)
    caplog.set_level(logging.WARNING)
    try:
        meta.create_dataset(ds)
        produce = [kcat, "-P", "-b", kafka_bootstrap, "-t", ds.topic, "-p", str(shard)]
        subprocess.run(produce, input="\n".join(lines) + "\n", text=True, check=True, timeout=60)
        ingester = KafkaShardIngester(
            ds, shard, "n1", meta=meta, columns=columns, settings=settings, report=lambda e: None
        )
        asyncio.run(ingester.start())
        try:
            wait_for("3 samples ingested", lambda: ingester.memstore.stats.ingested >= 3)
            stats = ingester.stats()
        finally:
            asyncio.run(ingester.stop())
        assert stats["memstore"].misrouted == 2  # both samples of the other shard's series
        assert ingester.memstore.num_series == 2  # kept
        logged = [r.getMessage() for r in caplog.records if "belong to another shard" in r.message]
        assert logged and f'"instance":"{theirs["instance"]}"' in logged[0], logged
    finally:
        meta.close()
        columns.close()
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.delete_topics([ds.topic])[ds.topic].result(timeout=30)
