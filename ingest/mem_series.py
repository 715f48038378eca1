"""A series' samples in memory: its open append buffer and its sealed chunks.

The one data structure the memstore's write side (`ingest.memstore`), sealing and eviction
(`ingest.seal`) and reads (`ingest.shard_reader`) share: each works on the same objects in place,
under the memstore's lock, so nothing is copied between them.
"""

from __future__ import annotations

import numpy as np

from store.api import INT64_MIN, ChunkRecord

I64 = np.int64
F64 = np.float64
NONE_TS = INT64_MIN  # "no sample yet" in the per-series time arrays
INITIAL_CAPACITY = 8
NO_TS = np.empty(0, I64)  # the buffers of a series without open samples: shared, never written
NO_VALS = np.empty(0, F64)


class MemChunk:
    """A sealed chunk held in memory; `flushed` once it is in the ColumnStore (then evictable)."""

    __slots__ = ("flushed", "record", "sid")

    def __init__(self, sid: int, record: ChunkRecord) -> None:
        self.sid = sid
        self.record = record
        self.flushed = False


class Series:
    """A series' open buffer (`ts[:n]`, `vals[:n]`) and its sealed chunks in memory, oldest
    first (its labels and part key are in the `SeriesIndex`). Buffers are released at each seal
    and re-allocated at the next sample with the last segment's size (`hint`), so idle series
    cost no buffer and busy ones about one allocation per flush."""

    __slots__ = ("chunks", "group", "hint", "n", "ts", "vals")

    def __init__(self, group: int) -> None:
        self.group = group
        self.ts = NO_TS
        self.vals = NO_VALS
        self.n = 0
        self.hint = INITIAL_CAPACITY
        # few per series: a list (smaller than a deque), () while none (no list per idle series)
        self.chunks: list[MemChunk] | tuple[()] = ()

    def grow(self, need: int) -> None:
        cap = max(need, 2 * len(self.ts), self.hint)
        ts = np.empty(cap, I64)
        vals = np.empty(cap, F64)
        ts[: self.n] = self.ts[: self.n]
        vals[: self.n] = self.vals[: self.n]
        self.ts, self.vals = ts, vals

    def memory_start(self) -> int | None:
        """Time of the oldest sample in memory (None if none)."""
        if self.chunks:
            return self.chunks[0].record.start_time
        return int(self.ts[0]) if self.n else None
