"""A node that cannot start its shards retries them (issue 11, item 3), on a real Ray cluster
ingesting from the real Kafka into SQLite or Cassandra.

The store is cut off before the node joins: for SQLite another connection holds the write lock
(`BEGIN EXCLUSIVE`) past the busy timeout, so the node cannot open the store (its schema
check writes); for Cassandra the whole cluster talks to it through a TCP proxy on 127.0.0.1 that
the test freezes (SIGSTOP), so the node's connection attempt times out. The node gets shards
anyway, shows them Degraded while it retries, and starts them by itself once the store is back,
ingesting everything exactly once. A node that keeps failing gives its shards up after
`ingest.start_max_attempts`, and the singleton moves them to a node that can run them.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray

from coordinator.client import FiloPyClient
from coordinator.cluster_actor import start_cluster_actor
from coordinator.local_cluster import LocalRayCluster
from coordinator.names import node_actor_name
from core.dataset import Dataset, SourceSettings
from core.shard_status import Active, Degraded
from ingest.gateway import Gateway
from store import encode_part_key, open_stores
from tests.durable import durable_series
from tests.ingest.tcp_proxy import TcpProxy
from tests.runtime.conftest import FiloPyCluster, cluster_settings

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

T0 = 1_700_000_000_000
SERIES = 16
SHARDS = 4
PER_ROUND = SERIES * 10


@contextmanager
def _cluster(
    ray_cluster: LocalRayCluster,
    tmp_path: Path,
    kafka: str,
    backend: str,
    source: str = "kafka",
    **ingest: Any,
) -> Iterator[tuple[FiloPyCluster, Callable[[], None], Callable[[], None]]]:
    """A FiloPy cluster without nodes yet, and how to cut its store off and restore it."""
    settings = cluster_settings(
        tmp_path,
        source,
        flush_interval_s=1.0,
        groups_per_shard=2,
        store_retry_initial_s=0.2,
        store_retry_max_s=1.0,
        **ingest,
        kafka_bootstrap=kafka,
    )
    settings = settings.model_copy(
        update={
            "store": settings.store.model_copy(
                update={"backend": backend, "sqlite_busy_timeout_s": 0.5}
            ),
        }
    )
    if backend == "sqlite":
        locker = sqlite3.connect(settings.store.sqlite_path, isolation_level=None, timeout=10)
        try:
            yield (
                _start(ray_cluster, settings),
                lambda: locker.execute("BEGIN EXCLUSIVE"),
                lambda: locker.execute("ROLLBACK") if locker.in_transaction else None,
            )
        finally:
            if locker.in_transaction:
                locker.execute("ROLLBACK")
            locker.close()
        return
    with TcpProxy("127.0.0.1", 9042) as proxy:
        settings = settings.model_copy(
            update={
                "cassandra": settings.cassandra.model_copy(
                    update={
                        "contact_points": ("127.0.0.1",),
                        "port": proxy.port,
                        "keyspace": "filopy_start_retry",
                        "connect_timeout_s": 2.0,
                        "request_timeout_s": 2.0,
                    }
                )
            }
        )
        # The keyspace outlives the test: forget earlier runs' datasets, or the singleton
        # would recover and assign them too.
        meta, columns = open_stores(settings)
        try:
            for old in meta.list_datasets():
                meta.delete_dataset(old.ref)
        finally:
            meta.close()
            columns.close()
        yield _start(ray_cluster, settings), proxy.cut, proxy.restore


def _start(ray_cluster: LocalRayCluster, settings: Any) -> FiloPyCluster:
    actor = start_cluster_actor(settings)
    ray.get(actor.ready.remote(), timeout=60)
    return FiloPyCluster(ray_cluster, settings, FiloPyClient(actor, settings), actor)


def _labels(i: int) -> dict[str, str]:
    return {"_metric_": "m", "_ws_": "w", "_ns_": f"app{i % 4}", "instance": f"i{i}"}


def _send(ds: Dataset, rounds: range) -> None:
    with Gateway(ds) as gw:
        for r in rounds:
            gw.send(
                [
                    (_labels(i), T0 + 1000 * (10 * r + k), float(k))
                    for i in range(SERIES)
                    for k in range(10)
                ]
            )
        gw.flush()


def _durable(c: FiloPyCluster, ds: Dataset) -> int:
    """Samples ingested and durable in the store (in chunks or a flushed open-buffer snapshot)."""
    return sum(
        st["memstore"].ingested - st["unflushed_samples"]
        for by_shard in c.client.ingest_stats(ds.ref).values()
        for st in by_shard.values()
    )


def _statuses(c: FiloPyCluster, ds: Dataset) -> list[Any]:
    m = c.client.shard_map(ds.name)
    return [m.status(s) for s in range(SHARDS)]


def _assert_stored_exactly_once(c: FiloPyCluster, ds: Dataset, rounds: int) -> None:
    meta, columns = open_stores(c.settings)
    try:
        want = T0 + 1000 * np.arange(10 * rounds, dtype=np.int64)
        stored: dict[str, np.ndarray] = {}
        for s in range(SHARDS):
            for key, (ts, _) in durable_series(meta, columns, ds, s).items():
                stored[key] = ts
        assert set(stored) == {encode_part_key(_labels(i)) for i in range(SERIES)}
        for key, ts in stored.items():
            assert np.array_equal(ts, want), f"{key}: {len(ts)} samples"  # none lost, none twice
    finally:
        meta.close()
        columns.close()


def _dataset(kafka: str, min_num_nodes: int = 1) -> Dataset:
    return Dataset(
        name=f"sr{uuid.uuid4().hex[:8]}",
        num_shards=SHARDS,
        min_num_nodes=min_num_nodes,
        source=SourceSettings(bootstrap_servers=kafka),
    )


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("cassandra", marks=pytest.mark.cassandra)]
)
def test_a_node_that_cannot_open_the_store_shows_degraded_then_starts_by_itself(
    ray_cluster: LocalRayCluster, tmp_path: Path, kafka_bootstrap: str, backend: str
) -> None:
    with _cluster(ray_cluster, tmp_path, kafka_bootstrap, backend) as (c, cut, restore):
        ds = _dataset(kafka_bootstrap)
        assert c.client.setup_dataset(ds)  # no member yet: nothing assigned
        _send(ds, range(0, 3))
        cut()
        try:
            node = c.add_node().node_id
            c.wait_for("the node joined", lambda: c.client.members() == [node], 30)
            # It got the shards, cannot start them, and says so: Degraded, not Assigned or Error.
            c.wait_for(
                "degraded shards",
                lambda: all(isinstance(st, Degraded) for st in _statuses(c, ds)),
                60,
            )
            mapper = c.client.shard_map(ds.name)
            assert mapper.shards_for_node(node) == list(range(SHARDS))
            for s in range(SHARDS):
                assert "cannot open the store" in mapper.status(s).message  # type: ignore[attr-defined]
            coordinator = ray.get_actor(node_actor_name(node), namespace=c.settings.ray.namespace)
            # Retried with backoff (several attempts so far), running nothing meanwhile.
            c.wait_for(
                "several attempts",
                lambda: all(
                    n >= 3
                    for n in ray.get(coordinator.pending_shards.remote())
                    .get(ds.name, {0: 0})
                    .values()
                ),
                60,
            )
            assert ray.get(coordinator.running_shards.remote()) == {}
            _send(ds, range(3, 5))
        finally:
            restore()
        # The store is back: the shards start, replay and go Active with no operator action.
        c.wait_for(
            "all active",
            lambda: all(isinstance(st, Active) for st in _statuses(c, ds)),
            90,
        )
        assert ray.get(coordinator.pending_shards.remote()) == {}
        assert ray.get(coordinator.running_shards.remote()) == {ds.name: list(range(SHARDS))}
        assert c.client.shard_map(ds.name).shards_for_node(node) == list(range(SHARDS))
        assert c.client.reassignment_stats().get(ds.name, (0, 0)) == (0, 0)
        c.wait_for("all durable", lambda: _durable(c, ds) == 5 * PER_ROUND, 60)
        _assert_stored_exactly_once(c, ds, 5)


def test_a_node_failing_past_start_max_attempts_gives_its_shards_to_one_that_can(
    ray_cluster: LocalRayCluster, tmp_path: Path, kafka_bootstrap: str
) -> None:
    with _cluster(ray_cluster, tmp_path, kafka_bootstrap, "sqlite", start_max_attempts=3) as (
        c,
        cut,
        restore,
    ):
        a = c.add_node().node_id
        c.wait_for("node a joined", lambda: c.client.members() == [a], 30)
        ds = _dataset(kafka_bootstrap)
        assert c.client.setup_dataset(ds)
        c.wait_for("active on a", lambda: all(isinstance(st, Active) for st in _statuses(c, ds)))
        c.client.stop_shards(ds.name, [2, 3])  # an operator frees two shards for a new node
        _send(ds, range(0, 3))
        cut()
        try:
            b = c.add_node().node_id
            c.wait_for("node b joined", lambda: b in c.client.members(), 30)
            c.client.start_shards(ds.name, b, [2, 3])
            # b cannot open the store; after 3 attempts it gives the shards up and the singleton
            # moves them to a, whose store is open (its ingesters ride the lock out, Degraded).
            moved = c.wait_for(
                "shards 2 and 3 moved to a",
                lambda: (m := c.client.shard_map(ds.name)).shards_for_node(a) == [0, 1, 2, 3] and m,
                60,
            )
            assert moved.shards_for_node(b) == []
            assert c.client.reassignment_stats()[ds.name] == (2, 0)
            coordinator = ray.get_actor(node_actor_name(b), namespace=c.settings.ray.namespace)
            assert ray.get(coordinator.pending_shards.remote()) == {}
            _send(ds, range(3, 5))
        finally:
            restore()
        c.wait_for(
            "all active on a",
            lambda: (
                all(isinstance(st, Active) for st in _statuses(c, ds))
                and c.client.shard_map(ds.name).shards_for_node(a) == [0, 1, 2, 3]
            ),
            90,
        )
        c.wait_for("all durable", lambda: _durable(c, ds) == 5 * PER_ROUND, 60)
        _assert_stored_exactly_once(c, ds, 5)


def test_an_ingester_that_cannot_start_for_a_store_outage_is_retried_until_it_can(
    ray_cluster: LocalRayCluster, tmp_path: Path, kafka_bootstrap: str
) -> None:
    """The node's store is open, but starting an ingester needs the store (claiming the shard's
    epoch, here with `ingest.source = "none"`) and it is locked: Degraded and retried, not an
    IngestionError that would leave the shard in Error."""
    with _cluster(ray_cluster, tmp_path, kafka_bootstrap, "sqlite", "none") as (c, cut, restore):
        a = c.add_node().node_id
        c.wait_for("node a joined", lambda: c.client.members() == [a], 30)
        ds = _dataset(kafka_bootstrap)
        assert c.client.setup_dataset(ds)
        c.wait_for("active", lambda: all(isinstance(st, Active) for st in _statuses(c, ds)))
        c.client.stop_shards(ds.name, [2, 3])
        coordinator = ray.get_actor(node_actor_name(a), namespace=c.settings.ray.namespace)
        cut()
        try:
            c.client.start_shards(ds.name, a, [2, 3])
            c.wait_for(
                "shards 2 and 3 degraded",
                lambda: all(isinstance(st, Degraded) for st in _statuses(c, ds)[2:]),
                60,
            )
            message = c.client.shard_map(ds.name).status(2).message  # type: ignore[attr-defined]
            assert "the ingester failed to start: StoreTimeout" in message, message
            c.wait_for(
                "retried",
                lambda: all(
                    n >= 2
                    for n in ray.get(coordinator.pending_shards.remote())
                    .get(ds.name, {0: 0})
                    .values()
                ),
                60,
            )
            assert ray.get(coordinator.running_shards.remote()) == {ds.name: [0, 1]}
        finally:
            restore()
        c.wait_for("all active", lambda: all(isinstance(st, Active) for st in _statuses(c, ds)))
        assert c.client.shard_map(ds.name).shards_for_node(a) == [0, 1, 2, 3]
        assert ray.get(coordinator.running_shards.remote()) == {ds.name: [0, 1, 2, 3]}
        assert c.client.reassignment_stats().get(ds.name, (0, 0)) == (0, 0)
