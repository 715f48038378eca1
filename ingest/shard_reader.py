"""Reading a shard: a series' samples in [start, end], from the ColumnStore before its oldest
in-memory sample and from the memstore from there on.

What queries (`query.executor`) and exactness checks read through, so that reading stored data
does not depend on the flusher: the memstore answers for memory (`ShardMemstore.snapshot_many`,
which also says where memory starts, atomically), the ColumnStore for the rest, with one
ColumnStore read per shard for all the series that need one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from core.dataset import DatasetRef
from ingest.memstore import NONE_TS, ShardMemstore
from store.api import INT64_MAX, INT64_MIN, ColumnStore


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
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """The samples in [start, end] of many series of one shard, stored and in memory, as one
    columnar batch: series i's at `[bounds[i]:bounds[i + 1]]`. One ColumnStore read for all
    of them, and none of the per-series work when memory holds the whole window (the common
    case of a dashboard's recent windows)."""
    mem_starts, mem_ts, mem_vals, bounds = memstore.snapshot_many(series_ids, start, end)
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
    ts_parts: list[npt.NDArray[np.int64]] = []
    val_parts: list[npt.NDArray[np.float64]] = []
    sizes = np.diff(bounds)
    for i, sid in enumerate(series_ids):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        key = memstore.part_key(sid)
        for chunk in chunks.get(key, ()) if key in need else ():
            ts, vals = chunk.samples()
            inside = (ts >= start) & (ts <= need[key])
            ts_parts.append(ts[inside])
            val_parts.append(vals[inside])
            sizes[i] += len(ts_parts[-1])
        ts_parts.append(mem_ts[lo:hi])
        val_parts.append(mem_vals[lo:hi])
    out_bounds = np.zeros(len(series_ids) + 1, np.int64)
    np.cumsum(sizes, out=out_bounds[1:])
    return np.concatenate(ts_parts), np.concatenate(val_parts), out_bounds
