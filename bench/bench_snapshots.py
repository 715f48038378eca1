"""Open-buffer snapshots (ingest/open_buffers.py): encode/decode speed and size (run on demand).

A flush writes each group's open samples as one snapshot; with 15 s scrapes, a 60 s flush
interval and 120-sample chunks a sample is rewritten about 15 times before its chunk seals, so
the snapshot codec must cost far less per sample than ingestion. Data: 20,000 series x 60 open
samples (half decimal gauges, half integer counters, 15 s scrapes with jitter, 4-label part keys).
Results: bench/results/snapshots.txt.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.open_buffers import OpenBuffers, decode_open_buffers, encode_open_buffers  # noqa: E402
from store import encode_part_key  # noqa: E402

SERIES, OPEN = 20_000, 60


def workload() -> OpenBuffers:
    rng = np.random.default_rng(1)
    n, per = SERIES, OPEN
    jitter = rng.integers(-5, 6, (n, per))
    ts = (1_700_000_000_000 + np.arange(per) * 15_000 + jitter).ravel().astype(np.int64)
    half = n // 2
    gauges = np.round(rng.normal(50, 5, (half, per)), 1).ravel()
    counters = np.cumsum(rng.integers(0, 100, (n - half, per)), axis=1).ravel().astype(float)
    keys = [
        encode_part_key({"__name__": "g", "instance": f"host-{i}:9100", "job": "node", "dc": "eu"})
        for i in range(n)
    ]
    return OpenBuffers(
        keys,
        ts.reshape(n, per)[:, 0].copy(),
        np.arange(n + 1, dtype=np.int64) * per,
        ts,
        np.concatenate([gauges, counters]),
    )


def best_of(fn, runs: int = 7) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ob = workload()
    blob = encode_open_buffers(ob)
    enc = best_of(lambda: encode_open_buffers(ob))
    dec = best_of(lambda: decode_open_buffers(blob))
    lines = [
        "Open-buffer snapshots (bench/bench_snapshots.py)",
        f"{time.strftime('%Y-%m-%d %H:%M')}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs (shared), best of 7",
        f"{ob.samples:,} open samples of {SERIES:,} series ({OPEN} each)",
        f"encode {ob.samples / enc / 1e6:6.1f} M samples/s ({enc * 1000:.0f} ms)",
        f"decode {ob.samples / dec / 1e6:6.1f} M samples/s ({dec * 1000:.0f} ms)",
        f"size   {len(blob) / ob.samples:6.2f} bytes/sample, part keys included "
        f"({len(blob) / 2**20:.1f} MiB)",
    ]
    text = "\n".join(lines) + "\n"
    (ROOT / "bench" / "results" / "snapshots.txt").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
