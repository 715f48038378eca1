"""Ingestion end to end: real Kafka, a real multi-node Ray cluster, exact per-series results.

Samples go through the gateway (binary) or straight to partitions (line protocol); nodes ingest
their shards; the check reads every series back from each owner's memstore + ColumnStore, with
nothing de-duplicated, and compares timestamps exactly: nothing lost, nothing doubled.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from confluent_kafka import Producer

from coordinator.names import node_actor_name
from core.dataset import RecordFormat, SourceSettings
from core.hashing import shard_for_series
from filopy import Dataset
from ingest.batch import SampleBatch
from ingest.gateway import Gateway
from store import encode_part_key, open_stores
from tests.cluster import FiloPyCluster, cluster_settings, start_cluster

if TYPE_CHECKING:
    from coordinator.local_cluster import LocalRayCluster
    from core.config import Settings

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

T0 = 1_700_000_000_000


@pytest.fixture
def kafka_cluster(
    ray_cluster: LocalRayCluster, tmp_path: Path, kafka_bootstrap: str
) -> Iterator[FiloPyCluster]:
    yield start_cluster(ray_cluster, _settings(tmp_path, kafka_bootstrap))


def _settings(tmp_path: Path, kafka_bootstrap: str) -> Settings:
    return cluster_settings(
        tmp_path, "kafka", kafka_bootstrap=kafka_bootstrap, flush_interval_s=1.0, groups_per_shard=4
    )


@pytest.fixture(scope="module")
def three_nodes(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str
) -> Iterator[FiloPyCluster]:
    """Three nodes of the warm Ray cluster, shared by the tests that change no membership
    (each with its dataset); the test that kills a node comes last, on a cluster of its own."""
    from tests.cluster import end_cluster, ray_pool

    settings = _settings(tmp_path_factory.mktemp("ingest"), kafka_bootstrap)
    ray_cluster, ids = ray_pool(3, settings.cluster.node_resource)
    c = start_cluster(ray_cluster, settings)
    try:
        c.wait_for("3 members", lambda: set(c.client.members()) == set(ids))
        yield c
    finally:
        end_cluster(c)


@pytest.fixture
def shared(three_nodes: FiloPyCluster) -> Iterator[FiloPyCluster]:
    """The module's three nodes; the test's datasets are removed after it (their ingesters
    stop)."""
    yield three_nodes
    for ds in three_nodes.client.datasets():
        three_nodes.client.remove_dataset(ds.name)


def dataset(bootstrap: str, fmt: RecordFormat = RecordFormat.BINARY) -> Dataset:
    name = f"ds{uuid.uuid4().hex[:8]}"
    return Dataset(
        name=name,
        num_shards=8,
        min_num_nodes=3,
        source=SourceSettings(bootstrap_servers=bootstrap, record_format=fmt),
    )


def labels(i: int) -> dict[str, str]:
    return {"_metric_": f"m{i % 7}", "_ws_": "demo", "_ns_": f"app{i % 5}", "instance": f"i{i}"}


def batches(n_series: int, n_samples: int, per_call: int, start: int = 0) -> Iterator[SampleBatch]:
    """Scrapes of `n_series` series, `per_call` scrapes per batch, 15 s apart from `start`."""
    series = [labels(i) for i in range(n_series)]
    rng = np.random.default_rng(7)
    for k in range(start, start + n_samples, per_call):
        m = min(per_call, start + n_samples - k)
        idx = np.tile(np.arange(n_series, dtype=np.int32), m)
        ts = np.repeat(T0 + 15_000 * np.arange(k, k + m, dtype=np.int64), n_series)
        yield SampleBatch(series, idx, ts, rng.normal(size=len(ts)))


def expected(n_series: int, n_samples: int) -> dict[str, np.ndarray]:
    ts = T0 + 15_000 * np.arange(n_samples, dtype=np.int64)
    return {encode_part_key(labels(i)): ts for i in range(n_series)}


def read_back(c: FiloPyCluster, ds: Dataset) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for held in c.client.series_samples(ds.ref).values():
        for key, ts in held.items():
            assert key not in out, f"series {key} held by two nodes"
            out[key] = ts
    return out


def wait_exact(c: FiloPyCluster, ds: Dataset, want: dict[str, np.ndarray], timeout_s: float = 90):
    total = sum(len(v) for v in want.values())
    deadline = time.monotonic() + timeout_s
    got: dict[str, np.ndarray] = {}
    while time.monotonic() < deadline:
        got = read_back(c, ds)
        if sum(len(v) for v in got.values()) >= total and c.client.shard_map(ds.name).is_healthy():
            break
        time.sleep(0.5)
    assert set(got) == set(want)
    for key, ts in want.items():
        assert np.array_equal(np.sort(got[key]), ts), f"{key}: {len(got[key])} vs {len(ts)}"
        assert len(np.unique(got[key])) == len(got[key]), f"{key} has duplicates"


def produce_pausing(
    ds: Dataset, bootstrap: str, all_batches: list[SampleBatch], pause_at: int
) -> tuple[threading.Thread, threading.Event]:
    """A thread sending the batches through the gateway that stops at `pause_at` until the
    event is set (a node killed, up to 120 s), so the rest streams in while the shards move."""
    resume = threading.Event()

    def produce() -> None:
        with Gateway(ds, bootstrap) as gw:
            for i, b in enumerate(all_batches):
                if i == pause_at:
                    gw.flush()
                    resume.wait(120)
                gw.send_batch(b)
                time.sleep(0.01)

    producer = threading.Thread(target=produce)
    producer.start()
    return producer, resume


def start_three(c: FiloPyCluster, ds: Dataset) -> list:
    nodes = [c.add_node() for _ in range(3)]
    c.wait_for("3 members", lambda: len(c.client.members()) == 3)
    activate(c, ds)
    return nodes


def activate(c: FiloPyCluster, ds: Dataset) -> None:
    assert c.client.setup_dataset(ds)
    c.wait_for("all shards active", lambda: c.client.shard_map(ds.name).is_healthy(), 60)


def test_binary_samples_are_ingested_exactly(shared: FiloPyCluster, kafka_bootstrap: str) -> None:
    c = shared
    ds = dataset(kafka_bootstrap)
    activate(c, ds)
    n_series, n_samples = 1000, 200  # 200k samples
    with Gateway(ds, kafka_bootstrap) as gw:
        for b in batches(n_series, n_samples, per_call=10):
            gw.send_batch(b)
    wait_exact(c, ds, expected(n_series, n_samples))


def test_line_protocol_samples_are_ingested_exactly(
    shared: FiloPyCluster, kafka_bootstrap: str
) -> None:
    c = shared
    ds = dataset(kafka_bootstrap, RecordFormat.INFLUX)
    activate(c, ds)
    n_series, n_samples = 200, 100
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    for k in range(n_samples):
        lines: dict[int, list[str]] = {}
        for i in range(n_series):
            lb = labels(i)
            shard = shard_for_series(ds, lb)
            tags = ",".join(f"{t}={v}" for t, v in sorted(lb.items()) if t != "_metric_")
            ns = (T0 + 15_000 * k) * 1_000_000
            lines.setdefault(shard, []).append(f"{lb['_metric_']},{tags} value={k}.5 {ns}")
        for shard, ls in lines.items():
            producer.produce(ds.topic, "\n".join(ls).encode(), partition=shard)
        producer.poll(0)
    assert producer.flush(30) == 0
    wait_exact(c, ds, expected(n_series, n_samples))


def test_malformed_messages_are_counted_and_skipped(
    shared: FiloPyCluster, kafka_bootstrap: str
) -> None:
    c = shared
    ds = dataset(kafka_bootstrap)
    activate(c, ds)
    n_series, n_samples = 100, 50
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    with Gateway(ds, kafka_bootstrap) as gw:
        for k, b in enumerate(batches(n_series, n_samples, per_call=5)):
            gw.send_batch(b)
            gw.flush()
            for shard in range(ds.num_shards):  # garbage between good messages, every shard
                producer.produce(ds.topic, f"not a batch {k}".encode(), partition=shard)
            assert producer.flush(30) == 0
    wait_exact(c, ds, expected(n_series, n_samples))
    undecodable = sum(
        stats["bad_records"].get("undecodable", 0)
        for per_shard in c.client.ingest_stats(ds.ref).values()
        for stats in per_shard.values()
    )
    assert undecodable == ds.num_shards * (n_samples // 5)


def test_stopped_shard_restarted_elsewhere_catches_up_exactly(
    shared: FiloPyCluster, kafka_bootstrap: str
) -> None:
    c = shared
    ds = dataset(kafka_bootstrap)
    activate(c, ds)
    n_series = 300
    with Gateway(ds, kafka_bootstrap) as gw:
        for b in batches(n_series, 50, per_call=10):
            gw.send_batch(b)
    wait_exact(c, ds, expected(n_series, 50))

    before = c.client.shard_map(ds.name)
    shard = 0
    owner = before.owner(shard)
    c.client.stop_shards(ds.name, [shard])
    c.wait_for("shard 0 down", lambda: c.client.shard_map(ds.name).owner(shard) is None)
    with Gateway(ds, kafka_bootstrap) as gw:  # shard 0's partition grows while nobody reads it
        for b in batches(n_series, 50, per_call=10, start=50):
            gw.send_batch(b)
    other = next(n for n in c.client.members() if n != owner and before.shards_for_node(n))
    # Make room on the other node, then start shard 0 there.
    room = before.shards_for_node(other)[-1]
    c.client.stop_shards(ds.name, [room])
    c.wait_for("room made", lambda: c.client.shard_map(ds.name).owner(room) is None)
    c.client.start_shards(ds.name, other, [shard])
    c.client.start_shards(ds.name, owner, [room])
    c.wait_for(
        "shard 0 active on the other node",
        lambda: (m := c.client.shard_map(ds.name)).owner(shard) == other and m.is_healthy(),
        60,
    )
    wait_exact(c, ds, expected(n_series, 100))


def test_cli_ingest_sends_the_synthetic_workload_exactly(
    shared: FiloPyCluster, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from filopy.cli import app
    from ingest.workload import series_labels

    c = shared
    ds = dataset(kafka_bootstrap)
    activate(c, ds)
    monkeypatch.setenv("FILOPY_RAY__NAMESPACE", c.settings.ray.namespace)
    args = ["ingest", ds.name, "--series", "120", "--scrapes", "30", "--start-ms", str(T0)]
    result = CliRunner().invoke(app, [*args, "--address", c.ray.address])
    assert result.exit_code == 0, result.output
    assert "sent 3,600 samples" in result.output
    ts = T0 + 15_000 * np.arange(30, dtype=np.int64)
    wait_exact(c, ds, {encode_part_key(series_labels(i)): ts for i in range(120)})


def test_node_killed_mid_ingestion_loses_and_doubles_nothing(
    kafka_cluster, kafka_bootstrap: str
) -> None:
    import ray

    c = kafka_cluster
    ds = dataset(kafka_bootstrap)
    nodes = start_three(c, ds)
    spare = c.add_node()
    c.wait_for("the spare joined", lambda: spare.node_id in c.client.members())
    n_series, n_samples = 500, 400

    all_batches = list(batches(n_series, n_samples, per_call=5))
    half = len(all_batches) // 2
    killed = threading.Event()

    def produce() -> None:
        with Gateway(ds, kafka_bootstrap) as gw:
            for i, b in enumerate(all_batches):
                if i == half:
                    gw.flush()
                    killed.wait(120)  # the second half streams in while the shards move
                gw.send_batch(b)
                time.sleep(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    # Wait until every group of every shard has a checkpoint, so the victim's shards have
    # checkpoints to resume from (whatever the machine's load), then kill mid-stream.
    meta, columns = open_stores(c.settings)
    try:
        groups = set(range(c.settings.ingest.groups_per_shard))
        c.wait_for(
            "every group checkpointed",
            lambda: all(
                set(meta.read_checkpoints(ds.ref, s)) == groups for s in range(ds.num_shards)
            ),
            60,
        )
    finally:
        meta.close()
        columns.close()
    victim = max(nodes, key=lambda n: len(c.client.shard_map(ds.name).shards_for_node(n.node_id)))
    moved = c.client.shard_map(ds.name).shards_for_node(victim.node_id)
    c.ray.remove_node(victim)
    killed.set()
    producer.join(timeout=120)
    c.wait_for("the victim gone", lambda: victim.node_id not in c.client.members())
    wait_exact(c, ds, expected(n_series, n_samples), timeout_s=120)
    # The new owner resumed from the victim's checkpoints, not from the start of the partition.
    h = ray.get_actor(node_actor_name(spare.node_id), namespace=c.settings.ray.namespace)
    stats = ray.get(h.ingest_stats.remote(ds.ref))
    assert sorted(stats) == moved
    assert all(stats[s]["replayed_from"] > 0 for s in moved), stats
