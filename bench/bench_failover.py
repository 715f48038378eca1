"""Failover and fan-out on a real local Ray cluster (run on demand; results in bench/results/).

- time from killing a node coordinator's process (kill -9) to its shards Active elsewhere;
- time from removing a whole Ray node to its shards Active elsewhere;
- latency of one shard event fanned out to 100 subscribers (4 client processes' worth of sinks).
Median of several runs each, on this machine (2 cores shared by every Ray process).
"""

from __future__ import annotations

import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coordinator.local_cluster import LocalRayCluster  # noqa: E402  (binds Ray to loopback first)

# isort: split
import ray  # noqa: E402

from coordinator.client import FiloPyClient  # noqa: E402
from coordinator.cluster_actor import start_cluster_actor  # noqa: E402
from coordinator.names import node_actor_name  # noqa: E402
from filopy import Dataset, ShardDown  # noqa: E402
from tests.runtime.conftest import cluster_settings  # noqa: E402

RUNS = 5
SUBSCRIBERS = 100
CLIENTS = 4


def wait_for(check, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.01)
    raise TimeoutError


def main() -> None:
    cluster = LocalRayCluster()
    settings = cluster_settings(Path(tempfile.mkdtemp()))
    actor = start_cluster_actor(settings)
    ray.get(actor.ready.remote())
    client = FiloPyClient(actor, settings)
    res = {settings.cluster.node_resource: 1}
    nodes = [cluster.add_node(resources=res) for _ in range(4)]
    wait_for(lambda: len(client.members()) == 4)
    client.setup_dataset(Dataset(name="bench", num_shards=8, min_num_nodes=3))
    wait_for(lambda: client.shard_map("bench").is_healthy())

    def fail_over(kill) -> float:
        m = client.shard_map("bench")
        victim = max(nodes, key=lambda n: len(m.shards_for_node(n.node_id)))
        lost = m.shards_for_node(victim.node_id)
        started = kill(victim)
        wait_for(
            lambda: (
                (x := client.shard_map("bench")).is_healthy()
                and all(x.owner(s) != victim.node_id for s in lost)
            )
        )
        return time.monotonic() - started

    def kill_process(node) -> float:
        h = ray.get_actor(node_actor_name(node.node_id), namespace=settings.ray.namespace)
        pid = ray.get(h.ping.remote()).pid
        t = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        return t

    def remove_node(node) -> float:
        t = time.monotonic()
        cluster.remove_node(node)
        nodes.remove(node)
        nodes.append(cluster.add_node(resources=res))  # a new spare for the next run
        return t

    process_kills = []
    for _ in range(RUNS):
        process_kills.append(fail_over(kill_process))
        wait_for(lambda: len(client.members()) == 4)  # the node rejoins with a fresh coordinator
    node_losses = []
    for _ in range(RUNS):
        node_losses.append(fail_over(remove_node))
        wait_for(lambda: len(client.members()) == 4)

    clients = [FiloPyClient(actor, settings) for _ in range(CLIENTS)]
    subs = [clients[i % CLIENTS].subscribe("bench") for i in range(SUBSCRIBERS)]
    for s in subs:
        s.next(timeout_s=30)  # the snapshot
    fanouts = []
    with ThreadPoolExecutor(SUBSCRIBERS) as pool:
        for shard in range(RUNS):

            def first_down(s):
                while not isinstance(u := s.next(timeout_s=30), ShardDown):
                    pass
                return time.monotonic(), u

            futures = [pool.submit(first_down, s) for s in subs]
            t0 = time.monotonic()
            client.stop_shards("bench", [shard])
            arrivals = [f.result()[0] - t0 for f in futures]
            fanouts.append((statistics.median(arrivals), max(arrivals)))

    lines = [
        "FiloPy failover benchmark",
        f"{time.strftime('%Y-%m-%d %H:%M')}, Python {platform.python_version()}, "
        f"ray {ray.__version__}, {os.cpu_count()} CPUs, 1 head + 4 FiloPy nodes on one machine",
        f"settings: ping every {settings.cluster.ping_interval_s} s, failure timeout "
        f"{settings.cluster.failure_timeout_s} s, 8 shards, min_num_nodes 3",
        "",
        f"kill -9 of a node coordinator -> its shards Active elsewhere: median "
        f"{statistics.median(process_kills):.2f} s  (runs: "
        + ", ".join(f"{x:.2f}" for x in process_kills)
        + ")",
        f"whole Ray node removed       -> its shards Active elsewhere: median "
        f"{statistics.median(node_losses):.2f} s  (runs: "
        + ", ".join(f"{x:.2f}" for x in node_losses)
        + ")",
        f"one ShardDown event to {SUBSCRIBERS} subscribers ({CLIENTS} client sinks): median of "
        f"per-run medians {statistics.median(m for m, _ in fanouts) * 1000:.1f} ms, "
        f"median of per-run max {statistics.median(x for _, x in fanouts) * 1000:.1f} ms",
    ]
    out = ROOT / "bench" / "results" / "failover.txt"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    cluster.shutdown()


if __name__ == "__main__":
    main()
