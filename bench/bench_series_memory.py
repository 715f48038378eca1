"""Memory held per series by a shard's memstore (series index + per-series state), at scale.

`--series` series (1,000,000 by default) with node-exporter-like label sets (metric name,
`_ws_`, `_ns_`, `job`, `instance`, `cpu`, `mode`: 7 labels, ~110 bytes of part key), one sample
each, ingested as decoders make them (fresh label dicts, batches of 10,000 series) into one
`ShardMemstore`. tracemalloc counts every Python and NumPy allocation the memstore still holds
after a `gc.collect()`; the figure is bytes per series, with the share of the series index
(`SeriesIndex` alone, built from the same label sets) beside it. Issue 15's aim: <= 500 B.

    .venv/bin/python bench/bench_series_memory.py [--series N] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.dataset import Dataset  # noqa: E402
from ingest.batch import SampleBatch  # noqa: E402
from ingest.memstore import ShardMemstore  # noqa: E402
from ingest.series_index import SeriesIndex  # noqa: E402
from store.api import encode_part_key  # noqa: E402

BATCH = 10_000
MODES = ["user", "system", "idle", "iowait", "irq", "softirq", "steal", "nice"]


def label_sets(n: int, start: int) -> list[dict[str, str]]:
    """Series start..start+n: 8 modes x 64 cpus per instance, 250 instances per job."""
    out = []
    for i in range(start, start + n):
        mode, cpu, inst = i % 8, i // 8 % 64, i // 512
        out.append(
            {
                "_metric_": "node_cpu_seconds_total",
                "_ws_": "demo",
                "_ns_": "prod",
                "job": f"node-{inst // 250}",
                "instance": f"10.{inst // 65536 % 256}.{inst // 256 % 256}.{inst % 256}:9100",
                "cpu": str(cpu),
                "mode": MODES[mode],
            }
        )
    return out


def measure(n: int, build) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(bytes per series held, seconds) of building `n` series with `build(labels_batches)`."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    t = time.perf_counter()
    held = build(n)
    seconds = time.perf_counter() - t
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del held
    return (after - before) / n, seconds


def build_memstore(n: int) -> ShardMemstore:
    mem = ShardMemstore(Dataset(name="mem", num_shards=2), 0, groups_per_shard=16)
    for start in range(0, n, BATCH):
        series = label_sets(min(BATCH, n - start), start)
        k = len(series)
        batch = SampleBatch(
            series,
            np.arange(k, dtype=np.int32),
            np.full(k, 1_700_000_000_000, np.int64),
            np.ones(k),
        )
        mem.ingest(batch, start // BATCH)
    return mem


def build_index(n: int) -> SeriesIndex:
    index = SeriesIndex()
    for start in range(0, n, BATCH):
        index.resolve(label_sets(min(BATCH, n - start), start))
    return index


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, default=1_000_000)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "series_memory.txt"))
    args = ap.parse_args()
    n = args.series
    key_bytes = np.mean([len(encode_part_key(lab)) for lab in label_sets(1000, 0)])
    index_b, index_s = measure(n, build_index)
    mem_b, mem_s = measure(n, build_memstore)
    lines = [
        f"# Memory per series (bench/bench_series_memory.py), {time.strftime('%Y-%m-%d %H:%M')}, "
        f"Python {platform.python_version()}, numpy {np.__version__}",
        f"# {n:,} series of 7 labels (part key {key_bytes:.0f} B), one sample each, one shard; "
        "tracemalloc, after gc",
        f"# command: .venv/bin/python bench/bench_series_memory.py --series {n}",
        f"memstore (index + per-series state): {mem_b:7.0f} B/series   "
        f"(built at {n / mem_s:,.0f} series/s)",
        f"  series index alone:                {index_b:7.0f} B/series   "
        f"(built at {n / index_s:,.0f} series/s)",
        "aim (issue 15): <= 500 B/series",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out != "-":
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
