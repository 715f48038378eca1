"""docs/operations.md's rolling restart, step by step, on real Kafka and a real Ray cluster.

The recipe stops a node's shards and starts them elsewhere before stopping the node. Between
the stop and the start, another node fails: its shards move by failure handling, and the stopped
shards must stay Stopped and unowned (not taken by that reassignment), so the operator's start
succeeds as written. Ingestion goes on throughout; every sample is read back exactly once.
"""

from __future__ import annotations

import uuid

import pytest

from core.dataset import SourceSettings
from filopy import Dataset
from ingest.gateway import Gateway
from tests.ingest.test_cluster_ingest import batches, expected, kafka_cluster, wait_exact
from tests.runtime.conftest import FiloPyCluster

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

__all__ = ["kafka_cluster"]  # the fixture, imported for pytest


def test_rolling_restart_recipe_moves_a_node_s_shards_and_loses_nothing(
    kafka_cluster: FiloPyCluster, kafka_bootstrap: str
) -> None:
    c = kafka_cluster
    # 8 shards, at most ceil(8 / 2) = 4 per node: with 4 nodes two of them are hot spares.
    ds = Dataset(
        name=f"rolling{uuid.uuid4().hex[:8]}",  # its own topic: runs never share data
        num_shards=8,
        min_num_nodes=2,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    nodes = {n.node_id: n for n in (c.add_node() for _ in range(4))}
    c.wait_for("4 members", lambda: len(c.client.members()) == 4)
    assert c.client.setup_dataset(ds)
    c.wait_for("all shards active", lambda: c.client.shard_map(ds.name).is_healthy(), 60)
    n_series = 200
    with Gateway(ds, kafka_bootstrap) as gw:
        for b in batches(n_series, 40, per_call=10):
            gw.send_batch(b)
    wait_exact(c, ds, expected(n_series, 40))

    before = c.client.shard_map(ds.name)
    owners = [n for n in c.client.members() if before.shards_for_node(n)]
    spares = [n for n in c.client.members() if not before.shards_for_node(n)]
    assert len(owners) == 2 and len(spares) == 2, before
    restarted, failing = owners
    moving = before.shards_for_node(restarted)

    # Step 2: stop the node's shards ...
    c.client.stop_shards(ds.name, moving)
    c.wait_for(
        "its shards stopped",
        lambda: all(
            (m := c.client.shard_map(ds.name)).owner(s) is None and str(m.status(s)) == "Stopped"
            for s in moving
        ),
    )
    # ... meanwhile another node fails: failure handling moves its shards, not the stopped ones.
    with Gateway(ds, kafka_bootstrap) as gw:  # the stopped shards' partitions keep growing
        for b in batches(n_series, 40, per_call=10, start=40):
            gw.send_batch(b)
    c.ray.remove_node(nodes[failing])
    c.wait_for("the failed node gone", lambda: failing not in c.client.members())
    taken = c.wait_for(
        "the failed node's shards active elsewhere",
        lambda: (
            (m := c.client.shard_map(ds.name)).owner(before.shards_for_node(failing)[0])
            not in (None, failing)
            and {m.owner(s) for s in before.shards_for_node(failing)}
        ),
        60,
    )
    (target,) = set(spares) - taken
    after_failure = c.client.shard_map(ds.name)
    assert all(after_failure.owner(s) is None for s in moving), after_failure
    assert all(str(after_failure.status(s)) == "Stopped" for s in moving), after_failure

    # ... then start them on the spare, as written, and wait until they are Active there.
    c.client.start_shards(ds.name, target, moving)
    c.wait_for(
        "the moved shards active on the spare",
        lambda: (
            (m := c.client.shard_map(ds.name)).is_healthy()
            and all(m.owner(s) == target for s in moving)
        ),
        60,
    )
    # Step 3: stop the node (it owns nothing now), start it again: it rejoins empty.
    c.ray.remove_node(nodes[restarted])
    c.wait_for("the restarted node gone", lambda: restarted not in c.client.members())
    back = c.add_node()
    c.wait_for("the node back", lambda: back.node_id in c.client.members())
    final = c.client.shard_map(ds.name)
    assert not final.shards_for_node(back.node_id), "existing shards do not move to a new node"
    assert all(final.owner(s) == target for s in moving)
    wait_exact(c, ds, expected(n_series, 80), timeout_s=120)
