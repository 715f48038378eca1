"""A node's shard reports travel in batches (issue 11, item 8), on a real Ray cluster: the batch
call `NodeClusterActor.shard_events` applies a node's reports in order, ignores every report older
than one already applied for its shard (a stale batch, or the stale part of one), and the node's
own batched reports keep reaching a singleton that Ray restarted."""

from __future__ import annotations

import ray

from coordinator.messages import EventsApplied
from coordinator.names import node_actor_name
from core.shard_status import Active, Degraded, IngestionDegraded, IngestionStarted
from filopy import Dataset
from tests.runtime.conftest import FiloPyCluster

SHARDS = 64
BIG = 1 << 40  # above any sequence number the node itself has used


def test_batched_reports_reach_the_map_in_order_and_stale_ones_are_ignored(
    filopy_cluster: FiloPyCluster,
) -> None:
    c = filopy_cluster
    node = c.add_node().node_id
    c.wait_for("the node joined", lambda: c.client.members() == [node])
    ds = Dataset(name="batches", num_shards=SHARDS, min_num_nodes=1)
    ref = ds.ref
    assert c.client.setup_dataset(ds)
    # The node's own reports (one IngestionStarted per shard, sent in batches) made it Active.
    c.wait_for("all active", lambda: c.client.shard_map(ds.name).is_healthy())
    coordinator = ray.get_actor(node_actor_name(node), namespace=c.settings.ray.namespace)
    stats = ray.get(coordinator.report_stats.remote())
    # At least one report a shard; a start that waited on a busy store past its attempt also
    # reported the shard Degraded before it started (the node coordinator retries starts).
    assert stats["sent"] >= SHARDS and stats["dropped"] == 0 and stats["queued"] == 0, stats
    assert 1 <= stats["calls"] <= stats["sent"]

    def send(batch: list) -> EventsApplied:
        reply = ray.get(c.actor.shard_events.remote(node, batch), timeout=30)
        assert isinstance(reply, EventsApplied), reply
        return reply

    def status(shard: int) -> object:
        return c.client.shard_map(ds.name).status(shard)

    # One batch: shards 0..31 degraded, then shard 0 healthy again, in that order.
    batch = [(IngestionDegraded(ref, s, node, f"m{s}"), BIG + s) for s in range(32)]
    batch.append((IngestionStarted(ref, 0, node), BIG + 100))
    assert send(batch).applied == 33
    mapper = c.client.shard_map(ds.name)
    assert isinstance(mapper.status(0), Active)
    assert [mapper.status(s) for s in range(1, 32)] == [Degraded(f"m{s}") for s in range(1, 32)]
    assert all(isinstance(mapper.status(s), Active) for s in range(32, SHARDS))

    # A stale batch (each report as old as the last one applied for its shard): ignored whole.
    reply = send([(IngestionStarted(ref, s, node), BIG + s) for s in range(1, 32)])
    assert reply.applied == 0 and len(reply.ignored) == 31
    assert all("stale report" in i.reason for i in reply.ignored)
    assert [status(s) for s in range(1, 32)] == [Degraded(f"m{s}") for s in range(1, 32)]

    # A batch part stale, part fresh; and within a batch, a report older than one before it.
    reply = send(
        [
            (IngestionStarted(ref, 1, node), BIG + 1),  # stale
            (IngestionStarted(ref, 2, node), BIG + 200),  # fresh
            (IngestionStarted(ref, 3, node), BIG + 301),  # fresh
            (IngestionDegraded(ref, 3, node, "late"), BIG + 300),  # older than the one before
        ]
    )
    assert reply.applied == 2 and len(reply.ignored) == 2
    assert status(1) == Degraded("m1")
    assert isinstance(status(2), Active) and isinstance(status(3), Active)

    # A report from a node that does not own the shard is ignored by the manager as before.
    reply = send([(IngestionStarted(ref, 4, "some-other-node"), BIG + 500)])
    assert reply.applied == 0 and len(reply.ignored) == 1


def test_a_nodes_reports_reach_a_singleton_that_ray_restarted(
    filopy_cluster: FiloPyCluster,
) -> None:
    c = filopy_cluster
    node = c.add_node().node_id
    c.wait_for("the node joined", lambda: c.client.members() == [node])
    ds = Dataset(name="restarted", num_shards=8, min_num_nodes=1)
    assert c.client.setup_dataset(ds)
    c.wait_for("all active", lambda: c.client.shard_map(ds.name).is_healthy())
    before = ray.get(c.actor.ready.remote())

    ray.kill(c.actor, no_restart=False)  # Ray restarts the singleton under the same name
    c.wait_for("restarted", lambda: ray.get(c.actor.ready.remote(), timeout=30) != before, 60)
    c.wait_for("the node is a member again", lambda: c.client.members() == [node], 30)
    # The node's cached handle to the old process is of no use: its next reports still arrive.
    c.client.stop_shards(ds.name, [0, 1, 2])
    c.client.start_shards(ds.name, node, [0, 1, 2])
    c.wait_for("started again", lambda: c.client.shard_map(ds.name).is_healthy(), 30)
    coordinator = ray.get_actor(node_actor_name(node), namespace=c.settings.ray.namespace)
    stats = ray.get(coordinator.report_stats.remote())
    assert stats["dropped"] == 0 and stats["sent"] >= 8 + 3, stats
