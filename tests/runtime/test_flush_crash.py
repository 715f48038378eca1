"""A node killed while it flushes, on real Kafka and a real Ray cluster, on both stores.

Flushes seal only complete chunks and store the rest of each flush group's open buffers as a
snapshot beside the checkpoint (docs/memstore.md). Here flushes run every few tens of
milliseconds on every shard, so the kill (the victim's Ray node removed: its processes get
SIGKILL) lands in the middle of some flush: after a chunk write, between chunks and part keys,
before or after a snapshot. The new owners load the snapshots, replay from the checkpoints, and
every series reads back (memstore + ColumnStore, nothing de-duplicated) with exactly the samples
produced.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from coordinator.local_cluster import LocalRayCluster
from coordinator.names import node_actor_name
from core.dataset import SourceSettings
from filopy import Dataset
from store import open_stores
from tests.ingest.test_cluster_ingest import (
    batches,
    expected,
    produce_pausing,
    start_three,
    wait_exact,
)
from tests.runtime.conftest import FiloPyCluster, cluster_settings, on_backend, start_cluster

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

SERIES = 240
SCRAPES = 560  # 15 s apart: 2 h 20 min, so chunks seal by time bucket (1 h) mid-stream
PER_CALL = 4


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.cassandra)])
def flushing_cluster(
    request: pytest.FixtureRequest,
    ray_cluster: LocalRayCluster,
    tmp_path: Path,
    kafka_bootstrap: str,
) -> Iterator[FiloPyCluster]:
    settings = cluster_settings(tmp_path, "kafka", flush_interval_s=0.2, groups_per_shard=4)
    yield start_cluster(ray_cluster, on_backend(settings, request, kafka_bootstrap))


def test_a_node_killed_while_flushing_loses_and_doubles_nothing(
    flushing_cluster: FiloPyCluster, kafka_bootstrap: str
) -> None:
    c = flushing_cluster
    ds = Dataset(
        name=f"fc{uuid.uuid4().hex[:8]}",
        num_shards=8,
        min_num_nodes=3,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    nodes = start_three(c, ds)
    spare = c.add_node()
    c.wait_for("the spare joined", lambda: spare.node_id in c.client.members())

    all_batches = list(batches(SERIES, SCRAPES, per_call=PER_CALL))
    # Paused past the first hour: sealed chunks and open buffers.
    producer, killed = produce_pausing(ds, kafka_bootstrap, all_batches, len(all_batches) * 3 // 4)
    victim = max(nodes, key=lambda n: len(c.client.shard_map(ds.name).shards_for_node(n.node_id)))
    moved = c.client.shard_map(ds.name).shards_for_node(victim.node_id)
    meta, column = open_stores(c.settings)
    try:
        # Kill once the victim's shards have snapshots at their checkpoints (so the new owner
        # must load them) and chunks sealed by the hour's end: every part of a flush is in use.
        def snapshots_in_use() -> bool:
            found = 0
            for s in moved:
                cps = meta.read_checkpoints(ds.ref, s)
                if len(cps) < c.settings.ingest.groups_per_shard:
                    return False
                found += any(column.read_open_snapshot(ds.ref, s, g, o) for g, o in cps.items())
            return found == len(moved) and bool(column.list_part_keys(ds.ref, moved[0]))

        c.wait_for("snapshots and sealed chunks of the victim's shards", snapshots_in_use, 90)
    finally:
        meta.close()
        column.close()
    c.ray.remove_node(victim)  # SIGKILL for its processes, mid-flush (flushes run constantly)
    killed.set()
    producer.join(timeout=120)
    c.wait_for("the victim gone", lambda: victim.node_id not in c.client.members())
    wait_exact(c, ds, expected(SERIES, SCRAPES), timeout_s=150)
    h = ray.get_actor(node_actor_name(spare.node_id), namespace=c.settings.ray.namespace)
    stats = ray.get(h.ingest_stats.remote(ds.ref))
    assert sorted(stats) == moved
    # The new owner resumed from the victim's checkpoints and loaded its open buffers from the
    # snapshots, instead of replaying the partition from its start.
    assert all(stats[s]["replayed_from"] > 0 for s in moved), stats
    assert all(stats[s]["open_samples_loaded"] > 0 for s in moved), stats
