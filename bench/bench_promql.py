"""PromQL latency side by side with Prometheus, on the same samples, interleaved in one run.

Needs Kafka (`scripts/services.sh up kafka`) and Debian's prometheus/promtool
(scripts/system-deps.sh). The demo series of tests/compliance/demo_data.py for `--instances`
instances (94 series each; 20 by default: 1,880 series, 4.4M samples over 3 h 15 min at 5 s
scrapes, ending a minute ago) go:
- to Debian's Prometheus as promtool-built TSDB blocks (`create-blocks-from openmetrics`);
- to a real two-node FiloPy cluster through its remote-write endpoint and Kafka (4 shards,
  SQLite store), as tests/compliance/harness.py loads them.

Once FiloPy's nodes have flushed what the load left them (the reference's blocks were built
offline), each query runs `--runs` times against both through their HTTP query APIs, from a client
process of its own, alternating which goes first, after `--warmup` untimed runs each; the
table gives p50 and p99 wall time of the HTTP call (request to parsed JSON) and the ratio
FiloPy / Prometheus. Both answers are checked to hold the same number of series. The last
two rows are the floor under the others: `vector(1)` calls no node, and a selector matching
nothing costs FiloPy the round trip to its nodes and nothing else. Results:
bench/results/promql.txt (`--out -` prints). `--transport ray` sends the node parts as Ray
actor calls instead of over the nodes' query channels (coordinator/query_channel.py), to
compare the two; the header gives the load average before and after (the machine is shared).

`--only QUERY --times N` skips Prometheus and the table: the client sends the one instant query N
times in a row to FiloPy (`--only` again: each query in turn, on the same cluster), and prints
its latency percentiles with what each query cost the servers: the nodes' CPU and wall time per
node part (their query channels' counters) and the REST process' CPU per query (this process:
the REST server; its CPU when idle, Ray's driver threads and such, measured first and taken
off; how much of it was spent in the kernel). `--pause-ms N` leaves N ms of idle time between
the queries, as Prometheus' queries do in the interleaved run (docs/query.md: after a pause each
query costs several times the CPU). For finding where a small query's time goes; nothing is
written to bench/results.
"""

from __future__ import annotations

import argparse
import json
import os
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

from tests.compliance import demo_data, harness  # noqa: E402

# (name, query, range seconds or 0 for an instant query, step seconds)
QUERIES = [
    (
        "rate, summed by instance",
        "sum by (instance) (rate(demo_cpu_usage_seconds_total[5m]))",
        0,
        0,
    ),
    (
        "histogram buckets' rates by le",
        "sum by (le) (rate(demo_api_request_duration_seconds_bucket[5m]))",
        0,
        0,
    ),
    (
        "histogram_quantile 0.9",
        "histogram_quantile(0.9, sum by (le) (rate(demo_api_request_duration_seconds_bucket[5m])))",
        0,
        0,
    ),
    ("a gauge family, raw", "demo_memory_usage_bytes", 0, 0),
    (
        "3 h range at 60 s: rate by instance",
        "sum by (instance) (rate(demo_cpu_usage_seconds_total[5m]))",
        3 * 3600,
        60,
    ),
    ("1 h range at 15 s: avg_over_time", "avg_over_time(demo_memory_usage_bytes[5m])", 3600, 15),
    # The floor under the rows above: an answer that calls no node (HTTP, parsing, JSON), and
    # a selector that matches nothing, so FiloPy's nodes are called but find no series (the
    # round trip to the nodes alone, which Prometheus, holding its data in process, never pays).
    ("vector(1): no node called", "vector(1)", 0, 0),
    ("no series: the nodes' round trip", "sum(rate(demo_no_such_metric[5m]))", 0, 0),
]


def ask(http: httpx.Client, base: str, query: str, end: float, rng: int, step: int) -> int:
    """One query; the number of series answered."""
    if rng:
        params = {"query": query, "start": end - rng, "end": end, "step": step}
        resp = http.post(f"{base}/api/v1/query_range", data=params)
    else:
        resp = http.post(f"{base}/api/v1/query", data={"query": query, "time": end})
    body = resp.json()
    if resp.status_code != 200 or body.get("status") != "success":
        raise RuntimeError(f"{base}: {query}: {resp.status_code} {body}")
    return len(body["data"]["result"])


def measure(fp: str, ref: str, end: float, runs: int, warmup: int) -> list[Any]:
    """Every query against both, interleaved: [(name, series, {who: [seconds]})]."""
    out = []
    with httpx.Client(timeout=120) as http:
        for name, query, rng, step in QUERIES:
            times: dict[str, list[float]] = {"filopy": [], "prometheus": []}
            counts = {}
            for run in range(warmup + runs):
                order = [("filopy", fp), ("prometheus", ref)]
                if run % 2:
                    order.reverse()
                for who, base in order:
                    t = time.perf_counter()
                    counts[who] = ask(http, base, query, end, rng, step)
                    if run >= warmup:
                        times[who].append(time.perf_counter() - t)
            if counts["filopy"] != counts["prometheus"]:
                raise RuntimeError(f"{query}: series differ: {counts}")
            out.append((name, counts["filopy"], times))
    return out


def at_rest(fp: str, quiet_s: float = 5.0, limit_s: float = 300.0) -> float:
    """Wait until FiloPy's nodes have flushed what the load left them (the samples written to
    the store, `filopy_flushed_samples` on its /metrics, unchanged for `quiet_s`): the
    reference's blocks were built offline, so queries timed while FiloPy still flushes would
    time that work too. Seconds waited."""
    from prometheus_client.parser import text_string_to_metric_families

    base = fp.split("/promql/")[0]
    t0 = time.monotonic()
    last, since = -1.0, t0
    with httpx.Client(timeout=30) as http:
        while time.monotonic() - t0 < limit_s:
            text = http.get(f"{base}/metrics").text
            flushed = sum(
                s.value
                for fam in text_string_to_metric_families(text)
                if fam.name == "filopy_flushed_samples"
                for s in fam.samples
            )
            now = time.monotonic()
            if flushed != last:
                last, since = flushed, now
            elif now - since >= quiet_s:
                break
            time.sleep(0.5)
    return time.monotonic() - t0


def _load(avg: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in avg)


def repeat(fp: str, query: str, end: float, times: int, pause_s: float) -> list[float]:
    """One instant query `times` times in a row (`pause_s` apart): each call's seconds."""
    out = []
    with httpx.Client(timeout=120) as http:
        for _ in range(times):
            t = time.perf_counter()
            ask(http, fp, query, end, 0, 0)
            out.append(time.perf_counter() - t)
            if pause_s:
                time.sleep(pause_s)
    return out


def node_channel_stats() -> list[dict[str, float]]:
    """Each node's query channel counters (`NodeCoordinator.query_channel_stats`)."""
    import ray

    from coordinator.names import node_actor_name

    prefix = node_actor_name("")
    found = ray.util.list_named_actors(all_namespaces=True)
    handles = [
        ray.get_actor(a["name"], namespace=a["namespace"])
        for a in found
        if a["name"].startswith(prefix)
    ]
    return [ray.get(h.query_channel_stats.remote()) for h in handles]


def profile_one(fp: str, query: str, end_s: int, times: int, pause_s: float) -> str:
    """`--only`: the query `times` times from a client process; latency and server costs."""
    idle0, t0 = time.process_time(), time.perf_counter()
    time.sleep(3.0)  # what this process spends with no query (Ray's driver threads and such)
    idle_per_s = (time.process_time() - idle0) / (time.perf_counter() - t0)
    before, cpu0, t0 = node_channel_stats(), time.process_time(), time.perf_counter()
    sys0 = os.times().system
    client = [sys.executable, __file__, "--client-repeat", fp, query]
    client += [str(end_s), str(times), str(pause_s)]
    done = subprocess.run(client, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the timing client failed: {done.stderr}")
    rest_cpu = time.process_time() - cpu0 - idle_per_s * (time.perf_counter() - t0)
    rest_sys = os.times().system - sys0
    after = node_channel_stats()
    p50, p90, p99 = np.percentile(json.loads(done.stdout), [50, 90, 99]) * 1000
    lines = [
        f"{query}: {times} times{f' {pause_s * 1000:g} ms apart' if pause_s else ''}, "
        f"p50 {p50:.2f} ms, p90 {p90:.2f}, p99 {p99:.2f}",
        f"REST process: {rest_cpu / times * 1e6:.0f} us of CPU per query (beyond its "
        f"{idle_per_s * 1000:.0f} ms per second when idle; {rest_sys / times * 1e6:.0f} us of "
        "it in the kernel)",
    ]
    for a, b in zip(before, after, strict=True):
        parts = b.get("served", 0) - a.get("served", 0)
        if parts:
            cpu = (b["cpu_s"] - a.get("cpu_s", 0.0)) / parts * 1e6
            wall = (b["wall_s"] - a.get("wall_s", 0.0)) / parts * 1e6
            lines.append(f"node: {parts} parts, {cpu:.0f} us of CPU, {wall:.0f} us wall per part")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client-repeat":
        fp, query, end, times, pause_s = sys.argv[2:7]
        print(json.dumps(repeat(fp, query, float(end), int(times), float(pause_s))))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        cp = argparse.ArgumentParser()
        cp.add_argument("--client", nargs=3, metavar=("FILOPY", "PROMETHEUS", "END"))
        cp.add_argument("--runs", type=int)
        cp.add_argument("--warmup", type=int)
        ca = cp.parse_args()
        fp, ref, end = ca.client
        print(json.dumps(measure(fp, ref, float(end), ca.runs, ca.warmup)))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--instances", type=int, default=20)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--kafka", default="127.0.0.1:9092")
    ap.add_argument("--transport", choices=["channel", "ray"], default="channel")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "promql.txt"))
    ap.add_argument(
        "--only",
        metavar="QUERY",
        action="append",
        help="an instant query, FiloPy only (see above); repeatable",
    )
    ap.add_argument("--times", type=int, default=2000, help="with --only: how many times")
    ap.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        help="with --only: idle time between queries (as when they are interleaved)",
    )
    args = ap.parse_args()
    import coordinator.local_cluster  # noqa: F401  binds Ray to loopback before anything imports Ray
    from coordinator import cluster_queries  # the REST server below runs in this process

    cluster_queries.DEFAULT_TRANSPORT = args.transport
    load_before = os.getloadavg()
    prometheus = shutil.which("prometheus") or "/usr/bin/prometheus"
    version = subprocess.run(
        [prometheus, "--version"], capture_output=True, text=True
    ).stdout.splitlines()[0]

    end_s = int(time.time()) // 60 * 60 - 60
    span_s = 3 * 3600 + 900
    series = demo_data.generate(end_s, instances=args.instances, span_s=span_s)
    samples = sum(len(s.values) for s in series)
    loading = "FiloPy" if args.only else "both"
    print(f"{len(series)} series, {samples} samples; loading {loading}", file=sys.stderr)
    lines: list[str] = []
    if args.only:
        with (
            tempfile.TemporaryDirectory(prefix="bench-promql-") as tmp,
            harness.filopy(Path(tmp), series, args.kafka) as fp,
        ):
            print(f"flushes settled in {at_rest(fp):.0f} s", file=sys.stderr)
            for query in args.only:
                line = profile_one(fp, query, end_s, args.times, args.pause_ms / 1000)
                print(line, flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="bench-promql-") as tmp:
        work = Path(tmp)
        (work / "ref").mkdir()
        (work / "filopy").mkdir()
        t0 = time.perf_counter()
        with (
            harness.reference(work / "ref", series, binary=prometheus) as ref,
            harness.filopy(work / "filopy", series, args.kafka) as fp,
        ):
            print(f"loaded in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            settled_s = at_rest(fp)
            print(f"flushes settled in {settled_s:.0f} s", file=sys.stderr)
            # The timing client runs in its own process: in this one it would share the GIL
            # with FiloPy's REST server (a thread here), which a real client never does.
            client = [sys.executable, __file__, "--client", fp, ref, str(end_s)]
            client += ["--runs", str(args.runs), "--warmup", str(args.warmup)]
            done = subprocess.run(client, capture_output=True, text=True, check=False)
            if done.returncode:
                raise RuntimeError(f"the timing client failed: {done.stderr}")
            for name, count, times in json.loads(done.stdout):
                f50, f99 = np.percentile(times["filopy"], [50, 99]) * 1000
                p50, p99 = np.percentile(times["prometheus"], [50, 99]) * 1000
                row = (
                    f"{name:<38} {count:>6} {f50:>9.1f} {f99:>9.1f} {p50:>9.1f} "
                    f"{p99:>9.1f} {f50 / p50:>7.2f} {f99 / p99:>7.2f}"
                )
                print(row, file=sys.stderr)
                lines.append(row)

    load_after = os.getloadavg()
    header = [
        f"# PromQL latency, FiloPy vs {version} (bench/bench_promql.py)",
        f"# {platform.node()}: {platform.processor() or platform.machine()}, "
        f"{len(series)} series, {samples} samples (5 s scrapes, {span_s // 60} min), "
        f"2 FiloPy nodes, 4 shards; {args.runs} interleaved runs per query after "
        f"{args.warmup} warm-up, once FiloPy's flushes after the load have settled; wall "
        "time of each HTTP query in ms",
        f"# node parts over {'Ray actor calls' if args.transport == 'ray' else 'query channels'}"
        f"; load average (1, 5, 15 min) {_load(load_before)} before, {_load(load_after)} after",
        f"# command: .venv/bin/python bench/bench_promql.py --instances {args.instances} "
        f"--runs {args.runs}" + (" --transport ray" if args.transport == "ray" else ""),
        f"{'query':<38} {'series':>6} {'filopy50':>9} {'filopy99':>9} {'prom50':>9} "
        f"{'prom99':>9} {'p50 x':>7} {'p99 x':>7}",
    ]
    text = "\n".join(header + lines) + "\n"
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
