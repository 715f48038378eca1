"""Fault scenarios that depend on the store, run once per store: SQLite (test_faults.py) and
Cassandra (test_cassandra.py). Each writes through the gateway while the fault lasts and ends by
checking every acknowledged sample stored once and the tenures."""

from __future__ import annotations

import time

from tests.netbed.cluster import NODES, NetCluster, wait_for
from tests.netbed.tenures import check as check_tenures

CUT_S = 20.0  # well past the failure timeout (4 or 10 s), short of Ray's 60 s wait for its GCS
HEAD_DOWN_S = 10.0  # how long the head stays dead (well under the nodes' 60 s wait)


def node_cut_off_from_the_head(c: NetCluster, dataset: str, way: str) -> None:
    """A node cut off from the head (`way`: both, node-to-head or head-to-node) while it still
    reaches Kafka and the store. The singleton declares it failed after the failure timeout and
    gives its shards to the other nodes with new epochs; the cut-off node reads on, but its first
    commit after the move is refused by the store (fenced) and counted. Healed, it rejoins
    without those shards."""
    producer, out, before = c.writing_to(dataset)
    victim = c.busy_node(dataset, before)  # its ingester has commits to be refused
    others = set(NODES) - {victim}
    if way == "both":
        c.bed.partition(victim, "head")
    elif way == "node-to-head":
        c.bed.partition(victim, "head", one_way=True)
    else:
        c.bed.partition("head", victim, one_way=True)
    try:
        c.wait_members(others, timeout_s=60)
        shards = c.wait_active(dataset, avoid=[victim], timeout_s=60)
        assert {s["node"] for s in shards} <= others
        time.sleep(max(0.0, CUT_S - 10))
    finally:
        c.bed.heal()

    # Healed (well within Ray's 60 s): the node answers again and rejoins, without the shards
    # it lost; its ingesters had stopped at their first commit after the move, refused by the
    # new owners' epochs, and the node counts those refusals.
    c.wait_members(set(NODES))
    moved = sorted(s for s, n in before.items() if n == victim)
    assert c.bed.pids(victim), f"{victim}'s processes still run"

    def fenced() -> float:
        refused = c.metric("filopy_stale_epoch_rejections_total", dataset=dataset, node=victim)
        return sum(refused.values())

    wait_for(f"{victim}'s refused commits counted (shards {moved} moved)", fenced, 60)
    assert all(s["node"] != victim or s["status"] != "Down" for s in c.shards(dataset))

    time.sleep(2)
    record = c.stop_producer(producer, out)
    c.assert_stored_once(dataset, record)
    held = check_tenures(c.tenures(dataset), fenced=victim)
    assert all(held[s] >= 2 for s in moved), held  # the victim's tenure, then its successor's


def head_dies_and_returns(c: NetCluster, dataset: str) -> None:
    """The head's machine killed (every process, -9) for `HEAD_DOWN_S`, then `filopy head`
    started again: the nodes' processes keep running with their ingesters, writes through the
    gateway are acknowledged throughout, and the singleton comes back with the maps the nodes
    run (store + guardians): no shard moves, nothing lost."""
    # 8 shards over 3 nodes; rebalancing settles (3/3/2) before the head is killed.
    producer, out, before = c.writing_to(dataset)
    node_pids = {n: sorted(c.bed.pids(n)) for n in NODES}

    acked_before_kill = len(c.acked(out)["acked_ts"])
    c.bed.kill("head")
    time.sleep(HEAD_DOWN_S)
    # Writes go on through the gateway (no head needed); the nodes' processes all still run.
    wait_for("writes acknowledged with the head down",
             lambda: len(c.acked(out)["acked_ts"]) > acked_before_kill + 10, 60)  # fmt: skip
    assert {n: sorted(c.bed.pids(n)) for n in NODES} == node_pids, "no node process died"

    took = c.start_head()
    after = {s["shard"]: s["node"] for s in c.wait_active(dataset)}
    if after != before:
        history = c.rest(f"/api/v1/cluster/{dataset}/history")
        raise AssertionError(f"shards moved: {before} -> {after}; history: {history}")
    assert c.members() == set(NODES)
    print(f"head restarted: REST answering {took:.1f} s after its start")

    time.sleep(2)
    record = c.stop_producer(producer, out)
    assert len(record["acked_ts"]) > acked_before_kill + 10
    c.assert_stored_once(dataset, record)
    check_tenures(c.tenures(dataset))
