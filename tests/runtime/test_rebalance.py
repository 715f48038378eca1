"""Rebalancing onto joining nodes through the drain protocol, on real Kafka and a real Ray
cluster: new nodes take an even share, every move drains first (nothing replayed, nothing lost
or doubled, epochs increasing), and a query loop running throughout never fails."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from coordinator.client import FiloPyClient
from coordinator.cluster_actor import start_cluster_actor
from coordinator.names import node_actor_name
from filopy import Dataset, ShardAssignmentStarted, ShardEvent
from filopy.dataset import SourceSettings
from ingest.gateway import Gateway
from tests.ingest.test_cluster_ingest import T0, batches, expected, wait_exact
from tests.runtime.conftest import FiloPyCluster, LocalRayCluster, cluster_settings

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

SHARDS = 16
SERIES = 64
ROUNDS = 160  # scrapes per series; written in steps while the cluster rebalances


@pytest.fixture
def rebalancing_cluster(
    ray_cluster: LocalRayCluster, tmp_path: Path, kafka_bootstrap: str
) -> Iterator[FiloPyCluster]:
    settings = cluster_settings(
        tmp_path, "kafka", rebalance=True, flush_interval_s=1.0, groups_per_shard=4
    )
    settings = settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"bootstrap_servers": kafka_bootstrap}),
            "rebalance": settings.rebalance.model_copy(
                update={"interval_s": 1.0, "max_concurrent_moves": 2, "drain_timeout_s": 60.0}
            ),
        }
    )
    actor = start_cluster_actor(settings)
    ray.get(actor.ready.remote(), timeout=60)
    yield FiloPyCluster(ray_cluster, settings, FiloPyClient(actor, settings), actor)


def test_joining_nodes_get_an_even_share_with_no_replay_no_loss_and_no_failed_query(
    rebalancing_cluster: FiloPyCluster, kafka_bootstrap: str
) -> None:
    c = rebalancing_cluster
    ds = Dataset(
        name=f"rebal{uuid.uuid4().hex[:8]}",
        num_shards=SHARDS,
        min_num_nodes=2,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    first = [c.add_node() for _ in range(2)]
    c.wait_for("2 members", lambda: len(c.client.members()) == 2)
    assert c.client.setup_dataset(ds)
    c.wait_for("all shards active", lambda: c.client.shard_map(ds.name).is_healthy(), 60)
    epochs_before = _epochs(c, ds)
    before = c.client.shard_map(ds.name)
    subscription = c.client.subscribe(ds.name)

    # A steady producer and a query loop, both running through the whole rebalance.
    stop = threading.Event()
    errors: list[str] = []
    answered = [0]

    def produce() -> None:
        with Gateway(ds) as gw:
            for k in range(0, ROUNDS, 4):
                gw.send_batch(next(batches(SERIES, 4, 4, start=k)))
                gw.flush()
                time.sleep(0.1)

    def query_loop() -> None:
        while not stop.is_set():
            try:
                c.client.query(ds.name, "count(m1)", T0 + 15_000 * ROUNDS)
                answered[0] += 1
            except Exception as e:  # any failure is a failed query
                errors.append(f"{type(e).__name__}: {e}")
            time.sleep(0.05)

    producer = threading.Thread(target=produce)
    querier = threading.Thread(target=query_loop)
    producer.start()
    querier.start()
    try:
        joined = [c.add_node() for _ in range(2)]
        c.wait_for("4 members", lambda: len(c.client.members()) == 4, 60)

        def spread_evenly() -> bool:
            m = c.client.shard_map(ds.name)
            return m.is_healthy() and all(
                m.num_shards_for_node(n.node_id) == SHARDS // 4 for n in first + joined
            )

        c.wait_for("4 shards on each of the 4 nodes", spread_evenly, 120)
        producer.join(120)
    finally:
        stop.set()
        querier.join(60)
        producer.join(60)
        c.client.queries().close()  # its map subscriptions, before Ray goes

    assert not errors, errors[:3]
    assert answered[0] > 0
    wait_exact(c, ds, expected(SERIES, ROUNDS))  # nothing lost, nothing doubled

    # Every move went through a drain: its phases in order, none forced, and the new owners
    # replayed nothing (every flush group was checkpointed at the old owner's last offset)
    # under a new, higher epoch. (A periodic resync snapshot may stand in for some events.)
    final = c.client.shard_map(ds.name)
    moved = [s for s in range(SHARDS) if final.owner(s) != before.owner(s)]
    assert len(moved) == SHARDS // 2  # 8 of 16 shards moved to the 2 new nodes
    assert {final.owner(s) for s in moved} == {n.node_id for n in joined}
    kinds: dict[int, list[str]] = {}
    while True:
        try:
            update = subscription.next(0.5)
        except TimeoutError:
            break
        if isinstance(update, ShardEvent):
            kinds.setdefault(update.shard, []).append(type(update).__name__)
            if isinstance(update, ShardAssignmentStarted):
                assert "forced" not in update.reason, update
    phases = ["ShardHandoffStarted", "ShardDrained", "IngestionStarted"]
    seen_whole = 0
    for s in moved:
        got = [k for k in kinds.get(s, []) if k in phases]
        if "ShardHandoffStarted" in got:
            i = got.index("ShardHandoffStarted")
            assert got[i : i + 3] == phases[: len(got[i : i + 3])], (s, got)
            seen_whole += got[i : i + 3] == phases
    assert seen_whole > 0, kinds
    print(f"\n{len(moved)} moves, {seen_whole} seen phase by phase, {answered[0]} queries answered")
    epochs_after = _epochs(c, ds)
    for s in moved:
        assert epochs_after[s] > epochs_before[s]
    stats = {
        s: st for per_node in c.client.ingest_stats(ds.name).values() for s, st in per_node.items()
    }
    replayed = {s: stats[s]["replayed_offsets"] for s in moved}
    assert replayed == dict.fromkeys(moved, 0), replayed
    skipped = {s: stats[s]["memstore"].skipped_replay for s in moved}
    assert skipped == dict.fromkeys(moved, 0), skipped
    subscription.unsubscribe()


def _epochs(c: FiloPyCluster, ds: Dataset) -> dict[int, int]:
    out: dict[int, int] = {}
    for handle in _coordinators(c):
        for shard, epoch in ray.get(handle.epochs.remote()).get(ds.name, {}).items():
            if epoch is not None:
                out[shard] = max(out.get(shard, 0), epoch)
    return out


def _coordinators(c: FiloPyCluster) -> list:
    return [
        ray.get_actor(node_actor_name(n), namespace=c.settings.ray.namespace)
        for n in c.client.members()
    ]
