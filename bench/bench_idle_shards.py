"""What idle shards cost: the CPU of a node and of the Kafka broker while no sample arrives, and how
soon a sample written to an idle partition is read, for two `ingest.fetch_wait_max_ms`.

Why: each shard's consumer keeps one fetch waiting at the broker. With librdkafka's
fetch.min.bytes of 1 the broker answers as soon as a byte arrives, so fetch.wait.max.ms does not
delay live data: it only sets how often an idle partition's fetch comes back empty and is sent
again, which costs the broker (and the node) CPU per idle shard.

Needs Kafka (`scripts/services.sh up kafka`) and starts a one-node Ray cluster.

    .venv/bin/python bench/bench_idle_shards.py [--shards 16] [--seconds 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from procstat import cpu_seconds  # noqa: E402

from core.dataset import Dataset  # noqa: E402
from tests.cluster import cluster_settings, start_cluster  # noqa: E402

BOOTSTRAP = f"127.0.0.1:{os.environ.get('FILOPY_KAFKA_PORT', '9092')}"
WAITS_MS = (100, 500)


def node_pid() -> int:
    """The process of the one NodeCoordinator actor (Ray names its process after the class)."""
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if (p / "cmdline").read_bytes().startswith(b"ray::NodeCoordinator"):
                    return int(p.name)
            except OSError:
                continue
    raise RuntimeError("no NodeCoordinator process")


def idle_cpu(wait_ms: int, shards: int, seconds: float) -> tuple[float, float]:
    """(node, broker) CPU in % of a core while `shards` shards of one node sit idle."""
    from coordinator.local_cluster import LocalRayCluster

    broker = int((ROOT / ".services" / "run" / "kafka.pid").read_text())
    ray_cluster = LocalRayCluster()
    try:
        with tempfile.TemporaryDirectory() as d:
            settings = cluster_settings(Path(d), "kafka", BOOTSTRAP, fetch_wait_max_ms=wait_ms)
            c = start_cluster(ray_cluster, settings)
            node = c.add_node()
            c.wait_for("the node", lambda: c.client.members() == [node.node_id])
            name = f"idle{uuid.uuid4().hex[:6]}"
            c.client.setup_dataset(Dataset(name=name, num_shards=shards, min_num_nodes=1))
            c.wait_for("shards active", lambda: c.client.shard_map(name).is_healthy())
            time.sleep(5)
            pid = node_pid()
            n0, b0 = cpu_seconds(pid), cpu_seconds(broker)
            time.sleep(seconds)
            node, broker_s = cpu_seconds(pid) - n0, cpu_seconds(broker) - b0
            return 100 * node / seconds, 100 * broker_s / seconds
    finally:
        ray_cluster.shutdown()


def live_lag_ms(wait_ms: int, samples: int = 15) -> list[float]:
    """Produce one message at a time to an idle partition; how long until a consumer has it."""
    topic = f"lag{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    time.sleep(1)  # the partition's leader elected
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": wait_ms,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 0})
    lags = []
    try:
        consumer.consume(10, 2.0)
        for _ in range(samples):
            time.sleep(0.37)  # off the fetch cycle
            t0 = time.monotonic()
            producer.produce(topic, b"x")
            producer.flush()
            while not consumer.consume(10, 0.05):
                pass
            lags.append((time.monotonic() - t0) * 1000)
    finally:
        consumer.close()
    return lags


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "idle_shards.txt")
    args = p.parse_args()
    lines = [
        f"FiloPy idle shards, {time.strftime('%Y-%m-%d %H:%M')}, Python {platform.python_version()}"
        f", {os.cpu_count()} CPUs (broker on the same machine); {args.shards} idle shards on one "
        f"node for {args.seconds:.0f} s; lag: a message produced to an idle partition, until read",
        "",
    ]
    cpu = {}
    for wait in WAITS_MS:
        node, broker = cpu[wait] = idle_cpu(wait, args.shards, args.seconds)
        lags = live_lag_ms(wait)
        lines.append(
            f"fetch_wait_max_ms={wait:4d}  node {node:5.1f}% of a core  broker {broker:5.1f}%"
            f"   live lag median {statistics.median(lags):5.1f} ms, max {max(lags):5.1f} ms"
        )
    lo, hi = WAITS_MS
    lines.append(
        f"broker CPU {hi} / {lo} ms: x{cpu[hi][1] / cpu[lo][1]:.2f}; "
        f"node CPU: x{cpu[hi][0] / cpu[lo][0]:.2f}"
    )
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
