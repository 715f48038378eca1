"""Memstore benchmark: ingest, flush to SQLite, memory held, queries from memory.

10,000 series, messages of 1,000 series x 10 samples (15 s scrapes with jitter, half gauges,
half counters), pre-built as `SampleBatch`es with fresh label dicts each, as a decoder makes them.
1,000,000 samples in all (100 per series). Reports:

* ingest: samples/s into the memstore (best of 3, a fresh memstore each time);
* flush: `flush_all()` to a SQLite file (best of 3), split into sealing (cutting + encoding)
  and writing;
* memory: tracemalloc bytes per sample held, open (raw buffers) and after the flush (encoded
  chunks kept for queries), per million samples;
* queries: every series' samples decoded from memory.

Run from the repository root:

    .venv/bin/python bench/bench_memstore.py [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from core.dataset import Dataset
from ingest.batch import SampleBatch
from ingest.flush import Flusher, FlushResult
from ingest.memstore import ShardMemstore
from ingest.seal import SealedGroup
from store.sqlite import open_sqlite_stores

SERIES = 10_000
PER_BATCH_SERIES = 1_000
PER_SERIES = 10  # samples per series per message
ROUNDS = 10  # each round: every series gets PER_SERIES samples
T0 = 1_700_000_000_000
STEP_MS = 15_000
DS = Dataset(name="bench", num_shards=4)


def labels_of(i: int) -> dict[str, str]:
    """Fresh str objects every time, as a decoder makes them from each message's bytes."""
    return {
        _fresh("_metric_"): f"metric_{i % 50}",
        _fresh("_ws_"): _fresh("demo"),
        _fresh("_ns_"): _fresh("app"),
        _fresh("instance"): f"10.0.{i // 250}.{i % 250}:9100",
        _fresh("job"): _fresh("node"),
    }


def _fresh(text: str) -> str:
    return text.encode().decode()


def make_batches(seed: int = 1) -> list[SampleBatch]:
    rng = np.random.default_rng(seed)
    counters = rng.integers(0, 10**6, SERIES).astype(np.float64)
    level = rng.uniform(10, 90, SERIES)
    out = []
    for r in range(ROUNDS):
        for first in range(0, SERIES, PER_BATCH_SERIES):
            ids = np.arange(first, first + PER_BATCH_SERIES)
            k = np.arange(PER_SERIES)
            base = T0 + (r * PER_SERIES + k) * STEP_MS
            ts = (base[None, :] + rng.normal(0, 5, (len(ids), PER_SERIES)).astype(np.int64)).ravel()
            gauge = np.round(level[ids, None] + rng.normal(0, 2, (len(ids), PER_SERIES)), 2)
            inc = np.cumsum(rng.poisson(30, (len(ids), PER_SERIES)), axis=1)
            counter = counters[ids, None] + inc
            counters[ids] = counter[:, -1]
            vals = np.where((ids % 2 == 0)[:, None], gauge, counter).ravel()
            out.append(
                SampleBatch(
                    [labels_of(int(i)) for i in ids],
                    np.repeat(np.arange(len(ids), dtype=np.int32), PER_SERIES),
                    ts.astype(np.int64),
                    vals.astype(np.float64),
                )
            )
    return out


def _no_samples() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.float64)


def new_memstore() -> ShardMemstore:
    return ShardMemstore(
        DS,
        0,
        groups_per_shard=16,
        max_chunk_samples=400,
        chunk_span_ms=3_600_000,
        retention_ms=24 * 3_600_000,
        max_samples=100_000_000,
    )


def ingest_all(mem: ShardMemstore, batches: list[SampleBatch]) -> float:
    started = time.perf_counter()
    for off, b in enumerate(batches):
        mem.ingest(b, off)
    return time.perf_counter() - started


def flush_to_sqlite(mem: ShardMemstore) -> tuple[float, float, list[FlushResult]]:
    """`flush_all()` into a fresh SQLite file: (total s, of which sealing s, results)."""
    seal_s = 0.0
    seal = mem.seal_group

    def timed_seal(group: int, *, complete_only: bool = False) -> SealedGroup:
        nonlocal seal_s
        t = time.perf_counter()
        try:
            return seal(group, complete_only=complete_only)
        finally:
            seal_s += time.perf_counter() - t

    mem.seal_group = timed_seal  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        meta, column = open_sqlite_stores(Path(tmp) / "bench.db")
        try:
            epoch = meta.claim_epoch(DS.ref, 0, "bench")
            flusher = Flusher(mem, column, meta, DS.ref, 0, epoch)
            started = time.perf_counter()
            results = flusher.flush_all()
            took = time.perf_counter() - started
        finally:
            meta.close()
            column.close()
    del mem.seal_group
    return took, seal_s, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    batches = make_batches()
    total = sum(len(b) for b in batches)
    say(
        f"FiloPy memstore benchmark, {time.strftime('%Y-%m-%d %H:%M')}, Python "
        f"{platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs (shared with the Cassandra and Kafka of the test services)"
    )
    say(
        f"{SERIES:,} series, {len(batches)} messages of {PER_BATCH_SERIES:,} series x "
        f"{PER_SERIES} samples = {total:,} samples; 16 flush groups, chunks <= 400 samples / 1 h"
    )
    say()

    # ingest, best of 3 (the machine is shared: take the least disturbed run); the first round
    # creates the series, the other nine only append
    first_round = SERIES // PER_BATCH_SERIES
    times, steady = [], []
    for _ in range(3):
        mem = new_memstore()
        gc.collect()
        started = time.perf_counter()
        ingest_all(mem, batches[:first_round])
        mid = time.perf_counter()
        for off, b in enumerate(batches[first_round:], first_round):
            mem.ingest(b, off)
        end = time.perf_counter()
        times.append(end - started)
        steady.append(end - mid)
    best, best_steady = min(times), min(steady)
    steady_n = total - sum(len(b) for b in batches[:first_round])
    assert mem.stats.ingested == total and mem.stats.out_of_order == 0
    say(
        f"ingest        {total / best:>12,.0f} samples/s  ({best:.2f} s for all, series creation "
        f"included)   [best of 3]"
    )
    say(
        f"  known series {steady_n / best_steady:>11,.0f} samples/s  "
        f"({best_steady / (len(batches) - first_round) * 1e3:.2f} ms per message of "
        f"{PER_BATCH_SERIES:,} series x {PER_SERIES})"
    )

    # flush to SQLite, best of 3: sealing (cut + encode) timed inside the same flush
    runs = []
    for attempt in range(3):
        if attempt:
            mem = new_memstore()
            ingest_all(mem, batches)
        runs.append(flush_to_sqlite(mem))
    flush_s, seal_s, results = min(runs, key=lambda r: r[0])
    encoded = mem.memory_bytes()  # buffers are empty now: the chunks' bytes
    chunks = sum(r.chunks for r in results)
    assert sum(r.samples for r in results) == total
    say(
        f"flush_all     {total / flush_s:>12,.0f} samples/s  ({flush_s:.2f} s, {chunks:,} "
        f"chunks, 16 groups, SQLite file)   [best of 3]"
    )
    say(
        f"  seal (cut + encode) {seal_s:.2f} s = {total / seal_s:,.0f} samples/s, "
        f"write + checkpoint {flush_s - seal_s:.2f} s; {encoded / total:.2f} encoded bytes/sample"
    )
    durations = [r.duration_s for r in results]
    say(
        f"  per group flush: mean {np.mean(durations) * 1e3:.0f} ms, "
        f"max {np.max(durations) * 1e3:.0f} ms ({total // 16:,} samples each)"
    )

    # queries from memory (sealed, encoded chunks: decode on read)
    started = time.perf_counter()
    got = sum(len(mem.samples(s)[0]) for s in range(mem.num_series))
    q_s = time.perf_counter() - started
    assert got == total
    say(
        f"query memory  {total / q_s:>12,.0f} samples/s  (every series, whole range, "
        f"decoding {mem.num_series:,} x ~1 chunk)"
    )
    say()

    # memory per million samples held: tracemalloc sees NumPy's allocations too. Batches are
    # built while tracing and dropped before measuring, so what remains is the memstore with the
    # label strings it keeps.
    del mem, batches
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    index_mem = new_memstore()
    for first in range(0, SERIES, PER_BATCH_SERIES):
        labels = [labels_of(i) for i in range(first, first + PER_BATCH_SERIES)]
        index_mem.ingest(SampleBatch(labels, *_no_samples()), 0)
    del labels
    gc.collect()
    index_bytes = tracemalloc.get_traced_memory()[0] - base
    del index_mem
    gc.collect()
    base = tracemalloc.get_traced_memory()[0]
    batches = make_batches()
    mem = new_memstore()
    ingest_all(mem, batches)
    del batches
    gc.collect()
    open_bytes = tracemalloc.get_traced_memory()[0] - base
    for g in range(mem.groups_per_shard):
        mem.mark_flushed(mem.seal_group(g))
    gc.collect()
    sealed_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    held = mem.memory_samples()
    assert held == total
    per_m = 1_000_000 / held
    say(f"memory held, {held:,} samples of {SERIES:,} series (tracemalloc, memstore only):")
    say(
        f"  open buffers    {open_bytes * per_m / 2**20:>6.1f} MiB per million samples "
        f"({open_bytes / held:.1f} B/sample, series index included)"
    )
    say(
        f"  sealed, encoded {sealed_bytes * per_m / 2**20:>6.1f} MiB per million samples "
        f"({sealed_bytes / held:.1f} B/sample, series index included)"
    )
    say(
        f"  series index    {index_bytes / SERIES:>6.0f} B per series (labels, part key, inverted "
        f"index, lookup cache, per-series state; {index_bytes / held:.1f} B/sample here)"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
