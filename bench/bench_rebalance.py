"""Rebalancing under load (issue 16): 64 shards from 2 nodes onto 4, on a real local Ray
cluster ingesting from the real Kafka; results in bench/results/rebalance.txt.

A producer thread writes as fast as one gateway can (on this 2-core machine far below the
issue's 500k samples/s: the rate reached is reported), a query thread runs an instant query in
a loop and records each latency and failure. After a steady phase, 2 nodes join; rebalancing
(interval 1 s, `--max-moves` in flight) hands 32 shards over. Reported: time until the map is
balanced and healthy, moves, offsets replayed per move (the new owners' `replayed_offsets`:
exact, as a drained owner notes where it stopped), query p50/p99 before and during the
rebalance, and failed queries.

    .venv/bin/python bench/bench_rebalance.py [--shards 64] [--max-moves 4] [--out FILE]

Needs Kafka on 127.0.0.1:9092 (`scripts/services.sh up kafka`).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coordinator.local_cluster import LocalRayCluster  # noqa: E402  (binds Ray to loopback first)

# isort: split
import numpy as np  # noqa: E402
import ray  # noqa: E402

from coordinator.client import FiloPyClient  # noqa: E402
from coordinator.cluster_actor import start_cluster_actor  # noqa: E402
from core.dataset import SourceSettings  # noqa: E402
from filopy import Dataset  # noqa: E402
from ingest.batch import SampleBatch  # noqa: E402
from ingest.gateway import Gateway  # noqa: E402
from tests.runtime.conftest import cluster_settings  # noqa: E402

T0 = 1_700_000_000_000
SERIES = 2000


def _series() -> list[dict[str, str]]:
    return [
        {"_metric_": "req", "_ws_": "bench", "_ns_": f"ns{i % 16}", "pod": f"p{i}"}
        for i in range(SERIES)
    ]


class Producer(threading.Thread):
    """One gateway sending scrapes of SERIES series (one sample each) at a steady rate."""

    def __init__(self, ds: Dataset, rate: float) -> None:
        super().__init__(daemon=True)
        self.ds, self.stop, self.samples, self.scrapes = ds, threading.Event(), 0, 0
        self.rate = rate  # samples/s to aim at (0: as fast as acks allow)

    def run(self) -> None:
        series = _series()
        idx = np.arange(SERIES, dtype=np.int32)
        rng = np.random.default_rng(1)
        t0 = time.monotonic()
        with Gateway(self.ds) as gw:
            while not self.stop.is_set():
                if self.rate and self.samples > self.rate * (time.monotonic() - t0):
                    time.sleep(0.01)
                    continue
                ts = np.full(SERIES, T0 + 1000 * self.scrapes, np.int64)
                gw.send_batch(SampleBatch(series, idx, ts, rng.random(SERIES)))
                self.scrapes += 1
                self.samples += SERIES
                if self.scrapes % 10 == 0:
                    gw.flush()


class Querier(threading.Thread):
    """An instant query in a loop: (start time, latency) of each, and the failures."""

    def __init__(self, client: FiloPyClient, name: str) -> None:
        super().__init__(daemon=True)
        self.client, self.name, self.stop = client, name, threading.Event()
        self.lat: list[tuple[float, float]] = []
        self.failed: list[tuple[float, str]] = []

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                self.client.query(self.name, "sum by (_ns_) (req)", T0 + 10**9)
                self.lat.append((t, time.monotonic() - t))
            except Exception as e:
                self.failed.append((t, f"{type(e).__name__}: {e}"[:200]))
            time.sleep(0.02)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--max-moves", type=int, default=4)
    parser.add_argument("--rate", type=float, default=50_000, help="samples/s; 0: flat out")
    parser.add_argument("--store", choices=["cassandra", "sqlite"], default="cassandra")
    parser.add_argument("--steady-s", type=float, default=15.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    cluster = LocalRayCluster()
    try:
        settings = cluster_settings(
            Path(tempfile.mkdtemp()), "kafka", rebalance=True, flush_interval_s=5.0
        )
        settings = settings.model_copy(
            update={
                "rebalance": settings.rebalance.model_copy(
                    update={
                        "interval_s": 1.0,
                        "max_concurrent_moves": args.max_moves,
                        # A drain (stop, final flush, checkpoint LWTs) takes 15-30 s here when
                        # 4 nodes' 64 ingesters, Kafka and Cassandra share 2 cores.
                        "drain_timeout_s": 300.0,
                    }
                ),
                # Cassandra, as a multi-node cluster would use: SQLite's one writer at a time
                # makes 64 shards' flushes (and so the drains) queue behind each other.
                "store": settings.store.model_copy(update={"backend": args.store}),
                "cassandra": settings.cassandra.model_copy(
                    update={"keyspace": f"filopy_bench_{uuid.uuid4().hex[:8]}"}
                ),
                # Everything shares 2 cores here: a busy node answers pings late, and the
                # default 4 s would count it failed mid-benchmark.
                "cluster": settings.cluster.model_copy(
                    update={"failure_timeout_s": 30.0, "ping_timeout_s": 10.0}
                ),
            }
        )
        node = settings.cluster.node_resource
        for _ in range(2):
            cluster.add_node(resources={node: 1})
        actor = start_cluster_actor(settings)
        ray.get(actor.ready.remote(), timeout=120)
        client = FiloPyClient(actor, settings)
        while len(client.members()) < 2:
            time.sleep(0.1)
        ds = Dataset(
            name=f"rebal{uuid.uuid4().hex[:6]}",
            num_shards=args.shards,
            min_num_nodes=2,
            source=SourceSettings(bootstrap_servers=settings.kafka.bootstrap_servers),
        )
        assert client.setup_dataset(ds)
        while not client.shard_map(ds.name).is_healthy():
            time.sleep(0.2)
        producer, querier = Producer(ds, args.rate), Querier(client, ds.name)
        producer.start()
        querier.start()
        time.sleep(args.steady_s)
        rate = producer.samples / args.steady_s
        before = client.shard_map(ds.name)
        joined_at = time.monotonic()
        for _ in range(2):
            cluster.add_node(resources={node: 1})
        per_node = args.shards // 4
        deadline = joined_at + args.timeout
        while True:
            m = client.shard_map(ds.name)
            counts = [m.num_shards_for_node(n) for n in client.members()]
            if len(counts) == 4 and m.is_healthy() and all(c == per_node for c in counts):
                break
            if time.monotonic() > deadline:
                print(f"not balanced within {args.timeout:g} s: shards per node {counts}")
                break
            time.sleep(0.2)
        balanced_s = time.monotonic() - joined_at
        done_at = time.monotonic()
        time.sleep(2)
        producer.stop.set()
        querier.stop.set()
        producer.join(60)
        querier.join(60)
        after = client.shard_map(ds.name)
        moved = [s for s in range(args.shards) if after.owner(s) != before.owner(s)]
        stats = {s: st for per in client.ingest_stats(ds.name).values() for s, st in per.items()}
        replayed = [stats[s]["replayed_offsets"] for s in moved if s in stats]
        history = client.history(ds.name, limit=10_000)
        forced = [h for h in history if "forced" in h.reason]
        handed = [h for h in history if h.reason == "rebalance"]
        steady = [lat for t, lat in querier.lat if t < joined_at]
        during = [lat for t, lat in querier.lat if joined_at <= t <= done_at]
        failed = [f for t, f in querier.failed if t >= joined_at]
        client.queries().close()
    finally:
        cluster.shutdown()

    lines = [
        "FiloPy rebalance under load (issue 16)",
        f"{datetime.now():%Y-%m-%d %H:%M}, Python {platform.python_version()}, ray "
        f"{ray.__version__}, {os.cpu_count()} CPUs, all on one machine; {args.store} store, "
        "real Kafka",
        f"command: .venv/bin/python bench/bench_rebalance.py --shards {args.shards} "
        f"--max-moves {args.max_moves} --rate {args.rate:g} --store {args.store}",
        f"load: one gateway producing {rate:,.0f} samples/s ({SERIES} series) during the run "
        "(cluster, producer and queries share 2 cores here: the issue's 500k/s is not reachable "
        "on this machine), a query loop (sum by (_ns_) (req)) throughout",
        "",
        f"{args.shards} shards from 2 nodes onto 4: "
        + (
            f"balanced ({per_node} each, all Active) {balanced_s:.1f} s after the 2 nodes were "
            "started"
            if balanced_s < args.timeout
            else f"NOT balanced within {args.timeout:g} s"
        )
        + f", {len(moved)} moves, at most {args.max_moves} in flight",
        f"offsets replayed per move: max {max(replayed, default=0)}, total {sum(replayed)} "
        f"({len(replayed)} moves measured)",
        f"ownership history: {len(handed)} handoffs completed through a drain, {len(forced)} "
        "forced past rebalance.drain_timeout_s"
        + (f" (first: {forced[-1].reason})" if forced else ""),
        f"query latency before: p50 {pct(steady, 50):.0f} ms, p99 {pct(steady, 99):.0f} ms "
        f"({len(steady)} queries); during: p50 {pct(during, 50):.0f} ms, p99 "
        f"{pct(during, 99):.0f} ms ({len(during)} queries); p99 ratio during/before "
        f"{pct(during, 99) / pct(steady, 99):.2f}",
        f"failed queries during the rebalance: {len(failed)}"
        + (f" (first: {failed[0]})" if failed else ""),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
