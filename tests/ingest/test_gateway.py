"""The gateway against the real broker: every sample exactly once, on its shard's partition."""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from core.dataset import Dataset, SourceSettings, SpreadOverride, SpreadSettings
from core.hashing import query_shards, shard_for_series, shard_key_hash
from ingest.batch import SampleBatch
from ingest.gateway import Gateway, GatewayError, GatewayProgress, InvalidSeries
from ingest.topics import TopicMismatch, TopicMissing, ensure_topic
from ingest.wire.binary_format import decode_binary

pytestmark = pytest.mark.kafka

SHARDS = 8
T0 = 1_700_000_000_000
WIDE = {"_ws_": "demo", "_ns_": "wide"}  # spread 2 by override; the default is 1


@pytest.fixture
def dataset(kafka_bootstrap: str) -> Iterator[Dataset]:
    ds = Dataset(
        name=f"gw{uuid.uuid4().hex[:10]}",
        num_shards=SHARDS,
        spread=SpreadSettings(default=1, overrides=(SpreadOverride(shard_key=WIDE, spread=2),)),
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    ensure_topic(ds)
    yield ds
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_topics([ds.topic])[ds.topic].result(timeout=30)


def _consume_all(dataset: Dataset) -> list[tuple[int, bytes]]:
    """(partition, value) of every message in every partition, from offset 0 to the end."""
    consumer = Consumer(
        {
            "bootstrap.servers": dataset.source.bootstrap_servers,
            "group.id": "filopy-test-gateway",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign(
        [TopicPartition(dataset.topic, p, OFFSET_BEGINNING) for p in range(dataset.num_shards)]
    )
    out: list[tuple[int, bytes]] = []
    eofs: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while len(eofs) < dataset.num_shards:
            assert time.monotonic() < deadline, f"only partitions {eofs} reached their end in 30 s"
            # consume() waits for all num_messages or the timeout: keep the timeout short
            for m in consumer.consume(num_messages=1000, timeout=0.2):
                if m.error() is None:
                    out.append((m.partition(), m.value()))
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    eofs.add(m.partition())
                else:
                    raise KafkaException(m.error())
    finally:
        consumer.close()
    return out


def _labels(i: int) -> dict[str, str]:
    ns = ["wide", "app", "db", "web"][i % 4]
    return {
        "_metric_": f"requests_{i % 10}",
        "_ws_": "demo",
        "_ns_": ns,
        "instance": f"host-{i}",
    }


def test_every_sample_arrives_once_on_its_shard(dataset: Dataset) -> None:
    n_series, per_series = 200, 250  # 50k samples
    series = [_labels(i) for i in range(n_series)]
    # value encodes (series, k) so each sample is unique and traceable
    rows = [
        (series[i], T0 + 15_000 * k, float(i * 1000 + k))
        for k in range(per_series)
        for i in range(n_series)
    ]
    reports: list[GatewayProgress] = []
    gateway = Gateway(dataset, progress=reports.append, progress_interval_s=0)
    half = len(rows) // 2
    assert gateway.send(rows[:half]) == half  # row API for half, columnar for the rest
    idx = np.array([int(v) // 1000 for _, _, v in rows[half:]], np.int32)
    ts = np.array([t for _, t, _ in rows[half:]], np.int64)
    vals = np.array([v for _, _, v in rows[half:]], np.float64)
    for a in range(0, len(idx), 5000):
        sl = slice(a, a + 5000)
        assert gateway.send_batch(SampleBatch(series, idx[sl], ts[sl], vals[sl])) == len(ts[sl])
    gateway.close()

    received: Counter[tuple[int, int, float]] = Counter()
    per_partition_samples = [0] * SHARDS
    per_partition_messages = [0] * SHARDS
    for partition, value in _consume_all(dataset):
        decoded = decode_binary(value)
        assert decoded.first_bad is None
        b = decoded.batch
        per_partition_samples[partition] += len(b)
        per_partition_messages[partition] += 1
        for si, t, v in zip(
            b.series_idx.tolist(), b.timestamps.tolist(), b.values.tolist(), strict=True
        ):
            labels = b.series[si]
            assert partition == shard_for_series(dataset, labels), labels
            assert labels == series[int(v) // 1000]
            received[(int(v) // 1000, t, v)] += 1
    expected = Counter((int(v) // 1000, t, v) for _, t, v in rows)
    assert received == expected  # exactly once, nothing extra

    assert per_partition_samples == gateway.samples_per_shard
    assert per_partition_messages == gateway.messages_per_shard
    assert sum(1 for n in per_partition_samples if n) > SHARDS // 2  # really spread out
    assert gateway.skipped == {}

    # all series of one shard key stay within that key's query shards (2**spread of them)
    by_key: dict[tuple[str, str], set[int]] = {}
    for labels in series:
        key = (labels["_ns_"], labels["_metric_"])
        by_key.setdefault(key, set()).add(shard_for_series(dataset, labels))
    for (ns, metric), shards in by_key.items():
        spread = 2 if ns == "wide" else 1
        h = shard_key_hash({"_ws_": "demo", "_ns_": ns, "_metric_": metric}, dataset)
        allowed = set(query_shards(h, spread, SHARDS))
        assert shards <= allowed and len(allowed) == 2**spread
    assert any(len(s) > 2 for (ns, _), s in by_key.items() if ns == "wide")

    assert len(reports) == 1 + 5 + 1  # one per send_batch call (send makes one), and the end
    sent = [r.samples_sent for r in reports]
    assert sent == sorted(sent) and sent[0] > 0
    last = reports[-1]
    assert last.final and not any(r.final for r in reports[:-1])
    assert last.samples_sent == last.samples_acked == len(rows)
    assert last.messages_sent == last.messages_acked == sum(per_partition_messages)
    assert last.bytes_sent > 0 and last.samples_per_s > 0


@pytest.mark.parametrize("level", [0, 1])
def test_messages_stay_under_the_size_cap(dataset: Dataset, level: int) -> None:
    cap = 4096
    rng = np.random.default_rng(level)
    series = [_labels(i) for i in range(50)]
    n = 20_000
    batch = SampleBatch(
        series,
        rng.integers(0, 50, n).astype(np.int32),
        T0 + np.arange(n, dtype=np.int64),
        rng.normal(size=n),  # incompressible values: the cap really binds
    )
    with Gateway(dataset, max_message_bytes=cap, compression_level=level) as gateway:
        assert gateway.send_batch(batch) == n
    messages = _consume_all(dataset)
    sizes = [len(v) for _, v in messages]
    assert max(sizes) <= cap
    assert len(messages) == sum(gateway.messages_per_shard) > 2 * SHARDS
    assert sum(len(decode_binary(v).batch) for _, v in messages) == n
    if level == 0:  # uncompressed pieces are sized from an exact bound: most are nearly full
        assert np.median(sizes) > cap / 2


def test_unroutable_samples_are_skipped_and_counted(dataset: Dataset) -> None:
    # 14 KB (within the label limits), still > 2 KB compressed
    huge = {"_metric_": "big", "blob": os.urandom(7_000).hex()}
    series = [_labels(0), {"job": "no-metric"}, huge]
    batch = SampleBatch(
        series,
        np.array([0, 1, 2, 0, 0], np.int32),
        np.array([T0, T0, T0, -5, T0 + 1], np.int64),
        np.arange(5, dtype=np.float64),
    )
    with Gateway(dataset, max_message_bytes=2048) as gateway:
        assert gateway.send_batch(batch) == 2
        assert gateway.skipped == {"no_metric": 1, "timestamp_range": 1, "too_large": 1}
    got = [decode_binary(v).batch for _, v in _consume_all(dataset)]
    assert sorted(v for b in got for v in b.values.tolist()) == [0.0, 4.0]


def _contract_breakers() -> list[dict[str, str]]:
    return [
        {"_metric_": "big", "blob": "x" * 70_000},  # label_too_long
        {"_metric_": "wide", **{f"l{i}": "v" for i in range(300)}},  # too_many_labels
        {"_metric_": "", "_ws_": "demo", "_ns_": "app"},  # no_metric (empty)
        {"_metric_": "m", "n" * 300: "v"},  # label_name_too_long
        {"_metric_": "m", "": "v"},  # empty_label_name
    ]


def test_series_breaking_the_contract_are_refused_counted_and_logged(
    dataset: Dataset, caplog: pytest.LogCaptureFixture
) -> None:
    series = [_labels(0), *_contract_breakers(), _labels(1)]
    batch = SampleBatch(
        series,
        np.array([0, 1, 2, 3, 4, 5, 6, 1, 0], np.int32),
        np.full(9, T0, np.int64) + np.arange(9),
        np.arange(9, dtype=np.float64),
    )
    with Gateway(dataset) as gateway:
        assert gateway.send_batch(batch) == 3
        assert gateway.skipped == {
            "label_too_long": 2,
            "too_many_labels": 1,
            "no_metric": 1,
            "label_name_too_long": 1,
            "empty_label_name": 1,
        }
        assert (
            "70000 bytes, over limits.max_label_value_bytes = 16384"
            in (gateway.rejected["label_too_long"])
        )
        assert (
            "301 labels, over limits.max_labels_per_series = 64"
            in (gateway.rejected["too_many_labels"])
        )
        assert sum("breaking the dataset's contract" in r.message for r in caplog.records) == 5
    got = [decode_binary(v).batch for _, v in _consume_all(dataset)]
    assert sorted(v for b in got for v in b.values.tolist()) == [0.0, 6.0, 8.0]


def test_a_strict_gateway_raises_before_sending_anything(dataset: Dataset) -> None:
    whys = [
        "limits.max_label_value_bytes",
        "limits.max_labels_per_series",
        "no metric name",
        "limits.max_label_name_bytes",
        "empty label name",
    ]
    with Gateway(dataset, strict=True) as gateway:
        for bad, why in zip(_contract_breakers(), whys, strict=True):
            with pytest.raises(InvalidSeries, match=why):
                gateway.send([(_labels(0), T0, 1.0), (bad, T0, 2.0)])
        with pytest.raises(InvalidSeries, match="must be str"):
            gateway.send([({"_metric_": "m", "port": 80}, T0, 1.0)])  # type: ignore[dict-item]
        assert gateway.send([(_labels(0), T0, 3.0)]) == 1
    got = [decode_binary(v).batch for _, v in _consume_all(dataset)]
    assert [v for b in got for v in b.values.tolist()] == [3.0]


def test_gateway_checks_the_topic_and_refuses_use_after_close(
    dataset: Dataset, kafka_bootstrap: str
) -> None:
    with pytest.raises(TopicMismatch):
        Gateway(dataset.model_copy(update={"num_shards": 4}))
    with pytest.raises(TopicMissing):
        Gateway(dataset.model_copy(update={"source": SourceSettings(topic="no-such-topic")}))
    gateway = Gateway(dataset, kafka_bootstrap)
    gateway.close()
    with pytest.raises(GatewayError, match="closed"):
        gateway.send([(_labels(0), T0, 1.0)])
    with pytest.raises(ValueError, match="max_message_bytes"):
        Gateway(dataset, max_message_bytes=100)
