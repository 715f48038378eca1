"""Store benchmark: 1 million samples (10k series x 100) through each backend and back.

Samples look like Prometheus scrapes: 15 s interval with normally distributed jitter, half gauges
(decimal readings, integer gauges, page-sized memory, flags) and half counters (requests, bytes,
CPU seconds). Reports chunk encode/decode speed, bytes per sample by kind, and per backend the
write and read throughput in samples/s. Run from the repository root:

    .venv/bin/python bench/bench_stores.py [--backends sqlite,cassandra] [--out FILE]

Cassandra must be running (scripts/services.sh up cassandra); the benchmark uses a keyspace of its
own and drops it at the end.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from core.dataset import DatasetRef
from store import (
    INT64_MAX,
    INT64_MIN,
    ChunkRecord,
    ColumnStore,
    MetaStore,
    PartKeyRecord,
    encode_part_key,
)
from store.encoding import decode_chunk, encode_chunk

T0 = 1_700_000_000_000
STEP_MS = 15_000
BATCH = 1_000  # series per write/read call, like one flush of a flush group


def _gauge(kind: int, rng: np.random.Generator, n: int) -> np.ndarray:
    if kind == 0:  # e.g. temperature, load average: 1-2 decimals, random walk
        return np.round(40 + np.cumsum(rng.normal(0, 0.3, n)), int(rng.integers(1, 3)))
    if kind == 1:  # percent with 2 decimals, noisy around a level
        return np.round(np.clip(rng.normal(rng.uniform(5, 90), 3, n), 0, 100), 2)
    if kind == 2:  # memory bytes: whole pages
        return (rng.integers(10_000, 1_000_000) + np.cumsum(rng.integers(-64, 65, n))) * 4096.0
    if kind == 3:  # small integer: queue length, open connections
        return rng.poisson(rng.uniform(1, 50), n).astype(np.float64)
    return np.ones(n)  # up, build info


def _counter(kind: int, rng: np.random.Generator, n: int) -> np.ndarray:
    start = float(rng.integers(0, 10**9))
    if kind == 0:  # requests
        return start + np.cumsum(rng.poisson(rng.uniform(1, 500), n)).astype(np.float64)
    if kind == 1:  # bytes
        return start * 1000 + np.cumsum(rng.poisson(rng.uniform(1e3, 1e6), n)).astype(np.float64)
    if kind == 2:  # cpu seconds, 2 decimals
        return np.round(start / 1e4 + np.cumsum(rng.gamma(2, 0.05, n)), 2)
    return start + np.cumsum(rng.random(n) < 0.05).astype(np.float64)  # rare events, mostly flat


def make_series(
    n_series: int, n_samples: int, jitter_ms: float, seed: int = 1
) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """(kind, part key, timestamps, values) per series; half gauges, half counters."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_series):
        ts = T0 + np.arange(n_samples, dtype=np.int64) * STEP_MS
        ts += np.rint(rng.normal(0, jitter_ms, n_samples)).astype(np.int64)
        if i % 2 == 0:
            kind, values = "gauge", _gauge(i // 2 % 5, rng, n_samples)
        else:
            kind, values = "counter", _counter(i // 2 % 4, rng, n_samples)
        labels = {
            "__name__": f"metric_{i % 500}_{kind}",
            "_ws_": "bench",
            "_ns_": f"ns{i % 7}",
            "instance": f"10.0.{i // 250}.{i % 250}:9100",
            "job": "node",
        }
        out.append((kind, encode_part_key(labels), ts, values))
    return out


@contextmanager
def _timer(into: list[float]) -> Iterator[None]:
    t = time.perf_counter()
    yield
    into.append(time.perf_counter() - t)


def bench_codec(series: list[tuple[str, str, np.ndarray, np.ndarray]], out: Callable) -> None:
    n = sum(len(s[2]) for s in series)
    enc: list[float] = []
    with _timer(enc):
        blobs = [encode_chunk(ts, x) for _, _, ts, x in series]
    dec: list[float] = []
    with _timer(dec):
        for b in blobs:
            decode_chunk(b)
    out(f"codec: encode {n / enc[0]:>12,.0f} samples/s   decode {n / dec[0]:>12,.0f} samples/s")
    for kind in ("gauge", "counter"):
        sizes = [len(b) for s, b in zip(series, blobs, strict=True) if s[0] == kind]
        samples = sum(len(s[2]) for s in series if s[0] == kind)
        out(f"bytes/sample {kind + 's':<9} {sum(sizes) / samples:.3f}")
    out(f"bytes/sample all       {sum(map(len, blobs)) / n:.3f}")
    ts_only = [len(encode_chunk(ts, np.zeros(len(ts)))) for _, _, ts, _ in series[:1000]]
    out(f"  timestamps alone     {sum(ts_only) / (1000 * len(series[0][2])):.3f} (chunks of zeros)")
    rng = np.random.default_rng(3)
    full = [
        len(encode_chunk(ts, np.cumsum(rng.normal(0, 1, len(ts))))) / len(ts)
        for _, _, ts, _ in series[:1000]
    ]
    out(
        f"bytes/sample full-precision random-walk floats (worst case, not in the mix) "
        f"{statistics.mean(full):.3f}"
    )


def bench_backend(
    name: str,
    meta: MetaStore,
    column: ColumnStore,
    series: list[tuple[str, str, np.ndarray, np.ndarray]],
    repeats: int,
    out: Callable,
) -> None:
    chunks = [ChunkRecord.from_samples(k, ts, x) for _, k, ts, x in series]
    records = [PartKeyRecord(c.part_key, c.start_time, c.end_time) for c in chunks]
    n = sum(c.num_samples for c in chunks)
    writes: list[float] = []
    reads: list[float] = []
    decodes: list[float] = []
    for r in range(repeats):
        ref = DatasetRef(name=f"bench{r}_{uuid.uuid4().hex[:6]}")
        epoch = meta.claim_epoch(ref, 0, "bench")
        with _timer(writes):
            for i in range(0, len(chunks), BATCH):
                column.write_part_keys(ref, 0, records[i : i + BATCH])
                column.write_chunks(ref, 0, chunks[i : i + BATCH])
            meta.commit_checkpoint(ref, 0, 0, len(chunks), epoch)
        got: dict[str, list[ChunkRecord]] = {}
        with _timer(reads):
            keys = [p.part_key for p in column.list_part_keys(ref, 0)]
            for i in range(0, len(keys), BATCH):
                got.update(column.read_chunks(ref, 0, keys[i : i + BATCH], INT64_MIN, INT64_MAX))
        with _timer(decodes):
            decoded = {k: [c.samples() for c in cs] for k, cs in got.items()}
        assert len(decoded) == len(chunks), f"{name}: read {len(decoded)} of {len(chunks)}"
        for _, k, ts, x in series[:: max(1, len(series) // 100)]:
            ((dts, dx),) = decoded[k]
            assert np.array_equal(dts, ts) and np.array_equal(dx.view(np.uint64), x.view(np.uint64))
    w, rd, dc = min(writes), min(reads), min(decodes)
    out(
        f"{name:<10} write {n / w:>10,.0f} samples/s ({w:.2f} s)   "
        f"read {n / rd:>10,.0f} samples/s ({rd:.2f} s)   "
        f"read+decode {n / (rd + dc):>10,.0f} samples/s   [best of {repeats}]"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--series", type=int, default=10_000)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--jitter-ms", type=float, default=5.0, help="scrape jitter (std dev, ms)")
    ap.add_argument("--backends", default="sqlite,cassandra")
    ap.add_argument("--cassandra", default="127.0.0.1:9042", help="host:port")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also write the report to this file")
    args = ap.parse_args(argv)

    lines: list[str] = []

    def out(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    series = make_series(args.series, args.samples, args.jitter_ms)
    n = args.series * args.samples
    out(
        f"FiloPy store benchmark, {time.strftime('%Y-%m-%d %H:%M')}, Python "
        f"{platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs shared with the Cassandra (and Kafka) under test"
    )
    out(
        f"{args.series:,} series x {args.samples} samples = {n:,} samples; 15 s scrapes with "
        f"{args.jitter_ms:g} ms jitter (std dev); {BATCH} series per write/read call"
    )
    out()
    bench_codec(series, out)
    out()
    out("backends store pre-encoded chunks (encoding is measured above); read+decode adds decoding")
    for backend in args.backends.split(","):
        if backend == "sqlite":
            from store.sqlite import open_sqlite_stores

            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "bench.db"
                meta, column = open_sqlite_stores(path)
                with meta, column:
                    bench_backend("sqlite", meta, column, series, args.repeats, out)
                size = sum(p.stat().st_size for p in Path(tmp).iterdir())
                out(
                    f"{'':<10} file size {size / (n * args.repeats):.2f} bytes/sample "
                    "(part keys, keys and index included)"
                )
        elif backend == "cassandra":
            from store.cassandra import open_cassandra_stores

            host, port = args.cassandra.rsplit(":", 1)
            keyspace = f"filopy_bench_{uuid.uuid4().hex[:8]}"
            meta, column = open_cassandra_stores([host], int(port), keyspace)
            try:
                bench_backend("cassandra", meta, column, series, args.repeats, out)
            finally:
                meta._conn.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
                meta.close()
                column.close()
        else:
            sys.exit(f"unknown backend {backend!r}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
