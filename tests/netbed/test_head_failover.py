"""The head's machine dies and comes back: ingestion goes on, no shard moves, nothing is lost.

Ray's control state lives in Redis on a host of its own (`filopy head --redis`), so the head
restarted on its machine takes up the same Ray cluster: the nodes' Ray nodes and the FiloPy node
coordinators on them (with their ingesters) keep running while it is away, the singleton comes
back with the maps the nodes run (store + guardians), and a writer through the gateway, which
needs no head, is acknowledged throughout. Afterwards every acknowledged sample is stored once.
"""

from __future__ import annotations

import time

from tests.netbed.cluster import HEAD_ADDRESS, NODES, NetCluster, wait_for

DATASET = "headfail"
DOWN_S = 10.0  # how long the head stays dead (well under the nodes' 60 s wait for Ray's GCS)


def _settled(c: NetCluster, dataset: str = DATASET) -> bool:
    """8 shards spread 3/3/2 and all Active: rebalancing has nothing left to move."""
    shards = c.shards(dataset)
    per_node = sorted(sum(1 for s in shards if s["node"] == n) for n in NODES)
    return per_node == [2, 3, 3] and all(s["status"] == "Active" for s in shards)


def test_the_head_dies_and_returns_without_a_shard_moving_or_a_sample_lost(
    net_cluster: NetCluster,
) -> None:
    c = net_cluster
    # 8 shards over 3 nodes; rebalancing settles at 3/3/2 before the head is killed.
    c.cli("dataset", "create", DATASET, "--shards", "8", "--min-nodes", "2",
          "--address", HEAD_ADDRESS)  # fmt: skip
    wait_for("rebalancing settled", lambda: _settled(c), 120)
    before = {s["shard"]: s["node"] for s in c.wait_active(DATASET)}
    producer, out = c.start_writer(DATASET)
    node_pids = {n: sorted(c.bed.pids(n)) for n in NODES}

    acked_before_kill = len(c.acked(out)["acked_ts"])
    c.bed.kill("head")
    time.sleep(DOWN_S)
    # Writes go on through the gateway (no head needed); the nodes' processes all still run.
    wait_for("writes acknowledged with the head down",
             lambda: len(c.acked(out)["acked_ts"]) > acked_before_kill + 10, 60)  # fmt: skip
    assert {n: sorted(c.bed.pids(n)) for n in NODES} == node_pids, "no node process died"

    took = c.start_head()
    after = {s["shard"]: s["node"] for s in c.wait_active(DATASET)}
    if after != before:
        history = c.cli("history", DATASET, "--json", "--address", HEAD_ADDRESS)
        raise AssertionError(f"shards moved: {before} -> {after}; history: {history}")
    assert c.members() == set(NODES)
    print(f"head restarted: REST answering {took:.1f} s after its start")

    time.sleep(2)
    record = c.stop_producer(producer, out)
    assert len(record["acked_ts"]) > acked_before_kill + 10
    c.assert_stored_once(DATASET, record)
