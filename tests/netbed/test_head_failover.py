"""The head's machine dies and comes back: ingestion goes on, no shard moves, nothing is lost.

Ray's control state lives in Redis on a host of its own (`filopy head --redis`), so the head
restarted on its machine takes up the same Ray cluster: the nodes' Ray nodes and the FiloPy node
coordinators on them (with their ingesters) keep running while it is away, the singleton comes
back with the maps the nodes run (store + guardians), and a writer through the gateway, which
needs no head, is acknowledged throughout. Afterwards every acknowledged sample is stored once.
"""

from __future__ import annotations

from tests.netbed.cluster import NODES, NetCluster, wait_for
from tests.netbed.scenarios import head_dies_and_returns
from tests.netbed.tenures import check as check_tenures


def test_the_head_dies_and_returns_without_a_shard_moving_or_a_sample_lost(
    net_cluster: NetCluster,
) -> None:
    head_dies_and_returns(net_cluster, "headfail")


def test_the_head_cut_off_from_every_node_moves_nothing_and_loses_nothing(
    net_cluster: NetCluster,
) -> None:
    """The head's host cut off from every node for longer than the failure timeout: the
    singleton hears no member, suspects itself rather than all of them (`/__health` says so on
    the head's own host) and moves nothing; the nodes keep ingesting what the gateway is
    acknowledged for. After the heal the map is the one the nodes ran all along, no node process
    died, and every sample is stored once."""
    c = net_cluster
    dataset = "headcut"
    producer, out, before = c.writing_to(dataset, shards=4)
    node_pids = {n: sorted(c.bed.pids(n)) for n in NODES}

    def held_back() -> bool:
        health = c.bed.sh("head", ["curl", "-sS", "--max-time", "20",
                                   "http://head:8080/__health"], check=False)  # fmt: skip
        return "failover held back" in health.stdout

    c.bed.partition("head", *NODES)
    try:
        wait_for("the singleton holding failover back", held_back, 60)
        acked = len(c.acked(out)["acked_ts"])
        wait_for("writes acknowledged meanwhile",
                 lambda: len(c.acked(out)["acked_ts"]) > acked + 10, 60)  # fmt: skip
    finally:
        c.bed.heal()
    wait_for("healthy again", lambda: c.rest("/__health")["healthy"], 90)
    after = {s["shard"]: s["node"] for s in c.wait_active(dataset)}
    moves = [(h["shard"], h["source"], h["target"], h["reason"])
             for h in c.rest(f"/api/v1/cluster/{dataset}/history") if h["source"]]  # fmt: skip
    assert after == before, f"no shard moved; moves: {moves}"
    assert {n: sorted(c.bed.pids(n)) for n in NODES} == node_pids, "no node process died"
    record = c.stop_producer(producer, out)
    c.assert_stored_once(dataset, record)
    check_tenures(c.tenures(dataset))
