"""Record format benchmark: binary decode/encode, line protocol parsing, gateway to real Kafka.

Binary messages are what the gateway writes for a typical scrape: 1000 series (8 labels each)
x 10 samples. Line protocol messages are Telegraf-like (cpu, mem and disk lines of 100 hosts):
lines of several fields, which the column path (one field a line) does not take, so both
`decode_influx` figures are its reference, the parser a line (bench_ingest_http.py --decode-only
times the column path).
The gateway sends 10k series x 100 scrapes to a fresh 8-partition topic through one process,
timed until every message is acknowledged (acks=all). Run from the repository root:

    .venv/bin/python bench/bench_records.py [--out bench/results/records.txt]

Kafka must be running (scripts/services.sh up kafka); the topic is deleted at the end.
"""

from __future__ import annotations

import argparse
import platform
import random
import string
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import line_protocol_parser
import numpy as np
import zstandard
from confluent_kafka.admin import AdminClient

from core.dataset import Dataset, SourceSettings
from ingest.batch import SampleBatch
from ingest.gateway import Gateway
from ingest.kafka_config import kafka_client_config
from ingest.topics import ensure_topic
from ingest.wire.binary_format import decode_binary, encode_binary_parts, encode_labels
from ingest.wire.line_protocol import decode_influx

T0 = 1_700_000_000_000
STEP_MS = 15_000


def _best(fn: Callable[[], object], repeat: int, inner: int) -> float:
    """Best wall time of one call, over `repeat` rounds of `inner` calls."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t) / inner)
    return best


def _series(n: int, seed: int = 1) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [
        {
            "_metric_": f"http_requests_total_{i % 50}",
            "_ws_": "demo",
            "_ns_": f"app{i % 7}",
            "instance": f"10.0.{i % 256}.{i // 256}:9100",
            "job": "node",
            "method": rng.choice(["GET", "POST", "PUT"]),
            "code": rng.choice(["200", "404", "500"]),
            "path": "/api/v1/" + "".join(rng.choices(string.ascii_lowercase, k=8)),
        }
        for i in range(n)
    ]


def _scrapes(n_series: int, n_scrapes: int, seed: int = 0) -> SampleBatch:
    """Scrape-major samples: every series once per scrape, 5 ms jitter, gauges and counters."""
    rng = np.random.default_rng(seed)
    shape = (n_scrapes, n_series)
    ts = T0 + STEP_MS * np.arange(n_scrapes)[:, None] + rng.normal(0, 5, shape).astype(np.int64)
    base = rng.uniform(0, 1e6, n_series)
    gauge = np.round(base + np.cumsum(rng.normal(0, 3, shape), 0), 2)
    counter = np.floor(base) + np.cumsum(rng.integers(0, 100, shape), 0)
    vals = np.where(np.arange(n_series) % 2 == 0, gauge, counter)
    return SampleBatch(
        _series(n_series),
        np.tile(np.arange(n_series, dtype=np.int32), n_scrapes),
        ts.ravel(),
        vals.ravel().astype(np.float64),
    )


def bench_binary(lines: list[str]) -> None:
    batch = _scrapes(1000, 10)
    n = len(batch)
    blobs = [encode_labels(s) for s in batch.series]
    counts = [len(s) for s in batch.series]
    lines.append(f"binary format: {n:,} samples per message (1000 series x 10, 8 labels each)")
    for level in (0, 1, 3):
        msg = encode_binary_parts(
            blobs, counts, batch.series_idx, batch.timestamps, batch.values, level
        )
        assert len(decode_binary(msg).batch) == n

        def enc(level: int = level) -> bytes:
            return encode_binary_parts(
                blobs, counts, batch.series_idx, batch.timestamps, batch.values, level
            )

        t_enc = _best(enc, 5, 20)
        t_dec = _best(lambda msg=msg: decode_binary(msg), 5, 20)
        name = "uncompressed" if level == 0 else f"zstd level {level}"
        lines.append(
            f"  {name:<13} {len(msg) / n:6.2f} bytes/sample   "
            f"decode {n / t_dec:>12,.0f} samples/s   encode {n / t_enc:>12,.0f} samples/s "
            f"(labels pre-encoded, as the gateway caches them)"
        )


def _telegraf(hosts: int, scrapes: int, escaped: bool) -> tuple[str, int]:
    rng = random.Random(2)
    out, samples = [], 0
    for s in range(scrapes):
        t = (T0 + STEP_MS * s) * 1_000_000
        for h in range(hosts):
            host = f"web\\ {h}" if escaped else f"host{h}"
            out.append(
                f"cpu,cpu=cpu-total,host={host},dc=eu-west-1 usage_user={rng.random() * 100:.6f},"
                f"usage_system={rng.random() * 10:.6f},usage_idle={rng.random() * 100:.6f},"
                f"usage_iowait=0.5,usage_steal=0 {t}"
            )
            out.append(
                f"mem,host={host},dc=eu-west-1 used={rng.randint(1, 10**10)}i,"
                f"free={rng.randint(1, 10**10)}i,available_percent={rng.random() * 100:.4f},"
                f"total=17179869184i {t}"
            )
            out.append(
                f"disk,device=sda1,fstype=ext4,host={host},mode=rw,path=/ "
                f"used={rng.randint(1, 10**11)}i,free={rng.randint(1, 10**11)}i,"
                f"used_percent={rng.random() * 100:.3f} {t}"
            )
            samples += 12
    return "\n".join(out), samples


def bench_influx(lines: list[str]) -> None:
    lines.append(
        f"line protocol: Telegraf-like cpu/mem/disk lines, 100 hosts x 10 scrapes per message "
        f"(3,000 lines, 12,000 samples); line-protocol-parser {line_protocol_parser.__version__}"
    )
    for escaped in (False, True):
        text, n = _telegraf(100, 10, escaped)
        data = text.encode()
        fast = decode_influx(data, T0)
        slow = decode_influx(data, T0, fast_path=False)
        assert len(fast.batch) == len(slow.batch) == n and not fast.batch.bad_records
        t_fast = _best(lambda data=data: decode_influx(data, T0), 15, 2)
        t_slow = _best(lambda data=data: decode_influx(data, T0, fast_path=False), 15, 2)
        t_parse = _best(
            lambda text=text: [line_protocol_parser.parse_line(x) for x in text.split("\n")], 5, 3
        )
        what = "escaped tag values (\\ )" if escaped else "plain lines"
        lines.append(f"  {what}:")
        lines.append(
            f"    decode_influx                            {n / t_fast:>12,.0f} samples/s "
            f"({3000 / t_fast:>9,.0f} lines/s)"
        )
        lines.append(
            f"    decode_influx, fast_path=False           {n / t_slow:>12,.0f} samples/s "
            f"({3000 / t_slow:>9,.0f} lines/s)"
        )
        lines.append(
            f"    parse_line() alone, no sample building   {n / t_parse:>12,.0f} samples/s "
            f"({3000 / t_parse:>9,.0f} lines/s)"
        )


def bench_gateway(lines: list[str], bootstrap: str) -> None:
    dataset = Dataset(
        name=f"bench{uuid.uuid4().hex[:8]}",
        num_shards=8,
        source=SourceSettings(bootstrap_servers=bootstrap),
    )
    ensure_topic(dataset)
    admin = AdminClient(kafka_client_config(None, bootstrap))
    try:
        n_series, scrapes = 10_000, 100
        batch = _scrapes(n_series, scrapes, seed=3)
        lines.append(
            "gateway -> Kafka (8 partitions, acks=all, idempotent, zstd 1, 1 process), "
            f"{n_series:,} series x {scrapes} scrapes, timed until every message is acked:"
        )
        for scrapes_per_call in (1, 10):
            per_call = n_series * scrapes_per_call
            gateway = Gateway(dataset)
            t = time.perf_counter()
            for c in range(scrapes // scrapes_per_call):
                sl = slice(c * per_call, (c + 1) * per_call)
                gateway.send_batch(
                    SampleBatch(
                        batch.series, batch.series_idx[sl], batch.timestamps[sl], batch.values[sl]
                    )
                )
            gateway.close()
            dt = time.perf_counter() - t
            p = gateway.progress()
            lines.append(
                f"  send_batch, {scrapes_per_call:>2} scrape(s) per call: "
                f"{p.samples_acked / dt:>10,.0f} samples/s   ({p.messages_acked} messages, "
                f"{p.bytes_sent / p.samples_acked:5.2f} bytes/sample, {dt:.2f} s)"
            )
        rows = [
            (batch.series[i], t_, v)
            for i, t_, v in zip(
                batch.series_idx[:200_000].tolist(),
                batch.timestamps[:200_000].tolist(),
                batch.values[:200_000].tolist(),
                strict=True,
            )
        ]
        gateway = Gateway(dataset)
        t = time.perf_counter()
        gateway.send(rows)
        gateway.close()
        dt = time.perf_counter() - t
        lines.append(
            f"  send(rows) of (labels, ts, value) tuples: {len(rows) / dt:>10,.0f} samples/s   "
            f"({len(rows):,} samples, 10 scrapes per chunk)"
        )
    finally:
        admin.delete_topics([dataset.topic])[dataset.topic].result(timeout=30)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--no-kafka", action="store_true", help="skip the gateway benchmark")
    ap.add_argument("--out", type=Path, help="also write the report to this file")
    args = ap.parse_args(argv)
    lines = [
        f"FiloPy record formats benchmark, {datetime.now():%Y-%m-%d %H:%M}, Python "
        f"{platform.python_version()}, numpy {np.__version__}, zstandard "
        f"{zstandard.__version__}, {platform.machine()}, 2 CPUs shared with the Kafka under test",
        "best of several rounds; on a shared machine runs vary by up to 1.5x, ratios hold",
        "",
    ]
    bench_binary(lines)
    lines.append("")
    bench_influx(lines)
    if not args.no_kafka:
        lines.append("")
        bench_gateway(lines, args.bootstrap)
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
