"""30-day range queries: from downsampled periods, from raw chunks, and by VictoriaMetrics, on
the same samples in one run (issue 33).

The month (tests/month_data.py): --series series (half gauges, half integer counters with
resets) of --days days of --scrape-s scrapes, written straight into a SQLite store as raw chunks
and part keys, the newest hour in the shard's memstore, then downsampled at 1 h by the shard's
own downsampler (only 1 h: its record encoding is most of its time, and the 5 m resolution
has twelve times the records; the queries here read 1 h either way). VictoriaMetrics (Debian's
victoria-metrics, single node, its own temporary storage) imports the same samples through
/api/v1/import.

Queries, each over the whole month at 1 h steps (720 steps for 30 days): `rate(counter[1h])`,
`max_over_time(gauge[1h])`, `avg_over_time(gauge[1h])`:

* downsampled: `run_node_query` on the shard (what a node evaluates), reading 1 h records;
* raw: the same, with the periods hidden from the evaluator (`RawOnly`): every raw chunk;
* VictoriaMetrics: /api/v1/query_range with its cache off (`nocache=1`).

Medians of --runs runs each, interleaved; what each read (records, chunks) from the store's
counters. Run from the repository root:

    .venv/bin/python bench/bench_long_range.py [--series 1000] [--out bench/results/long_range.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from query.evaluator import range_times  # noqa: E402
from query.executor import NodeQuery, ShardSource, run_node_query  # noqa: E402
from query.promql import parse  # noqa: E402
from store.sqlite import open_sqlite_stores  # noqa: E402
from tests.month_data import (  # noqa: E402
    COUNTER,
    GAUGE,
    HOUR,
    Month,
    MonthSpec,
    RawOnly,
    block_samples,
    generate,
    labels_of,
)

VICTORIA = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
QUERIES = (f"rate({COUNTER}[1h])", f"max_over_time({GAUGE}[1h])", f"avg_over_time({GAUGE}[1h])")
IMPORT_SERIES = 50  # series per /api/v1/import request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vm_request(port: int, path: str, body: bytes | None = None, timeout: float = 600) -> bytes:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return bytes(r.read())


def start_victoria(tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    vm = subprocess.Popen(
        [
            VICTORIA,
            f"-storageDataPath={tmp / 'vm-data'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=10y",
            "-search.maxQueryDuration=600s",
            "-loggerLevel=ERROR",
        ],
        stdout=(tmp / "vm.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while True:
        if vm.poll() is not None:
            raise RuntimeError(f"victoria-metrics exited with {vm.returncode}")
        try:
            vm_request(port, "/health", timeout=2)
            return vm, port
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("victoria-metrics not ready in 60 s") from None
            time.sleep(0.2)


def import_victoria(port: int, spec: MonthSpec) -> float:
    """Every generated sample (stored and in memory) through /api/v1/import; seconds taken."""
    began = time.perf_counter()
    for first in range(0, spec.series, IMPORT_SERIES):
        count = min(IMPORT_SERIES, spec.series - first)
        ts, vals = block_samples(spec, first, count)
        lines = []
        for row, i in enumerate(range(first, first + count)):
            labels = labels_of(i)
            metric = {"__name__": labels.pop("_metric_"), **labels}
            lines.append(
                json.dumps(
                    {"metric": metric, "values": vals[row].tolist(), "timestamps": ts[row].tolist()}
                )
            )
        vm_request(port, "/api/v1/import", "\n".join(lines).encode())
    vm_request(port, "/internal/force_flush")
    return time.perf_counter() - began


def vm_query(port: int, expr: str, spec: MonthSpec) -> int:
    """One range query over the month at 1 h steps, uncached; the number of series answered."""
    params = urllib.parse.urlencode(
        {
            "query": expr,
            "start": (spec.start_ms + HOUR) / 1000,
            "end": spec.end_ms / 1000,
            "step": "3600",
            "nocache": "1",
        }
    )
    got = json.loads(vm_request(port, f"/api/v1/query_range?{params}"))
    if got.get("status") != "success":
        raise RuntimeError(f"VictoriaMetrics: {got}")
    return len(got["data"]["result"])


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=1_000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--scrape-s", type=int, default=60)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    spec = MonthSpec(
        series=args.series, days=args.days, scrape_ms=args.scrape_s * 1000, resolutions_ms=(HOUR,)
    )
    lines = [
        f"# bench_long_range: {spec.series} series x {spec.days} days of {args.scrape_s} s "
        f"scrapes ({spec.series * spec.samples_per_series:,} samples), SQLite",
        f"# {platform.platform()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at start",
        "# command: .venv/bin/python bench/bench_long_range.py " + " ".join(sys.argv[1:]),
    ]

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    for line in lines:
        print(line, flush=True)
    with tempfile.TemporaryDirectory(prefix="long_range_") as tmp_name:
        tmp = Path(tmp_name)
        meta, column = open_sqlite_stores(tmp / "filopy.db")
        month: Month = generate(spec, meta, column, name="month")
        ref = month.dataset.ref
        say(
            f"generated: {month.chunks:,} raw chunks ({month.stored_samples:,} samples) in "
            f"{month.write_s:.1f} s; {month.memory_samples:,} samples in memory; downsampled "
            f"at 1h in {month.downsample_s:.1f} s ({sum(r.series for r in month.rounds):,} "
            "records)"
        )
        raw_bytes = column.stored_bytes(ref).bytes
        down_bytes = column.downsampled_bytes(ref, HOUR).bytes
        say(
            f"stored: raw {raw_bytes / 1e6:.1f} MB, 1h periods {down_bytes / 1e6:.2f} MB "
            f"(raw / {raw_bytes / max(down_bytes, 1):.0f})"
        )
        vm, port = start_victoria(tmp)
        try:
            say(f"VictoriaMetrics: imported in {import_victoria(port, spec):.1f} s")
            times = range_times(spec.start_ms + HOUR, spec.end_ms, HOUR)
            say(f"queries over {spec.days} days at 1h steps ({len(times)} steps), median of "
                f"{args.runs} runs, seconds:")  # fmt: skip
            say(f"{'query':<40} {'downsampled':>12} {'raw':>10} {'VictoriaM':>10}"
                f" {'raw/down':>9} {'VM/down':>8}   read (down; raw)")  # fmt: skip
            for expr in QUERIES:
                node = NodeQuery("series_local", expr=parse(expr), times=times)
                took: dict[str, list[float]] = {"down": [], "raw": [], "vm": []}
                reads: dict[str, str] = {}
                answered: dict[str, int] = {}
                for _ in range(args.runs):
                    for how in ("down", "raw", "vm"):
                        column.chunks_read, column.downsampled_read = 0, {}
                        if how == "vm":
                            secs, n = timed(lambda e=expr: vm_query(port, e, spec))
                        else:
                            src: Any = ShardSource(month.dataset, {0: month.memstore}, column)
                            if how == "raw":
                                src = RawOnly(src)
                            secs, ans = timed(lambda s=src, q=node: run_node_query(q, s))
                            n = len(ans.result.labels)
                            reads[how] = (
                                f"{sum(column.downsampled_read.values()):,} records, "
                                f"{column.chunks_read:,} chunks"
                            )
                        took[how].append(secs)
                        answered[how] = n
                if len(set(answered.values())) != 1:
                    raise RuntimeError(f"{expr}: series answered differ: {answered}")
                med = {k: statistics.median(v) for k, v in took.items()}
                say(
                    f"{expr:<40} {med['down']:>12.3f} {med['raw']:>10.3f} {med['vm']:>10.3f} "
                    f"{med['raw'] / med['down']:>9.1f} {med['vm'] / med['down']:>8.1f}   "
                    f"{reads['down']}; {reads['raw']}"
                )
        finally:
            vm.terminate()
            vm.wait(30)
            meta.close()
            column.close()
    say(f"# load {os.getloadavg()[0]:.2f} at the end")
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
