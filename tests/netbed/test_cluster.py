"""FiloPy across hosts: a head, three nodes, Kafka and a client, each on a host of its own.

What is checked is what an operator sees from the client host: the command line and the REST API
over the network, the shards on the nodes, and every sample answered once after a node's host
dies and after it comes back.
"""

from __future__ import annotations

import json
import urllib.parse

from tests.netbed.cluster import HEAD_ADDRESS, NODES, NetCluster, wait_for

DATASET = "hosts"
SERIES, SCRAPES = 300, 20
COUNT = f'sum(count_over_time({{__name__=~".+"}}[{SCRAPES}m]))'


def test_a_cluster_across_hosts_ingests_answers_and_survives_a_dead_host(
    net_cluster: NetCluster,
) -> None:
    c = net_cluster
    # --min-nodes 2: two hosts hold every shard (at most 4 each), so losing one loses none.
    c.cli("dataset", "create", DATASET, "--shards", "8", "--min-nodes", "2",
          "--address", HEAD_ADDRESS)  # fmt: skip
    shards = c.wait_active(DATASET)
    assert len({s["node"] for s in shards}) >= 2, "the shards are spread over the hosts"
    status = c.cli("status", DATASET, "--address", HEAD_ADDRESS)
    assert all(s["node"] in status for s in shards), "status names the owners from the client"

    start_ms = 1_700_000_000_000
    c.cli("ingest", DATASET, "--series", str(SERIES), "--scrapes", str(SCRAPES),
          "--start-ms", str(start_ms), "--address", HEAD_ADDRESS, timeout=300)  # fmt: skip
    total = SERIES * SCRAPES
    at = str(start_ms // 1000 + SCRAPES * 15)  # queries are evaluated at the workload's end
    expected = float(total)

    def counted_everywhere() -> bool:
        return _count_at(c, at) == expected

    wait_for(f"{total} samples answered from the client host", counted_everywhere, 120)

    # The host of the node owning shard 0 dies: its shards come back on the other hosts, and
    # every sample is answered once (re-read from Kafka past the last checkpoints, none twice).
    victim = c.shards(DATASET)[0]["node"]
    c.bed.kill(victim)
    c.wait_members(set(NODES) - {victim})
    c.wait_active(DATASET, avoid=[victim])
    assert _count_at(c, at) == expected

    # It comes back as it started: `filopy node join`. It is a member again, and nothing is lost
    # or doubled by its return.
    c.join(victim)
    c.wait_members(set(NODES))
    c.wait_active(DATASET)
    assert _count_at(c, at) == expected
    assert _count_rest_at(c, at) == expected


def _count_at(cluster: NetCluster, at: str) -> float:
    out = cluster.cli("query", DATASET, COUNT, "--time", at, "--json", "--address", HEAD_ADDRESS)
    result = json.loads(out)["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _count_rest_at(cluster: NetCluster, at: str) -> float:
    query = urllib.parse.urlencode({"query": COUNT, "time": at})
    result = cluster.rest(f"/promql/{DATASET}/api/v1/query?{query}")["result"]
    return float(result[0]["value"][1]) if result else 0.0
