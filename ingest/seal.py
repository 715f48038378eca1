"""Sealing a shard's open buffers into chunks, and the chunks' life in memory until evicted.

A flush group's open buffers are sealed into encoded chunks (`Sealer.seal`) for the flusher to
write; they stay in memory, unflushed and never evicted, until the flusher has written them
(`Sealer.flushed`); then they are evictable, oldest end time first (`Sealer.evict`), when the
in-memory window or the memory bound no longer allows them.

Chunks are cut at time-bucket boundaries (`ts // chunk_span_ms`) and every `max_chunk_samples`
samples from the open buffer's (or bucket's) first sample, so cuts depend only on the samples
and where the buffer starts, never on timing: a replay after a crash cuts the same chunks
(ingest/flush.py). A flush seals only *complete* chunks: full ones, and the last one once its
bucket is over in the shard's data time (or everything, on a clean stop or under memory
pressure); the rest of each buffer stays open and goes into the group's open-buffer snapshot
(`ingest.open_buffers`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ingest.mem_series import I64, INITIAL_CAPACITY, NO_TS, NO_VALS, MemChunk, Series
from ingest.open_buffers import OpenBuffers
from store.api import ChunkRecord, PartKeyRecord
from store.encoding_fast import encode_chunks

EVICT_TO = 0.9  # over the bound, evict down to this fraction of it so eviction is not per ingest


@dataclass(slots=True)
class SealedGroup:
    """A flush group's open buffers, sealed: what one flush writes, then checkpoints.

    `offset` is the group's watermark at seal time: every sample of the group from messages at
    or below it is in `chunks`, in `open` (the buffers left open, a copy) or was in earlier
    flushes' chunks. -1 if nothing was ever ingested."""

    group: int
    offset: int
    open: OpenBuffers
    chunks: list[ChunkRecord] = field(default_factory=list)
    part_keys: list[PartKeyRecord] = field(default_factory=list)
    samples: int = 0
    open_blob: bytes | None = None  # `open`, encoded once by the flusher (kept for retries)
    _mem: list[MemChunk] = field(default_factory=list, repr=False)


class Sealer:
    """Seals a shard's open buffers and accounts for its sealed chunks: unflushed, then flushed
    and evictable, then evicted.

    Works in place on the memstore's series (the same list and `Series` objects, never copied)
    and only under the memstore's lock. It counts the sealed chunks' samples and what the
    groups' snapshots hold; the memstore counts the open samples."""

    def __init__(
        self,
        series: list[Series],
        group_series: list[list[int]],
        *,
        max_chunk_samples: int,
        chunk_span_ms: int,
        max_samples: int,
    ) -> None:
        self._series = series
        self._group_series = group_series
        self.max_chunk_samples = max_chunk_samples
        self.chunk_span_ms = chunk_span_ms
        self.max_samples = max_samples
        self.sealed_unflushed = 0
        self.flushed_in_memory = 0
        # per group: open samples its last flush's snapshot holds (durable, though still open)
        self.snapshotted = [0] * len(group_series)
        self._evictable: list[tuple[int, int, MemChunk]] = []  # heap (end_time, seq, chunk)
        self._seq = itertools.count()

    def seal(
        self,
        group: int,
        offset: int,
        part_key: Callable[[int], str],
        first_ts: npt.NDArray[np.int64],
        newest_ts: int,
        *,
        complete_only: bool,
    ) -> SealedGroup:
        """Seal the group's open samples into chunks (see `ShardMemstore.seal_group`).

        `offset` is the group's watermark, `first_ts` the first sample time of every series (for
        the part keys), `newest_ts` the shard's newest sample time (whose bucket decides which
        chunks are over)."""
        span, most = self.chunk_span_ms, self.max_chunk_samples
        series = self._series
        sids = [sid for sid in self._group_series[group] if series[sid].n]
        sizes = np.fromiter((series[sid].n for sid in sids), I64, len(sids))
        offsets = np.zeros(len(sids) + 1, I64)
        np.cumsum(sizes, out=offsets[1:])
        total = int(offsets[-1])
        if not total:
            empty = OpenBuffers([], np.empty(0, I64), np.zeros(1, I64), NO_TS, NO_VALS)
            return SealedGroup(group, offset, empty)
        all_ts = np.concatenate([series[sid].ts[: series[sid].n] for sid in sids])
        all_vals = np.concatenate([series[sid].vals[: series[sid].n] for sid in sids])
        # Chunk cuts of every buffer at once (as `chunk_cuts` per buffer): a buffer's first
        # sample, a new time bucket, and every `most` samples within a bucket's run.
        idx = np.arange(total, dtype=I64)
        bucket = all_ts // span
        run_start = np.zeros(total, bool)
        run_start[offsets[:-1]] = True
        run_start[1:] |= bucket[1:] != bucket[:-1]
        run_first = np.maximum.accumulate(np.where(run_start, idx, 0))
        chunk_start = run_start | ((idx - run_first) % most == 0)
        # Per buffer: its last chunk's start; the chunk is complete when full or its bucket
        # is over (the shard's newest sample is in a later bucket); `keep` samples stay open.
        last_start = np.maximum.reduceat(np.where(chunk_start, idx, -1), offsets[:-1])
        ends = offsets[1:]
        complete = (ends - last_start >= most) | (bucket[ends - 1] < newest_ts // span)
        if not complete_only:
            complete[:] = True
        sealed_to = np.where(complete, ends, last_start)  # absolute end of the sealed part
        keep = ends - sealed_to
        in_sealed = idx < np.repeat(sealed_to, sizes)
        seal_ts, seal_vals = all_ts[in_sealed], all_vals[in_sealed]
        bounds = np.append(np.flatnonzero(chunk_start[in_sealed]), len(seal_ts))
        datas = encode_chunks(seal_ts, seal_vals, bounds) if len(seal_ts) else []
        c_first = seal_ts[bounds[:-1]].tolist()
        c_last = seal_ts[bounds[1:] - 1].tolist()
        c_n = np.diff(bounds).tolist()
        per_series = np.add.reduceat(chunk_start & in_sealed, offsets[:-1]).tolist()
        # Python per sealed chunk (its record) and per buffer (its open rest moved to front).
        chunks: list[ChunkRecord] = []
        mems: list[MemChunk] = []
        part_keys: list[PartKeyRecord] = []
        k = 0
        open_sids: list[int] = []
        for sid, n, left, count in zip(
            sids, sizes.tolist(), keep.tolist(), per_series, strict=True
        ):
            ser = series[sid]
            if count:
                key = part_key(sid)
                if not ser.chunks:
                    ser.chunks = []
                for j in range(k, k + count):
                    rec = ChunkRecord(key, c_first[j], c_last[j], c_n[j], datas[j])
                    mem = MemChunk(sid, rec)
                    ser.chunks.append(mem)  # type: ignore[union-attr]
                    chunks.append(rec)
                    mems.append(mem)
                k += count
                part_keys.append(PartKeyRecord(key, int(first_ts[sid]), c_last[k - 1]))
            if not left:
                ser.n = 0
                ser.hint = max(INITIAL_CAPACITY, n)
                ser.ts, ser.vals = NO_TS, NO_VALS
                continue
            if left < n:  # keep the open rest at the buffer's front
                ser.ts[:left] = ser.ts[n - left : n]
                ser.vals[:left] = ser.vals[n - left : n]
                ser.n = left
            open_sids.append(sid)
        open_n = keep[keep > 0]
        open_bounds = np.zeros(len(open_n) + 1, I64)
        np.cumsum(open_n, out=open_bounds[1:])
        snapshot = OpenBuffers(
            [part_key(sid) for sid in open_sids],
            first_ts[np.asarray(open_sids, I64)],
            open_bounds,
            all_ts[~in_sealed],
            all_vals[~in_sealed],
        )
        sealed_samples = len(seal_ts)
        sealed = SealedGroup(group, offset, snapshot, chunks, part_keys, sealed_samples)
        sealed._mem = mems
        self.sealed_unflushed += sealed_samples
        return sealed

    def flushed(self, sealed: SealedGroup) -> None:
        """The sealed chunks are in the ColumnStore: make them evictable."""
        # the group's open rest is in the snapshot now (or, if its checkpoint did not advance,
        # still in the previous one: no message came since)
        self.snapshotted[sealed.group] = sealed.open.samples
        for mem in sealed._mem:
            if not mem.flushed:
                mem.flushed = True
                heapq.heappush(self._evictable, (mem.record.end_time, next(self._seq), mem))
                self.sealed_unflushed -= mem.record.num_samples
                self.flushed_in_memory += mem.record.num_samples

    def drop(self, sids: set[int]) -> None:
        """Forget deleted series' chunks in memory, flushed or not, and their counts."""
        for sid in sids:
            for mem in self._series[sid].chunks:
                if mem.flushed:
                    self.flushed_in_memory -= mem.record.num_samples
                else:
                    self.sealed_unflushed -= mem.record.num_samples
        self._evictable = [e for e in self._evictable if e[2].sid not in sids]
        heapq.heapify(self._evictable)

    def evict(self, older_than: int | None, open_samples: int) -> int:
        """Pop flushed chunks oldest-end-first: those ending before `older_than`, then more while
        the memory (`open_samples` plus the sealed chunks) is over the bound; returns samples
        evicted. A series' chunks end in increasing time, so each series keeps a suffix of its
        samples in memory, which is what `memory_start` promises."""
        heap = self._evictable
        target = int(self.max_samples * EVICT_TO)
        held = open_samples + self.sealed_unflushed
        over = held + self.flushed_in_memory > self.max_samples
        freed = 0
        while heap:
            end_time, _, mem = heap[0]
            if older_than is not None and end_time < older_than:
                pass
            elif not (over and held + self.flushed_in_memory > target):
                break
            heapq.heappop(heap)
            ser = self._series[mem.sid]
            chunks = ser.chunks
            assert chunks[0] is mem, "flushed chunks are evicted oldest first"
            del chunks[0]  # type: ignore[union-attr]
            if not chunks:
                ser.chunks = ()
            self.flushed_in_memory -= mem.record.num_samples
            freed += mem.record.num_samples
        return freed


def chunk_cuts(ts: npt.NDArray[np.int64], span_ms: int, max_samples: int) -> npt.NDArray[np.intp]:
    """Chunk boundaries of one sealed segment: indices [0, ..., len(ts)].

    A chunk never crosses a time bucket (`ts // span_ms`), so it spans less than `span_ms`; a
    bucket's run of samples is cut every `max_samples` counted from the run's first sample. Both
    depend only on the samples and where the segment starts, never on timing."""
    n = len(ts)
    bucket = ts // span_ms
    starts = np.flatnonzero(bucket[1:] != bucket[:-1]) + 1
    starts = np.concatenate(([0], starts))
    lengths = np.diff(np.append(starts, n))
    if (lengths > max_samples).any():
        extra = [
            s + np.arange(max_samples, ln, max_samples)
            for s, ln in zip(starts.tolist(), lengths.tolist(), strict=True)
            if ln > max_samples
        ]
        starts = np.sort(np.concatenate([starts, *extra]))
    return np.append(starts, n)
