"""Months of history, generated fast and written straight into a store, as a shard's owner would
have left it: raw chunks and part keys in the ColumnStore, the newest hour in the memstore, and
the downsampled periods and marks written by the real downsampler (`ingest.downsampler`) reading
them back, so what the long-range tests and benchmark query is what a cluster would hold.

Here rather than in bench/ because both the tests and bench/bench_long_range.py import it, and
bench scripts already import from tests (bench/ is not a package).

Samples are vectorised per block of series (a Python loop per block and per series, none per
sample): half gauges (float random walks), half counters (integer increments with resets every
few days, as a restarted process's counter).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from core.dataset import Dataset, SpreadSettings
from ingest.batch import SampleBatch
from ingest.downsampler import Downsampler, DownsampleRound
from ingest.memstore import ShardMemstore
from ingest.seal import chunk_cuts
from store import ColumnStore, MetaStore
from store.api import ChunkRecord, PartKeyRecord, encode_part_key
from store.downsample import DEFAULT_RESOLUTIONS_MS
from store.encoding_fast import encode_chunks

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z: a day boundary, so a day's slice starts there
GAUGE, COUNTER = "month_gauge", "month_requests_total"
CHUNK_SPAN_MS = HOUR  # the defaults of [ingest]: chunk_span_ms, max_chunk_samples
MAX_CHUNK_SAMPLES = 120
WRITE_BATCH = 20_000  # chunks per write_chunks call


@dataclass(frozen=True)
class MonthSpec:
    """What to generate: `series` series of `days` days of scrapes every `scrape_ms`, stored,
    then one more hour held in memory (a shard's newest samples, not flushed yet)."""

    series: int = 10_000
    days: int = 30
    scrape_ms: int = 60_000
    seed: int = 1
    start_ms: int = T0
    resolutions_ms: tuple[int, ...] = DEFAULT_RESOLUTIONS_MS

    @property
    def end_ms(self) -> int:
        """The end of the stored days (a day boundary: the last slice of 1 h periods)."""
        return self.start_ms + self.days * DAY

    @property
    def samples_per_series(self) -> int:
        return (self.days * DAY + HOUR) // self.scrape_ms


def labels_of(i: int) -> dict[str, str]:
    """Series i: a gauge if i is even, a counter if odd (the dataset's metric column)."""
    return {
        "_metric_": GAUGE if i % 2 == 0 else COUNTER,
        "_ws_": "month",
        "_ns_": f"ns{i % 8}",
        "instance": f"host-{i // 2:05d}",
    }


def block_samples(spec: MonthSpec, first: int, count: int) -> tuple[I64, F64]:
    """Series first..first + count - 1: (count, samples) arrays of times and values. Each
    series scrapes at its own phase with a few ms of jitter; the same series always gets the
    same samples (seeded by its number)."""
    n = spec.samples_per_series
    ts = np.empty((count, n), np.int64)
    vals = np.empty((count, n), np.float64)
    grid = np.arange(n, dtype=np.int64) * spec.scrape_ms
    for row, i in enumerate(range(first, first + count)):
        rng = np.random.default_rng((spec.seed, i))
        phase = int(rng.integers(100, spec.scrape_ms - 100))
        ts[row] = spec.start_ms + phase + grid + rng.integers(-20, 21, n)
        if i % 2 == 0:  # a gauge: a random walk with 3 decimals, as a temperature or a load
            walk = 50.0 + np.cumsum(rng.normal(0.0, 0.5, n))
            vals[row] = np.round(walk, 3)
        else:  # a counter: integer increments, reset to 0 about every 3 days
            inc = rng.poisson(float(rng.integers(1, 50)), n).astype(np.float64)
            total = float(rng.integers(0, 10_000)) + np.cumsum(inc)
            reset = rng.random(n) < spec.scrape_ms / (3 * DAY)
            reset[0] = False
            # after a reset the counter holds only the increments since: subtract the total
            # just before the latest reset (non-decreasing, so a running maximum finds it)
            before = np.maximum.accumulate(np.where(reset, total - inc, 0.0))
            vals[row] = total - before
    return ts, vals


@dataclass
class Month:
    """What `generate` wrote: the dataset (one shard), its memstore as the shard's owner holds
    it after recovery (every stored part key, the newest hour in memory, the marks), and counts."""

    spec: MonthSpec
    dataset: Dataset
    memstore: ShardMemstore
    chunks: int = 0
    stored_samples: int = 0
    memory_samples: int = 0
    rounds: list[DownsampleRound] = field(default_factory=list)
    write_s: float = 0.0  # generating and writing the raw chunks and part keys
    downsample_s: float = 0.0  # the downsampler's rounds over them


def dataset_for(name: str) -> Dataset:
    return Dataset(name=name, num_shards=1, min_num_nodes=1, spread=SpreadSettings(default=0))


def _blocks(spec: MonthSpec) -> Iterator[tuple[int, int]]:
    per_block = max(1, 4_000_000 // spec.samples_per_series)  # about 64 MB of samples a block
    for first in range(0, spec.series, per_block):
        yield first, min(per_block, spec.series - first)


def write_raw(
    spec: MonthSpec, column: ColumnStore, dataset: Dataset, memory: list[tuple[I64, F64]]
) -> tuple[int, int]:
    """The stored days of every series as raw chunks (cut as `ingest.seal` cuts them) and
    their part keys; the hour after them is appended to `memory`, one (ts, vals) per series.
    Returns (chunks, samples) written."""
    ref, chunks, samples = dataset.ref, 0, 0
    for first, count in _blocks(spec):
        ts, vals = block_samples(spec, first, count)
        keys = [encode_part_key(labels_of(i)) for i in range(first, first + count)]
        flat_ts, flat_vals, bounds, owners, part_keys = [], [], [0], [], []
        base = 0
        for row in range(count):
            stored = int(np.searchsorted(ts[row], spec.end_ms, side="right"))
            memory.append((ts[row, stored:].copy(), vals[row, stored:].copy()))
            t, v = ts[row, :stored], vals[row, :stored]
            cuts = chunk_cuts(t, CHUNK_SPAN_MS, MAX_CHUNK_SAMPLES)
            flat_ts.append(t)
            flat_vals.append(v)
            bounds.extend((base + cuts[1:]).tolist())
            owners.extend([row] * (len(cuts) - 1))
            part_keys.append(PartKeyRecord(keys[row], int(t[0]), int(t[-1])))
            base += stored
        all_ts, all_vals = np.concatenate(flat_ts), np.concatenate(flat_vals)
        b = np.asarray(bounds, np.int64)
        blobs = encode_chunks(all_ts, all_vals, b)
        starts, ends = all_ts[b[:-1]].tolist(), all_ts[b[1:] - 1].tolist()
        sizes = np.diff(b).tolist()
        records = [
            ChunkRecord(keys[o], s, e, n, d)
            for o, s, e, n, d in zip(owners, starts, ends, sizes, blobs, strict=True)
        ]
        for i in range(0, len(records), WRITE_BATCH):
            column.write_chunks(ref, 0, records[i : i + WRITE_BATCH])
        column.write_part_keys(ref, 0, part_keys)
        chunks += len(records)
        samples += base
    return chunks, samples


def memory_batch(memory: Sequence[tuple[I64, F64]]) -> SampleBatch:
    """The newest hour of every series as one batch, in time order (as scrapes arrive)."""
    sizes = np.fromiter((len(t) for t, _ in memory), np.int64, len(memory))
    idx = np.repeat(np.arange(len(memory), dtype=np.int32), sizes)
    ts = np.concatenate([t for t, _ in memory])
    vals = np.concatenate([v for _, v in memory])
    order = np.argsort(ts, kind="stable")
    series = [labels_of(i) for i in range(len(memory))]
    return SampleBatch(series, idx[order], ts[order], vals[order])


def recovered_memstore(dataset: Dataset, column: ColumnStore, meta: MetaStore) -> ShardMemstore:
    """Shard 0's memstore as its owner has it after recovery: every stored series indexed (the
    part keys), samples in the ColumnStore, the downsample marks read (queries read periods
    up to them)."""
    mem = ShardMemstore(
        dataset, 0, max_chunk_samples=MAX_CHUNK_SAMPLES, chunk_span_ms=CHUNK_SPAN_MS
    )
    mem.load_part_keys(column.list_part_keys(dataset.ref, 0))
    for res, mark in meta.read_downsample_marks(dataset.ref, 0).items():
        mem.set_downsampled(res, mark)
    return mem


def generate(spec: MonthSpec, meta: MetaStore, column: ColumnStore, name: str = "month") -> Month:
    """Write `spec`'s month into the stores and downsample it with the shard's own
    downsampler (every resolution of `spec`, up to the end of the stored days)."""
    dataset = dataset_for(name)
    meta.create_dataset(dataset)
    memory: list[tuple[I64, F64]] = []
    began = time.perf_counter()
    chunks, stored = write_raw(spec, column, dataset, memory)
    written = time.perf_counter()
    mem = ShardMemstore(
        dataset, 0, max_chunk_samples=MAX_CHUNK_SAMPLES, chunk_span_ms=CHUNK_SPAN_MS
    )
    mem.load_part_keys(column.list_part_keys(dataset.ref, 0))
    batch = memory_batch(memory)
    mem.ingest(batch, 0)
    epoch = meta.claim_epoch(dataset.ref, 0, "month_data")
    now_ms = spec.end_ms + HOUR
    down = Downsampler(
        mem, column, meta, dataset.ref, 0, epoch, spec.resolutions_ms, delay_ms=0,
        interval_s=0.0, clock=lambda: now_ms / 1000,
    )  # fmt: skip
    rounds = down.run(now_ms)
    took = time.perf_counter() - written
    return Month(spec, dataset, mem, chunks, stored, len(batch), rounds, written - began, took)


class RawOnly:
    """A node's shards without their downsampled periods (no `select_periods`): how a node
    without downsampling answers, over the same store and memory."""

    def __init__(self, source: Any) -> None:
        self.select = source.select
        self.select_batch = source.select_batch
        self.series = source.series
        self.stats = source.stats
        self.limit_to_retention = source.limit_to_retention
