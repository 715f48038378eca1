"""A big dataset on a real local Ray cluster (issue 11, item 8; run on demand, results in
bench/results/big_dataset.txt).

A head and 3 FiloPy nodes on 127.0.0.1, `ingest.source = "none"` (each node claims every shard's
ownership epoch in the store and reports it live; no Kafka), SQLite store. For each size: a
SetupDataset, then the time until every shard is Active (as the singleton's map says), the
singleton's RSS (from /proc) at the end and its peak while sampling, and each node coordinator's
RSS. Sizes run one after another in the same cluster, each dataset removed before the next.

    .venv/bin/python bench/bench_big_dataset.py [--shards 4096 65536] [--out FILE]

"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coordinator.local_cluster import LocalRayCluster  # noqa: E402  (binds Ray to loopback first)

# isort: split
import ray  # noqa: E402
from ray._private import state as ray_state  # noqa: E402

from coordinator.client import FiloPyClient  # noqa: E402
from coordinator.cluster_actor import start_cluster_actor  # noqa: E402
from coordinator.names import CLUSTER_ACTOR_NAME, node_actor_name  # noqa: E402
from core.shard_status import Active  # noqa: E402
from filopy import Dataset  # noqa: E402
from tests.runtime.conftest import cluster_settings  # noqa: E402

NODES = 3
MB = 1 << 20


def rss(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory in bytes (`VmHWM`: its peak since it started), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def singleton_pid() -> int:
    for info in ray_state.actors().values():
        if info.get("Name") == CLUSTER_ACTOR_NAME and info.get("State") == "ALIVE":
            return int(info["Pid"])
    raise RuntimeError("no live singleton")


class PeakRss:
    """Samples a process's RSS every 50 ms in a thread; `peak` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss(self._pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def active(client: FiloPyClient, name: str, n: int) -> int:
    m = client.shard_map(name)
    return sum(isinstance(m.status(s), Active) for s in range(n))


def run_size(client: FiloPyClient, settings, shards: int, timeout_s: float) -> dict[str, float]:
    pid = singleton_pid()
    before = rss(pid)
    peak = PeakRss(pid)
    name = f"big{shards}"
    t0 = time.monotonic()
    assert client.setup_dataset(Dataset(name=name, num_shards=shards, min_num_nodes=NODES))
    setup_s = time.monotonic() - t0
    seen = 0
    deadline = t0 + timeout_s
    while (seen := active(client, name, shards)) < shards:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    took = time.monotonic() - t0
    after = rss(pid)
    node_rss = {}
    for node in client.members():
        h = ray.get_actor(node_actor_name(node), namespace=settings.ray.namespace)
        node_rss[node[:8]] = rss(ray.get(h.ping.remote()).pid) / MB
    out = {
        "shards": shards,
        "active": seen,
        "setup_s": setup_s,
        "all_active_s": took,
        "singleton_rss_before_mb": before / MB,
        "singleton_rss_mb": after / MB,
        "singleton_peak_mb": peak.stop() / MB,
        "node_rss_mb": node_rss,
    }
    client.remove_dataset(name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[4096, 65536])
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    cluster = LocalRayCluster()
    try:
        settings = cluster_settings(Path(tempfile.mkdtemp()))
        for _ in range(NODES):
            cluster.add_node(resources={settings.cluster.node_resource: 1})
        actor = start_cluster_actor(settings)
        ray.get(actor.ready.remote(), timeout=120)
        client = FiloPyClient(actor, settings)
        deadline = time.monotonic() + 60
        while len(client.members()) < NODES:
            assert time.monotonic() < deadline, "nodes did not join"
            time.sleep(0.1)
        results = []
        load_before = os.getloadavg()[0]
        for shards in args.shards:
            r = run_size(client, settings, shards, args.timeout)
            print(r, flush=True)
            results.append(r)
    finally:
        cluster.shutdown()

    lines = [
        "FiloPy big dataset benchmark",
        f"{datetime.now():%Y-%m-%d %H:%M}, Python {platform.python_version()}, "
        f"ray {ray.__version__}, {os.cpu_count()} CPUs, 1 head + {NODES} FiloPy nodes on one "
        "machine, ingest.source none (epoch claims in SQLite, no Kafka)",
        f"command: .venv/bin/python bench/bench_big_dataset.py --shards "
        f"{' '.join(map(str, args.shards))}",
        f"load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after: other "
        "work on the machine slows every figure",
        "",
    ]
    for r in results:
        lines.append(
            f"{r['shards']:>6} shards: all Active in {r['all_active_s']:.1f} s "
            f"({r['active']} Active; SetupDataset answered in {r['setup_s']:.2f} s); singleton "
            f"RSS {r['singleton_rss_before_mb']:.0f} MB before, {r['singleton_rss_mb']:.0f} MB "
            f"after, peak {r['singleton_peak_mb']:.0f} MB; node coordinators "
            + ", ".join(f"{v:.0f}" for v in r["node_rss_mb"].values())
            + " MB"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
