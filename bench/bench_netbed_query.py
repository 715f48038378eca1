"""The query path across hosts against the same on one host: bench_promql.py's small queries, on
the same samples, in one run. Needs root (the many-hosts bed, tests/netbed) and Kafka on
127.0.0.1 for the one-host cluster (`scripts/services.sh up kafka`). Results in
bench/results/netbed_query.txt.

- one host: tests/compliance/harness.py's two-node cluster on 127.0.0.1 (SQLite, 4 shards); the
  timing client a process of its own on the same machine;
- across hosts: the bed's cluster (Kafka, Redis, head, three nodes each on a host of its own; 4
  shards over at least two nodes); the samples written through the gateway's remote-write
  endpoint from the client host, and the timing client on the client host, asking the head's
  PromQL API, which asks the nodes over their query channels across the bed's bridge.

Both hold `--instances` of tests/compliance/demo_data.py's demo instances (94 series each). Each
query runs `--runs` times after `--warmup` untimed runs; p50 and p99 wall time of the HTTP call,
and the ratio across hosts / one host. The bed's links are veth pairs on one bridge of one
machine (no propagation delay, no NIC): the difference is the extra hops' software cost
(namespaces, bridge, iptables), and the head being a process of its own rather than the harness'.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_promql import QUERIES, ask  # noqa: E402
from tests.compliance import demo_data, harness  # noqa: E402

DATASET = "benchquery"
RESULTS = ROOT / "bench" / "results" / "netbed_query.txt"
SPAN_S = 3 * 3600 + 900  # as bench_promql.py


def timings(base: str, end_s: float, runs: int, warmup: int) -> list[Any]:
    """[(name, series, [seconds])] of every query against `base`, one after the other."""
    out = []
    with httpx.Client(timeout=120) as http:
        for name, query, rng, step in QUERIES:
            took, count = [], 0
            for run in range(warmup + runs):
                t = time.perf_counter()
                count = ask(http, base, query, end_s, rng, step)
                if run >= warmup:
                    took.append(time.perf_counter() - t)
            out.append((name, count, took))
    return out


def load(url: str, end_s: int, instances: int) -> int:
    """Write the demo series to a remote-write URL; how many samples."""
    series = demo_data.generate(end_s, instances=instances, span_s=SPAN_S)
    headers = {
        "Content-Encoding": "snappy",
        "Content-Type": "application/x-protobuf",
        "X-Prometheus-Remote-Write-Version": "0.1.0",
    }
    with httpx.Client(timeout=120) as http:
        for body in harness.remote_write_bodies(series):
            for _ in range(60):  # 503 while Kafka is slow: retry, as a sender does
                r = http.post(url, content=body, headers=headers)
                if r.status_code != 503:
                    break
                time.sleep(1)
            r.raise_for_status()
    return sum(len(s.values) for s in series)


def bed_cluster_timings(args: argparse.Namespace, end_s: int) -> list[Any]:
    from tests.netbed.bed import Bed
    from tests.netbed.cluster import NetCluster, wait_for

    workdir = ROOT / ".netbed" / "bench-query"
    shutil.rmtree(workdir, ignore_errors=True)
    bed = Bed(workdir).create()
    c = NetCluster(bed, ROOT)
    py = str(ROOT / ".venv" / "bin" / "python")
    try:
        c.start()
        c.rest("/api/v1/datasets", method="POST",
               body={"name": DATASET, "num_shards": 4, "min_num_nodes": 2})  # fmt: skip
        c.wait_settled(DATASET)
        c.start_gateway()
        write = f"http://gateway:8081/ingest/{DATASET}/api/v1/write"
        loaded = bed.sh("client", [py, __file__, "--load", write, str(end_s), str(args.instances)],
                        cwd=ROOT, timeout=1800)  # fmt: skip
        samples = int(loaded.stdout.strip().splitlines()[-1])

        def held() -> bool:
            got = c.metric("filopy_ingested_samples_total", dataset=DATASET)
            return sum(got.values()) >= samples

        wait_for(f"{samples} samples held", held, 900)
        base = f"http://head:8080/promql/{DATASET}"
        client = [py, __file__, "--client", base, str(end_s), str(args.runs), str(args.warmup)]
        done = bed.sh("client", client, cwd=ROOT, timeout=3600)
        return list(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        c.stop()
        bed.remove()


def one_host_timings(args: argparse.Namespace, end_s: int) -> list[Any]:
    series = demo_data.generate(end_s, instances=args.instances, span_s=SPAN_S)
    with (
        tempfile.TemporaryDirectory(prefix="bench-netbed-query-") as tmp,
        harness.filopy(Path(tmp), series, args.kafka) as fp,
    ):
        client = [sys.executable, __file__, "--client", fp, str(end_s), str(args.runs),
                  str(args.warmup)]  # fmt: skip
        done = subprocess.run(client, capture_output=True, text=True, check=True)
        return list(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    if sys.argv[1:2] == ["--client"]:
        base, end, runs, warmup = sys.argv[2:6]
        print(json.dumps(timings(base, float(end), int(runs), int(warmup))))
        return
    if sys.argv[1:2] == ["--load"]:
        url, end, instances = sys.argv[2:5]
        print(load(url, int(end), int(instances)))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--instances", type=int, default=20)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--kafka", default="127.0.0.1:9092")
    args = p.parse_args()
    import coordinator.local_cluster  # noqa: F401  binds Ray to loopback before anything imports Ray

    end_s = int(time.time()) // 60 * 60 - 60
    print("one host ...", file=sys.stderr, flush=True)
    local = one_host_timings(args, end_s)
    print("across hosts ...", file=sys.stderr, flush=True)
    remote = bed_cluster_timings(args, end_s)
    lines = [
        f"# bench_netbed_query.py on {platform.node()} ({platform.machine()}), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"# {args.instances} demo instances ({args.instances * 94} series), {args.runs} runs "
        f"after {args.warmup} warm-up per query; HTTP wall time in ms",
        "# one host: 2 nodes, client on 127.0.0.1; across hosts: the bed, 3 nodes, client on its "
        "own host",
        "",
        f"{'query':<42} {'series':>6} {'1 host p50':>10} {'bed p50':>8} {'ratio':>6} "
        f"{'1 host p99':>10} {'bed p99':>8}",
    ]
    for (name, n1, t1), (_, n2, t2) in zip(local, remote, strict=True):
        if n1 != n2:
            raise RuntimeError(f"{name}: {n1} series on one host, {n2} across hosts")
        a50, b50 = np.percentile(t1, 50) * 1e3, np.percentile(t2, 50) * 1e3
        a99, b99 = np.percentile(t1, 99) * 1e3, np.percentile(t2, 99) * 1e3
        lines.append(
            f"{name:<42} {n1:>6} {a50:>10.1f} {b50:>8.1f} {b50 / a50:>5.2f}x "
            f"{a99:>10.1f} {b99:>8.1f}"
        )
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
