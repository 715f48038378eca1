"""Reading a shard: a series' samples in [start, end], from the ColumnStore before its oldest
in-memory sample and from the memstore from there on.

Two steps. `read_memory` and `read_memory_many` take a window of the memstore's series (the
memstore's `snapshot` and `snapshot_many` call them with its lock): only the chunks that meet
the window, and the open buffers cut to it, together with where memory starts, atomically, so
eviction cannot open a gap; chunks are decoded after the lock is released. `read_merged_batch`
adds the ColumnStore's samples before each series' memory start, with one ColumnStore read per
shard for all the series that need one. Queries (`query.executor`) and exactness checks read
stored data through here, so reading does not depend on the flusher.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from core.dataset import DatasetRef
from ingest.mem_series import F64, I64, NO_TS, NO_VALS, NONE_TS, Series
from store.api import INT64_MAX, INT64_MIN, ChunkRecord, ColumnStore, decode_records

if TYPE_CHECKING:  # the memstore reads memory through this module's `read_memory*`
    from ingest.memstore import ShardMemstore


def read_memory(
    settled: AbstractContextManager[Sequence[Series]],
    series_id: int,
    start: int = INT64_MIN,
    end: int = INT64_MAX,
) -> tuple[int | None, npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """A series' in-memory samples in [start, end] (copies), with its memory start, taken
    atomically (`ShardMemstore.snapshot`). `settled` holds the memstore's lock and gives its
    series; what is decoded is decoded after it is released."""
    with settled as series:
        ser = series[series_id]
        mem_start = ser.memory_start()
        records = [
            c.record
            for c in ser.chunks
            if c.record.end_time >= start and c.record.start_time <= end
        ]
        n = ser.n
        open_ts = ser.ts[:n].copy()
        open_vals = ser.vals[:n].copy()
    parts = decode_records(records)  # decoded outside the lock, all at once
    parts.append((open_ts, open_vals))
    ts = np.concatenate([p[0] for p in parts])
    vals = np.concatenate([p[1] for p in parts])
    lo = int(np.searchsorted(ts, start, side="left"))
    hi = int(np.searchsorted(ts, end, side="right"))
    return mem_start, ts[lo:hi], vals[lo:hi]


def read_memory_many(
    settled: AbstractContextManager[Sequence[Series]],
    series_ids: Sequence[int],
    start: int = INT64_MIN,
    end: int = INT64_MAX,
    cache: bool = True,
) -> tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int64]
]:
    """`read_memory` of many series at once: their memory starts (`NONE_TS` for None), and
    their samples in [start, end] concatenated, series i's at `[bounds[i]:bounds[i + 1]]`.
    One lock for all, one concatenation. Only the chunks that meet the window are read, and
    each open buffer is cut to it (by its first and last times, searching only where the
    window ends inside it), so a 5-minute query of series holding hours costs minutes of
    copying (bench/bench_promql.py); the open buffers' pieces are copied by one
    concatenation under the lock, and the chunks are cut with one mask over all of them.
    The chunks are decoded together after the lock (`store.api.decode_records`; `cache=False`
    leaves the decoded-chunk cache alone, for reads of everything once such as downsampling)."""
    ts_parts: list[npt.NDArray[np.int64]] = []
    val_parts: list[npt.NDArray[np.float64]] = []
    mem_starts: list[int] = []
    records: list[tuple[int, ChunkRecord]] = []  # decoded outside the lock
    owners: list[int] = []  # per part, the series it belongs to
    opened: list[int] = []  # the parts that are open buffers' pieces (views, then copies)
    cut = False  # whether a chunk reaches out of the window (cut all at once, below)
    with settled as series:
        for i, sid in enumerate(series_ids):
            ser = series[sid]
            chunks = ser.chunks
            n = ser.n
            if chunks:
                mem_starts.append(chunks[0].record.start_time)
                # Oldest first, so the window's chunks are found from the newest back: a
                # recent window (a dashboard's) looks at one or two of a series' chunks.
                k = len(chunks)
                while k and chunks[k - 1].record.end_time >= start:
                    k -= 1
                for c in chunks[k:]:
                    r = c.record
                    if r.start_time <= end:
                        cut = cut or r.start_time < start or r.end_time > end
                        records.append((len(ts_parts), r))
                        ts_parts.append(NO_TS)
                        val_parts.append(NO_VALS)
                        owners.append(i)
            elif n:
                mem_starts.append(ser.ts.item(0))
            else:
                mem_starts.append(NONE_TS)
                continue
            if not n:
                continue
            ts = ser.ts
            first, last = ts.item(0), ts.item(n - 1)
            if last < start or first > end:
                continue
            a = 0 if first >= start else int(ts[:n].searchsorted(start))
            b = n if last <= end else int(ts[:n].searchsorted(end, side="right"))
            if b > a:  # views here, copied below (the buffer changes after the lock)
                opened.append(len(ts_parts))
                ts_parts.append(ts[a:b])
                val_parts.append(ser.vals[a:b])
                owners.append(i)
        if opened and len(opened) == len(ts_parts):  # only open buffers: one copy, done
            ts_all, vals_all = np.concatenate(ts_parts), np.concatenate(val_parts)
            records = []
        elif opened:
            open_ts = np.concatenate([ts_parts[k] for k in opened])
            open_vals = np.concatenate([val_parts[k] for k in opened])
    bounds = np.zeros(len(series_ids) + 1, I64)
    starts = np.array(mem_starts, I64)
    if not ts_parts:
        return starts, np.empty(0, I64), np.empty(0, F64), bounds
    if records or not opened:
        if opened:  # the copies' pieces in place of the views
            at = 0
            for k in opened:
                m = len(ts_parts[k])
                ts_parts[k], val_parts[k] = open_ts[at : at + m], open_vals[at : at + m]
                at += m
        decoded = decode_records([r for _, r in records], cache)
        for (pos, _), (t, v) in zip(records, decoded, strict=True):
            ts_parts[pos], val_parts[pos] = t, v
        ts_all, vals_all = np.concatenate(ts_parts), np.concatenate(val_parts)
    lengths = np.fromiter(map(len, ts_parts), I64, len(ts_parts))
    if cut:  # every part in series order and ascending: a mask keeps that
        owner = np.repeat(np.array(owners, I64), lengths)
        inside = (ts_all >= start) & (ts_all <= end)
        ts_all, vals_all, owner = ts_all[inside], vals_all[inside], owner[inside]
        np.cumsum(np.bincount(owner, minlength=len(series_ids)), out=bounds[1:])
    else:
        per_series = np.bincount(owners, weights=lengths, minlength=len(series_ids))
        np.cumsum(per_series.astype(I64), out=bounds[1:])
    return starts, ts_all, vals_all, bounds


def read_merged(
    memstore: ShardMemstore,
    column_store: ColumnStore,
    ref: DatasetRef,
    shard: int,
    series_id: int,
    start: int = INT64_MIN,
    end: int = INT64_MAX,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """A series' samples in [start, end]: the ColumnStore's before the memstore's first
    in-memory sample, the memstore's from there on. Concatenated as stored: nothing is
    de-duplicated, so overlapping chunks would show as repeated timestamps."""
    return read_merged_many(memstore, column_store, ref, shard, [series_id], start, end)[0]


def read_merged_many(
    memstore: ShardMemstore,
    column_store: ColumnStore,
    ref: DatasetRef,
    shard: int,
    series_ids: Sequence[int],
    start: int = INT64_MIN,
    end: int = INT64_MAX,
) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]]:
    """`read_merged` for many series of one shard, with one ColumnStore read for all of them."""
    ts, vals, bounds = read_merged_batch(memstore, column_store, ref, shard, series_ids, start, end)
    b = bounds.tolist()
    return [(ts[b[i] : b[i + 1]], vals[b[i] : b[i + 1]]) for i in range(len(series_ids))]


def read_merged_batch(
    memstore: ShardMemstore,
    column_store: ColumnStore,
    ref: DatasetRef,
    shard: int,
    series_ids: Sequence[int],
    start: int = INT64_MIN,
    end: int = INT64_MAX,
    cache: bool = True,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """The samples in [start, end] of many series of one shard, stored and in memory, as one
    columnar batch: series i's at `[bounds[i]:bounds[i + 1]]`. One ColumnStore read for all
    of them, and none of the per-series work when memory holds the whole window (the common
    case of a dashboard's recent windows). All chunks, in memory and stored, are decoded in
    two batches; `cache=False` as in `read_memory_many`."""
    mem_starts, mem_ts, mem_vals, bounds = memstore.snapshot_many(series_ids, start, end, cache)
    # Each series needs the ColumnStore only before its oldest in-memory sample (all of the
    # window if memory holds none of it): found for all series at once, as usually none does.
    last = np.where(mem_starts == NONE_TS, end, np.minimum(end, mem_starts - 1))
    wanted = np.flatnonzero(last >= start).tolist()
    if not wanted:
        return mem_ts, mem_vals, bounds
    need = {memstore.part_key(series_ids[i]): int(last[i]) for i in wanted}
    chunks = column_store.read_chunks(ref, shard, need, start, max(need.values()))
    if not any(chunks.values()):
        return mem_ts, mem_vals, bounds
    keys = [memstore.part_key(sid) for sid in series_ids]
    stored = [chunk for key in keys if key in need for chunk in chunks.get(key, ())]
    decoded = iter(decode_records(stored, cache))
    ts_parts: list[npt.NDArray[np.int64]] = []
    val_parts: list[npt.NDArray[np.float64]] = []
    sizes = np.diff(bounds)
    for i, key in enumerate(keys):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        for _ in chunks.get(key, ()) if key in need else ():
            ts, vals = next(decoded)
            inside = (ts >= start) & (ts <= need[key])
            ts_parts.append(ts[inside])
            val_parts.append(vals[inside])
            sizes[i] += len(ts_parts[-1])
        ts_parts.append(mem_ts[lo:hi])
        val_parts.append(mem_vals[lo:hi])
    out_bounds = np.zeros(len(series_ids) + 1, np.int64)
    np.cumsum(sizes, out=out_bounds[1:])
    return np.concatenate(ts_parts), np.concatenate(val_parts), out_bounds
