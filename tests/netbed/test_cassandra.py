"""The bed with Cassandra as the store, on its own host: the faults whose outcome depends on the
store (a node cut off from the head, fenced through Cassandra's lightweight transactions; the
head's machine dying, the singleton recovering its maps from Cassandra and the guardians), and the
one only a networked store can have: a node cut off from the store alone.

The faults that do not touch the store (Kafka or the gateway cut off, a slow link, a query that
cannot reach a node, a node's machine dying) run once, on SQLite, in test_faults.py.
"""

from __future__ import annotations

import time

from tests.netbed.cluster import NODES, NetCluster, wait_for
from tests.netbed.scenarios import head_dies_and_returns, node_cut_off_from_the_head
from tests.netbed.tenures import check as check_tenures

LIMIT = 500  # ingest.max_unflushed_samples: the writer (~100 samples/s) reaches it in seconds
# A node is declared failed after 10 s of silence (default 4 s), as in test_faults.py: a node cut
# off from the store alone must keep its shards ("nothing moved"), and on a loaded machine a
# healthy node has been silent for over 4 s (tests/cluster.py).
CLUSTER_ENV = {
    "FILOPY_CLUSTER__FAILURE_TIMEOUT_S": "10",
    "FILOPY_STORE__BACKEND": "cassandra",
    "FILOPY_CASSANDRA__CONTACT_POINTS": '["cassandra"]',
    "FILOPY_INGEST__FLUSH_INTERVAL_S": "2",
    "FILOPY_INGEST__KAFKA_RETRY_TIMEOUT_S": "5",
    "FILOPY_INGEST__MAX_UNFLUSHED_SAMPLES": str(LIMIT),
}


def test_a_node_cut_off_from_the_store_degrades_holds_its_memory_bound_and_catches_up(
    net_cluster: NetCluster,
) -> None:
    """The node reaches the head and Kafka but not Cassandra. Its busy shards go Degraded naming
    the store; they stay where they are (the node is alive, and the store may be what is away);
    each reads on until `ingest.max_unflushed_samples` wait for the store, then pauses (memory
    is the only buffer: the bound holds). Healed, the flushes get through, reading resumes and
    every acknowledged sample is stored once."""
    c = net_cluster
    dataset = "storecut"
    producer, out, before = c.writing_to(dataset)
    victim = c.busy_node(dataset, before)
    busy = sorted(c.shards_with_data(dataset) & {s for s, n in before.items() if n == victim})
    seen: list[object] = []

    def degraded() -> bool:
        shards = {s["shard"]: s["status"] for s in c.shards(dataset)}
        seen[:] = [shards[s] for s in busy]
        return all("store unavailable" in shards[s] for s in busy)

    def paused() -> dict[int, float] | None:
        flags = c.metric("filopy_consumption_paused", dataset=dataset, node=victim)
        on = {int(dict(k)["shard"]) for k, v in flags.items() if v == 1}
        if not set(busy) <= on:
            return None
        held = c.metric("filopy_unflushed_samples", dataset=dataset, node=victim)
        return {int(dict(k)["shard"]): v for k, v in held.items()}

    c.bed.partition(victim, "cassandra")
    try:
        try:
            wait_for(f"{victim}'s busy shards {busy} Degraded naming the store", degraded, 120)
        except AssertionError as e:
            raise AssertionError(f"{e}; their statuses: {seen}") from None
        held = wait_for(f"{victim}'s busy shards paused at the memory bound", paused, 120)
        # The bound is checked after each Kafka record: one record (a round of the writer,
        # 20 samples) may go over it.
        assert all(n <= LIMIT + 20 for n in held.values()), held
        shards = c.shards(dataset)
        assert {s["shard"]: s["node"] for s in shards} == before, "nothing moved"
        assert all(s["status"] == "Active" for s in shards if s["node"] != victim), shards
    finally:
        c.bed.heal()
    healed = time.monotonic()
    assert c.wait_active(dataset, timeout_s=240) and c.wait_settled(dataset) == before
    print(f"store cut healed: every shard Active {time.monotonic() - healed:.1f} s later")
    record = c.stop_producer(producer, out)
    c.assert_stored_once(dataset, record)
    check_tenures(c.tenures(dataset))
    assert c.members() == set(NODES)


def test_a_node_cut_off_from_the_head_is_fenced_by_cassandra(net_cluster: NetCluster) -> None:
    node_cut_off_from_the_head(net_cluster, "cut-cassandra", "both")


def test_the_head_dies_and_returns_with_its_maps_from_cassandra(net_cluster: NetCluster) -> None:
    head_dies_and_returns(net_cluster, "headfail-cassandra")
