"""PromQL query latency on a local cluster (run on demand; needs `scripts/services.sh up kafka`).

10,000 series (a third of them `http_requests_total`, 10 namespaces) on a 64-shard dataset over
two FiloPy nodes of a local Ray cluster, 40 scrapes each through real Kafka, flushed to SQLite.
Times `sum by (_ns_) (rate(http_requests_total[5m]))` (every shard) and the same with the full
shard key (2**spread shards), through `QueryService` (routing, Ray fan-out, node-side evaluation
with partial aggregation, merge), and reports median, p99 and samples scanned per second.
Results: bench/results/query.txt.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coordinator.local_cluster import LocalRayCluster  # noqa: E402  (binds Ray to loopback first)

# isort: split
import ray  # noqa: E402

from coordinator.client import FiloPyClient  # noqa: E402
from coordinator.cluster_actor import start_cluster_actor  # noqa: E402
from coordinator.cluster_queries import cluster_query_service  # noqa: E402
from core.config import load_settings  # noqa: E402
from core.dataset import Dataset, SourceSettings  # noqa: E402
from ingest.gateway import Gateway  # noqa: E402
from ingest.workload import scrapes  # noqa: E402

BOOTSTRAP = f"127.0.0.1:{os.environ.get('FILOPY_KAFKA_PORT', '9092')}"
SERIES, SCRAPES, SHARDS, NODES, RUNS = 10_000, 40, 64, 2, 30
T0 = 1_700_000_000_000
QUERIES = {
    "all shards": "sum by (_ns_) (rate(http_requests_total[5m]))",
    "full shard key": 'sum by (_ns_) (rate(http_requests_total{_ws_="demo", _ns_="api"}[5m]))',
}


def main() -> None:
    base = load_settings()
    tmp = Path(tempfile.mkdtemp(prefix="bench-query-"))
    settings = base.model_copy(
        update={
            "store": base.store.model_copy(update={"sqlite_path": tmp / "filopy.db"}),
            "kafka": base.kafka.model_copy(update={"bootstrap_servers": BOOTSTRAP}),
            "ray": base.ray.model_copy(update={"namespace": f"bench-{uuid.uuid4().hex[:6]}"}),
            "ingest": base.ingest.model_copy(update={"flush_interval_s": 2.0}),
        }
    )
    cluster = LocalRayCluster(namespace=settings.ray.namespace)
    lines: list[str] = []
    try:
        for _ in range(NODES):
            cluster.add_node(resources={settings.cluster.node_resource: 1})
        actor = start_cluster_actor(settings)
        ray.get(actor.ready.remote(), timeout=120)
        client = FiloPyClient(actor, settings)
        while len(client.members()) < NODES:
            time.sleep(0.2)
        ds = Dataset(
            name=f"bench{uuid.uuid4().hex[:6]}",
            num_shards=SHARDS,
            min_num_nodes=NODES,
            source=SourceSettings(bootstrap_servers=BOOTSTRAP),
        )
        client.setup_dataset(ds)
        while not client.shard_map(ds.name).is_healthy():
            time.sleep(0.2)
        with Gateway(ds) as gw:
            for batch in scrapes(SERIES, SCRAPES, per_batch=10, start_ms=T0):
                gw.send_batch(batch)
        total = SERIES * SCRAPES
        # Every sample ingested and durable in SQLite: flushes seal only complete chunks, so
        # what is still open is durable as the flush groups' open-buffer snapshots.
        while True:
            stats = client.ingest_stats(ds.name)
            held = [st for per in stats.values() for st in per.values()]
            ingested = sum(st["memstore"].ingested for st in held)
            if ingested >= total and sum(st["unflushed_samples"] for st in held) == 0:
                break
            time.sleep(0.5)
        at = T0 + (SCRAPES - 1) * 15_000
        svc = cluster_query_service(client)
        lines += [
            f"# bench_query on {platform.node()} ({os.cpu_count()} cores), "
            f"{time.strftime('%Y-%m-%d %H:%M')}",
            f"{SERIES:,} series x {SCRAPES} scrapes ({total:,} samples) on {SHARDS} shards, "
            f"{NODES} FiloPy nodes (one machine, 2 cores shared by Kafka, Ray and the driver); "
            f"all flushed to SQLite; {RUNS} runs per query after 3 warm-ups",
            "",
            f"{'query':<16} {'median ms':>10} {'p99 ms':>8} {'shards':>7} {'series':>7} "
            f"{'samples':>9} {'samples/s':>12}",
        ]
        for label, q in QUERIES.items():
            for _ in range(3):
                svc.instant(ds.name, q, at)
            took = []
            res = None
            for _ in range(RUNS):
                t0 = time.perf_counter()
                res = svc.instant(ds.name, q, at)
                took.append(time.perf_counter() - t0)
            assert res is not None and len(res.value) > 0
            ms = np.array(took) * 1000
            rate = res.samples_scanned / np.median(took)
            lines.append(
                f"{label:<16} {np.median(ms):>10.1f} {np.percentile(ms, 99):>8.1f} "
                f"{len(res.shards):>7} {res.series_scanned:>7,} {res.samples_scanned:>9,} "
                f"{rate:>12,.0f}"
            )
        svc.close()
    finally:
        cluster.shutdown()
    out = ROOT / "bench" / "results" / "query.txt"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
