"""The ownership history's "replayed" figure, checked against what the ingesters' own tenure
logs say they read, on real Kafka and a real Ray cluster (issue 30, item 8).

`replayed_offsets` counts the offsets a new owner reads at start that an owner before it had
read: exact after an owner that let go (it notes where it stopped). A killed owner leaves no
note and its log dies with it: the figure is then everything below the partition's end offset
at the new owner's claim, exact here because the producer stops and the old owner reads
everything before the kill (its running tenure, read just before, says how far it got). Three
cases, each with two nodes holding the dataset and a spare that takes over:

(a) a drain, the producer running throughout: the old owner flushed and checkpointed all it
    read, the new one starts right after it: 0;
(b) a node killed after its flushes, having read more since: the offsets from the lowest
    checkpoint on;
(c) a node killed before any flush: everything it read, from the partition's first offset.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from confluent_kafka import Consumer, TopicPartition

from coordinator.local_cluster import LocalRayCluster
from coordinator.names import node_actor_name
from core.dataset import SourceSettings
from filopy import Dataset
from ingest.gateway import Gateway
from ingest.tenure import Tenure
from store import OwnershipChange, open_stores
from tests.ingest.test_cluster_ingest import batches
from tests.runtime.conftest import FiloPyCluster, cluster_settings, start_cluster

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

SHARDS = 4
SERIES = 64
GROUPS = 4


def _cluster(
    ray_cluster: LocalRayCluster, tmp_path: Path, kafka: str, flush_interval_s: float
) -> FiloPyCluster:
    settings = cluster_settings(
        tmp_path,
        "kafka",
        flush_interval_s=flush_interval_s,
        groups_per_shard=GROUPS,
        kafka_bootstrap=kafka,
    )
    settings = settings.model_copy(
        update={
            "rebalance": settings.rebalance.model_copy(
                update={"interval_s": 0.5, "max_concurrent_moves": 2, "move_cooldown_s": 0.0}
            ),
        }
    )
    return start_cluster(ray_cluster, settings)


@pytest.fixture
def flushing_often(
    ray_cluster: LocalRayCluster, tmp_path: Path, kafka_bootstrap: str
) -> Iterator[FiloPyCluster]:
    """Each flush group's turn every 2 s: long enough to kill between two of them."""
    yield _cluster(ray_cluster, tmp_path, kafka_bootstrap, flush_interval_s=8.0)


@pytest.fixture
def never_flushing(
    ray_cluster: LocalRayCluster, tmp_path: Path, kafka_bootstrap: str
) -> Iterator[FiloPyCluster]:
    """The first flush 15 min after a shard starts: the test is long over by then."""
    yield _cluster(ray_cluster, tmp_path, kafka_bootstrap, flush_interval_s=3600.0)


def _start(c: FiloPyCluster, kafka: str) -> tuple[Dataset, Any, Any]:
    """The dataset on two nodes (2 shards each, the most either may hold), then a spare that
    gets none until a shard has to move. Returns (dataset, first node, spare)."""
    ds = Dataset(
        name=f"rp{uuid.uuid4().hex[:8]}",
        num_shards=SHARDS,
        min_num_nodes=2,
        source=SourceSettings(bootstrap_servers=kafka),
    )
    a, _ = c.add_node(), c.add_node()
    c.wait_for("2 members", lambda: len(c.client.members()) == 2, 60)
    assert c.client.setup_dataset(ds)
    c.wait_for("all shards active", lambda: c.client.shard_map(ds.name).is_healthy(), 90)
    spare = c.add_node()
    c.wait_for("the spare joined", lambda: spare.node_id in c.client.members(), 60)
    assert c.client.shard_map(ds.name).shards_for_node(spare.node_id) == []
    return ds, a, spare


def _produce(ds: Dataset, kafka: str, rounds: range) -> None:
    """Scrapes `rounds` of every series, 2 per message, all acknowledged on return."""
    with Gateway(ds, kafka) as gw:
        for b in batches(SERIES, len(rounds), per_call=2, start=rounds.start):
            gw.send_batch(b)
        gw.flush()


def _ends(ds: Dataset, kafka: str, shards: list[int]) -> dict[int, int]:
    """Each partition's end offset now."""
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        return {
            s: consumer.get_watermark_offsets(TopicPartition(ds.topic, s), timeout=10)[1]
            for s in shards
        }
    finally:
        consumer.close()


def _tenures(c: FiloPyCluster, ds: Dataset) -> dict[int, list[Tenure]]:
    """Per shard, every member's log of holding it (finished and running), by epoch."""
    held: dict[int, dict[int, Tenure]] = {}
    for node in c.client.members():
        try:
            handle = ray.get_actor(node_actor_name(node), namespace=c.settings.ray.namespace)
            logged = ray.get(handle.tenures.remote(ds.name), timeout=30)
        except (ValueError, ray.exceptions.RayError):
            continue  # a node going away: its log is gone with it
        for t in logged:
            # A drained ingester is both in the finished log and still registered: keep one.
            seen = held.setdefault(t.shard, {})
            if t.epoch not in seen or t.released_at is not None:
                seen[t.epoch] = t
    return {s: sorted(by_epoch.values(), key=lambda t: t.epoch) for s, by_epoch in held.items()}


def _held_by(c: FiloPyCluster, ds: Dataset, node: str, shard: int) -> Tenure | None:
    return next((t for t in _tenures(c, ds).get(shard, []) if t.node == node), None)


def _caught_up(c: FiloPyCluster, ds: Dataset, node: str, kafka: str) -> dict[int, Tenure]:
    """Wait until `node`'s ingesters have read their partitions to the end (nothing is being
    produced), and return their running tenures, which say so."""
    shards = c.client.shard_map(ds.name).shards_for_node(node)
    ends = _ends(ds, kafka, shards)
    assert all(ends[s] > 0 for s in shards), ends

    def read_all() -> dict[int, Tenure] | None:
        held = {s: t for s in shards if (t := _held_by(c, ds, node, s)) is not None}
        done = len(held) == len(shards) and all(t.next_offset == ends[s] for s, t in held.items())
        return held if done else None

    return c.wait_for(f"{node[:8]} read its partitions to the end", read_all, 90)


def _moved_rows(
    c: FiloPyCluster, ds: Dataset, shards: list[int], source: str, target: str
) -> dict[int, OwnershipChange]:
    """Wait for the history's row of each shard's move from `source` to `target`, complete
    with the new owner's epoch and replayed offsets (it went live). The store keeps a failover
    as two rows, `source` to nobody and nobody to `target`."""

    def rows() -> dict[int, OwnershipChange] | None:
        found = {
            h.shard: h
            for h in c.client.history(ds.name, limit=1000)
            if h.from_node in (source, None) and h.to_node == target and h.epoch is not None
        }
        return found if set(found) == set(shards) else None

    try:
        return c.wait_for("the moves in the history, their new owners live", rows, 120)
    except AssertionError as e:
        raise AssertionError(f"{e}: {c.client.history(ds.name, limit=1000)}") from None


def _check(
    rows: dict[int, OwnershipChange],
    old: dict[int, Tenure],
    new: dict[int, Tenure],
    exact: Callable[[Tenure, Tenure], int],
) -> dict[int, int]:
    """Each row's replayed figure and epoch against the tenures; returns the figures."""
    for s, row in rows.items():
        o, n = old[s], new[s]
        assert o.first_offset is not None and o.next_offset is not None, o
        assert n.first_offset is not None and o.first_offset <= n.first_offset, (o, n)
        assert n.epoch > o.epoch and row.epoch == n.epoch, (row, o, n)
        assert row.replayed_offsets == exact(o, n), (row, o, n)
    return {s: r.replayed_offsets or 0 for s, r in rows.items()}


def test_a_drained_shard_replays_nothing(flushing_often: FiloPyCluster, kafka_bootstrap: str):
    """(a) A drain with the producer running throughout: the old owner flushed and checkpointed
    every offset it read, so the new one starts at the old one's next offset: 0 replayed,
    whatever was produced between the old owner's release and the new one's claim."""
    c = flushing_often
    ds, a, spare = _start(c, kafka_bootstrap)
    moved = c.client.shard_map(ds.name).shards_for_node(a.node_id)
    stop = threading.Event()

    def produce() -> None:
        with Gateway(ds, kafka_bootstrap) as gw:
            for b in batches(SERIES, 100_000, per_call=2):
                if stop.is_set():
                    break
                gw.send_batch(b)
                gw.flush()
                time.sleep(0.05)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        c.wait_for(
            "the first node read some of every partition",
            lambda: all(
                (t := _held_by(c, ds, a.node_id, s)) is not None and (t.next_offset or 0) > 0
                for s in moved
            ),
            60,
        )
        c.client.drain_node(a.node_id)
        rows = _moved_rows(c, ds, moved, a.node_id, spare.node_id)
    finally:
        stop.set()
        producer.join(60)
    tenures = _tenures(c, ds)
    old = {s: next(t for t in tenures[s] if t.node == a.node_id) for s in moved}
    new = {s: next(t for t in tenures[s] if t.node == spare.node_id) for s in moved}
    assert all(t.released_at is not None for t in old.values()), old
    # Nothing skipped, nothing read twice: the drain's final flush covered all it read.
    assert all(new[s].first_offset == old[s].next_offset for s in moved), (old, new)
    replayed = _check(rows, old, new, lambda o, n: max(0, (o.next_offset or 0) - n.first_offset))
    assert replayed == dict.fromkeys(moved, 0), replayed
    assert {r.reason for r in rows.values()} == {"drain"}, rows


def test_a_node_killed_after_flushing_counts_what_it_had_read_since(
    flushing_often: FiloPyCluster, kafka_bootstrap: str
) -> None:
    """(b) Killed after every flush group was checkpointed, having read more since: the new
    owner reads again from the lowest checkpoint + 1 to where the old one had got."""
    c = flushing_often
    ds, a, spare = _start(c, kafka_bootstrap)
    moved = c.client.shard_map(ds.name).shards_for_node(a.node_id)
    _produce(ds, kafka_bootstrap, range(0, 40))
    meta, columns = open_stores(c.settings)
    try:

        def checkpoints() -> dict[int, dict[int, int]]:
            return {s: meta.read_checkpoints(ds.ref, s) for s in moved}

        c.wait_for(
            "every flush group of the first node's shards checkpointed",
            lambda: all(len(cps) == GROUPS for cps in checkpoints().values()),
            90,
        )
        # More, read but not flushed by any group yet when the node dies: a group's turn
        # comes every 2 s; if one had its turn since, write more and look again.
        k = 40
        while True:
            _produce(ds, kafka_bootstrap, range(k, k + 20))
            k += 20
            old = _caught_up(c, ds, a.node_id, kafka_bootstrap)
            cps = checkpoints()
            if all(max(cps[s].values()) + 1 < (old[s].next_offset or 0) for s in moved):
                break
            assert k < 1000, (cps, old)
        # SIGKILL: the old owner's log dies with it; `old` was read just before.
        c.ray.remove_node(a)
        c.wait_for("the node gone", lambda: a.node_id not in c.client.members(), 60)
        rows = _moved_rows(c, ds, moved, a.node_id, spare.node_id)
        tenures = _tenures(c, ds)
        new = {s: next(t for t in tenures[s] if t.node == spare.node_id) for s in moved}
        # The new owner resumed from the checkpoints the dead node left, not from the
        # partition's start: read now, as a group may have flushed between the look above and
        # the kill.
        cps = checkpoints()
    finally:
        meta.close()
        columns.close()
    assert all(new[s].first_offset == min(cps[s].values()) + 1 for s in moved), (cps, new)
    replayed = _check(rows, old, new, lambda o, n: (o.next_offset or 0) - n.first_offset)
    assert all(n > 0 for n in replayed.values()), replayed


def test_a_node_killed_before_any_flush_counts_everything_it_had_read(
    never_flushing: FiloPyCluster, kafka_bootstrap: str
) -> None:
    """(c) Killed before any flush (no checkpoint at all): the new owner reads the partition
    from its first offset, every one of them read before by the dead owner."""
    c = never_flushing
    ds, a, spare = _start(c, kafka_bootstrap)
    moved = c.client.shard_map(ds.name).shards_for_node(a.node_id)
    _produce(ds, kafka_bootstrap, range(0, 40))
    old = _caught_up(c, ds, a.node_id, kafka_bootstrap)
    meta, columns = open_stores(c.settings)
    try:
        assert all(meta.read_checkpoints(ds.ref, s) == {} for s in moved)
    finally:
        meta.close()
        columns.close()
    c.ray.remove_node(a)
    c.wait_for("the node gone", lambda: a.node_id not in c.client.members(), 60)
    rows = _moved_rows(c, ds, moved, a.node_id, spare.node_id)
    tenures = _tenures(c, ds)
    new = {s: next(t for t in tenures[s] if t.node == spare.node_id) for s in moved}
    assert all(new[s].first_offset == old[s].first_offset == 0 for s in moved), (old, new)
    replayed = _check(rows, old, new, lambda o, n: (o.next_offset or 0) - n.first_offset)
    assert all(n > 0 for n in replayed.values()), replayed
