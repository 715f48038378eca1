"""The per-shard memstore: recent samples in memory for queries, sealed into chunks for flushing.

One `ShardMemstore` per shard the node ingests. It holds

* a series index (`ingest.series_index`): label sets and part keys by series id, and the
  inverted index that answers query filters;
* per series an open append buffer and a list of sealed chunks (`ingest.mem_series`), kept
  *encoded* and decoded on query: the in-memory window is mostly sealed data;
* per flush group the Kafka offset up to which its samples are in memory (the "watermark").

This module is the write side: ingest (series resolution, ordering, appends) and recovery
(part keys, checkpoints, open-buffer snapshots). The other two sides work on the same series in
place, under the same lock, behind the methods here that keep the memstore's API: sealing,
flushed chunks and eviction in `ingest.seal` (`seal_group`, `mark_flushed`, `evict`), reading
windows of memory in `ingest.shard_reader` (`snapshot`, `snapshot_many`), which also merges
them with the ColumnStore for queries.

Ordering policy: a series' samples must have strictly increasing timestamps (the chunk codec
rejects anything else). Within one message a series' samples are taken in timestamp order
(whatever order the producer listed them in; a repeated timestamp keeps its first sample). A
sample whose timestamp is not greater than every sample of its series from earlier messages (in
Kafka offset order) is dropped and counted as `out_of_order`, or as `skipped_flushed` when it is at
or before the series' end time found in the ColumnStore at recovery. The accepted samples of a
series are thus a deterministic function of the message stream, which recovery relies on
(docs/memstore.md).

A flush seals only *complete* chunks (`ingest.seal`); the rest of each buffer stays open and goes
into the group's open-buffer snapshot (`ingest.open_buffers`), which the checkpoint covers. So
stored chunks are large whatever the flush interval, and a recovery reloads the snapshot and
replays at most one interval. See flush.py for why a replay rewrites the same chunk ids.

Not thread-safe beyond one lock: ingest, seal, mark-flushed and queries serialise on it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from core.dataset import Dataset
from core.hashing import partition_key_hash, shard_for_series
from ingest.batch import KeyedBatch, Labels, SampleBatch
from ingest.mem_series import F64, I64, NONE_TS, Series
from ingest.open_buffers import OpenBuffers
from ingest.seal import SealedGroup, Sealer
from ingest.series_index import SeriesIndex
from ingest.shard_reader import read_memory, read_memory_many
from store.api import (
    INT64_MAX,
    INT64_MIN,
    LabelMatcher,
    PartKeyRecord,
    decode_part_key,
    encode_part_key,
)

DEFAULT_GROUPS_PER_SHARD = 16
DEFAULT_MAX_CHUNK_SAMPLES = 120  # as Prometheus' head chunks: open samples cost 16 B each
DEFAULT_CHUNK_SPAN_MS = 3_600_000  # time-bucket width; must not exceed the store's max chunk span
DEFAULT_RETENTION_MS = 2 * 3_600_000
DEFAULT_MAX_SAMPLES = 50_000_000
_PENDING_MAX = 1 << 19  # pending samples moved into series buffers at once (`_settle`)
NO_LATE = INT64_MAX  # `_late_since` of a series with no late sample
_RESOLVED_MAX = 4  # key lists whose series ids `_resolve` remembers (they are kept alive)


def flush_group_of(
    labels: Mapping[str, str],
    dataset: Dataset,
    groups_per_shard: int,
    partition_hash: int | None = None,
) -> int:
    """A series' flush group: |partition key hash| mod groups, as FiloDB (Java `abs(h % n)`).

    `labels` must be canonical (no empty values), so that `{a="", b="x"}` and `{b="x"}`, which
    are one series, land in one group."""
    if partition_hash is None:
        partition_hash = partition_key_hash(labels, dataset)
    return abs(partition_hash) % groups_per_shard


@dataclass(slots=True)
class IngestStats:
    """What one `ingest` call did with a message's samples."""

    offset: int
    ingested: int = 0
    out_of_order: int = 0  # ts <= an earlier sample of the series
    skipped_replay: int = 0  # the group's checkpoint (or watermark) is at or past the offset
    skipped_flushed: int = 0  # ts <= the series' end time in the ColumnStore at recovery
    invalid_series: int = 0  # samples of series whose labels are not str -> str
    new_series: int = 0
    misrouted: int = 0  # ingested samples of series whose shard key hashes to another shard
    first_misrouted: int = -1  # a series id among them, for the log


@dataclass(slots=True)
class MemstoreStats:
    """Cumulative counters, for metrics."""

    ingested: int = 0
    out_of_order: int = 0
    skipped_replay: int = 0
    skipped_flushed: int = 0
    invalid_series: int = 0
    evicted_samples: int = 0
    messages: int = 0
    misrouted: int = 0  # kept, but queries routed by shard key will not look here for them
    deleted_series: int = 0  # by delete_series


class _Settled:
    """The memstore's series, for one read: entered, it holds the memstore's lock and has moved
    the pending samples into their buffers; the reader leaves it before decoding. One per read
    (the memstore keeps none, so it is in no reference cycle and is freed when dropped)."""

    __slots__ = ("_mem",)

    def __init__(self, mem: ShardMemstore) -> None:
        self._mem = mem

    def __enter__(self) -> list[Series]:
        mem = self._mem
        mem._lock.acquire()
        try:
            mem._settle()
        except BaseException:
            mem._lock.release()
            raise
        return mem._series

    def __exit__(self, *exc: object) -> None:
        self._mem._lock.release()


class ShardMemstore:
    """Samples of one shard in memory. See the module docstring and docs/memstore.md."""

    def __init__(
        self,
        dataset: Dataset,
        shard: int,
        *,
        groups_per_shard: int = DEFAULT_GROUPS_PER_SHARD,
        max_chunk_samples: int = DEFAULT_MAX_CHUNK_SAMPLES,
        chunk_span_ms: int = DEFAULT_CHUNK_SPAN_MS,
        retention_ms: int = DEFAULT_RETENTION_MS,
        max_samples: int = DEFAULT_MAX_SAMPLES,
    ) -> None:
        if groups_per_shard < 1:
            raise ValueError(f"groups_per_shard must be >= 1, got {groups_per_shard}")
        if max_chunk_samples < 1:
            raise ValueError(f"max_chunk_samples must be >= 1, got {max_chunk_samples}")
        if chunk_span_ms < 1:
            raise ValueError(f"chunk_span_ms must be >= 1, got {chunk_span_ms}")
        if retention_ms < 0 or max_samples < 1:
            raise ValueError("retention_ms must be >= 0 and max_samples >= 1")
        self.dataset = dataset
        self.shard = shard
        self.groups_per_shard = groups_per_shard
        self.max_chunk_samples = max_chunk_samples
        self.chunk_span_ms = chunk_span_ms
        self.retention_ms = retention_ms
        self.max_samples = max_samples
        self.stats = MemstoreStats()
        self._lock = threading.RLock()
        self._index = SeriesIndex()  # series ids, labels, part keys, matcher lookup
        self._by_key: dict[Hashable, int] = {}  # `KeyedBatch` key -> series id
        # A decoder's `keys` list (kept alive here, so its id is not reused) -> the series ids
        # of its keys: a binary decoder hands the same list for every message repeating a
        # series table (`SeriesTables`). Series ids never change, so the ids stay right.
        self._resolved: dict[int, tuple[list[Hashable], npt.NDArray[np.int64]]] = {}
        self._series: list[Series] = []  # per series id
        self._group_series: list[list[int]] = [[] for _ in range(groups_per_shard)]
        # per series, NumPy so ingest updates them vectorised
        self._first_ts = np.empty(0, I64)
        self._last_ts = np.empty(0, I64)
        self._store_end = np.empty(0, I64)  # end time in the ColumnStore at recovery
        self._group = np.empty(0, np.int32)
        # per series: its shard key hashes to another shard (a producer that did not route by
        # FiloPy's hash): its samples are kept, and counted as misrouted
        self._misrouted = np.empty(0, np.bool_)
        # per group: samples of messages at or below this offset are in memory (or flushed)
        self._watermark = np.full(groups_per_shard, -1, I64)
        self._replay_until: int | None = None  # recovering while set
        self._max_ts = NONE_TS
        self._open = 0  # samples in open buffers (the sealer counts those in chunks)
        # Accepted samples not yet in their series' buffers (`_settle`): a message with one
        # sample per series (remote write, line protocol) is appended here as three columns,
        # and moved into the buffers many messages at a time, so the per-series Python work is
        # shared by many samples instead of paid by each.
        self._pending = 0
        self._pending_sid = np.empty(0, I64)
        self._pending_ts = np.empty(0, I64)
        self._pending_vals = np.empty(0, F64)
        self._sealer = Sealer(
            self._series,
            self._group_series,
            max_chunk_samples=max_chunk_samples,
            chunk_span_ms=chunk_span_ms,
            max_samples=max_samples,
        )
        self.pressure = False  # over max_samples with nothing flushed left to evict
        # Per resolution, the end of the last period downsampled and stored (ingest.downsampler
        # sets it, `set_downsampled`, for the queries that read both). A sample accepted at or
        # before the latest of them is late for the summaries: its series' earliest late time
        # is kept (`_late_since`, NO_LATE: none) until the downsampler has redone its slices.
        self.downsampled_until: dict[int, int] = {}
        self._late_threshold = NONE_TS
        self._late_since = np.empty(0, I64)

    # ------------------------------------------------------------------------------ recovery

    def load_part_keys(self, records: Iterable[PartKeyRecord]) -> int:
        """Index the shard's stored series before replay; returns how many.

        Their stored time range matters: `start_time` stays the series' first sample (part keys
        are rewritten whole at each flush), and samples at or before `end_time` are known to be
        in the ColumnStore, so replaying them is skipped (see docs/memstore.md, recovery)."""
        with self._lock:
            count = 0
            for r in records:
                sid = self._index.id_of_part_key(r.part_key)
                if sid is None:
                    sid = self._index.add(decode_part_key(r.part_key), r.part_key)
                    self._add_series(sid)
                first = int(self._first_ts[sid])
                self._first_ts[sid] = r.start_time if first == NONE_TS else min(first, r.start_time)
                self._last_ts[sid] = max(int(self._last_ts[sid]), r.end_time)
                self._store_end[sid] = max(int(self._store_end[sid]), r.end_time)
                count += 1
            return count

    def set_checkpoints(self, checkpoints: Mapping[int, int], replay_until: int | None) -> None:
        """Apply the MetaStore's checkpoints before replay, and the replay's last offset.

        A message's samples of group g are skipped when its offset is at or below g's
        checkpoint. If the checkpoints are not exactly this memstore's groups (groups_per_shard
        changed, so series moved between groups), no group skips anything: replay then relies on
        the part keys' end times alone, which is also exact, only slower.

        `replay_until` is the partition's last offset when recovery started (end offset - 1):
        until a message at or past it is ingested, or `end_recovery()` is called, the memstore is
        `recovering` and the flusher holds flushes, so that the first flush after a crash covers
        everything the crashed node may have written (docs/memstore.md, idempotency)."""
        with self._lock:
            if set(checkpoints) == set(range(self.groups_per_shard)):
                for g, off in checkpoints.items():
                    self._watermark[g] = max(int(self._watermark[g]), int(off))
            self._replay_until = (
                None if replay_until is None or replay_until < 0 else int(replay_until)
            )

    def end_recovery(self) -> None:
        """The replay reached the end offset seen at recovery start: flushes may resume."""
        with self._lock:
            self._replay_until = None

    @property
    def recovering(self) -> bool:
        return self._replay_until is not None

    # -------------------------------------------------------------------------------- ingest

    def ingest(self, batch: SampleBatch, offset: int) -> IngestStats:
        """Add one Kafka message's samples (the message at `offset`).

        Vectorised per sample; Python loops only over the batch's series."""
        with self._lock:
            st = IngestStats(offset)
            sids = self._resolve(batch, st)
            if len(batch):
                self._ingest_samples(batch, sids, offset, st)
            np.maximum(self._watermark, offset, out=self._watermark)
            if self._replay_until is not None and offset >= self._replay_until:
                self._replay_until = None
            s = self.stats
            s.messages += 1
            s.ingested += st.ingested
            s.out_of_order += st.out_of_order
            s.skipped_replay += st.skipped_replay
            s.skipped_flushed += st.skipped_flushed
            s.invalid_series += st.invalid_series
            s.misrouted += st.misrouted
            if self.memory_samples() > self.max_samples:
                self._evict(None)
            return st

    def _ingest_samples(
        self, batch: SampleBatch, sids: npt.NDArray[np.int64], offset: int, st: IngestStats
    ) -> None:
        sid = sids[batch.series_idx]
        ts = batch.timestamps.astype(I64, copy=False)
        vals = batch.values.astype(F64, copy=False)
        keep = sid >= 0
        st.invalid_series = int(len(sid) - np.count_nonzero(keep))
        if not keep.any():
            return
        skip = self._watermark[self._group[np.where(keep, sid, 0)]] >= offset
        skip &= keep
        st.skipped_replay = int(np.count_nonzero(skip))
        keep &= ~skip
        if not keep.all():
            sid, ts, vals = sid[keep], ts[keep], vals[keep]
        if not len(sid):
            return
        order = np.argsort(sid, kind="stable")  # by series, batch order within a series
        sid, ts, vals = sid[order], ts[order], vals[order]
        new_seg = np.empty(len(sid), bool)
        new_seg[0] = True
        np.not_equal(sid[1:], sid[:-1], out=new_seg[1:])
        if len(ts) > 1 and not np.all(new_seg[1:] | (ts[1:] > ts[:-1])):
            # A series' samples out of time order within this message (e.g. a relay that
            # splits a request across workers): take them in time order; a repeated timestamp
            # keeps its first sample (lexsort is stable).
            order = np.lexsort((ts, sid))
            sid, ts, vals = sid[order], ts[order], vals[order]
            repeat = np.zeros(len(ts), bool)
            repeat[1:] = ~new_seg[1:] & (ts[1:] == ts[:-1])
            ok = (ts > self._last_ts[sid]) & ~repeat
        else:
            ok = ts > self._last_ts[sid]
        if not ok.all():
            dropped = ~ok
            flushed = int(np.count_nonzero(dropped & (ts <= self._store_end[sid])))
            st.skipped_flushed = flushed
            st.out_of_order = int(np.count_nonzero(dropped)) - flushed
            sid, ts, vals = sid[ok], ts[ok], vals[ok]
            if not len(sid):
                return
            new_seg = np.empty(len(sid), bool)
            new_seg[0] = True
            np.not_equal(sid[1:], sid[:-1], out=new_seg[1:])
        starts = np.flatnonzero(new_seg)
        ends = np.empty_like(starts)
        ends[:-1] = starts[1:]
        ends[-1] = len(sid)
        seg_sid = sid[starts]
        first = self._first_ts[seg_sid]
        self._first_ts[seg_sid] = np.where(first == NONE_TS, ts[starts], first)
        late = ts[starts] <= self._late_threshold  # a series' first accepted sample: its oldest
        if late.any():
            late_sid = seg_sid[late]
            self._late_since[late_sid] = np.minimum(self._late_since[late_sid], ts[starts][late])
        self._last_ts[seg_sid] = ts[ends - 1]
        if self._pending == 0 and len(sid) >= _PENDING_MAX:  # long runs per series: direct
            self._append_runs(seg_sid, starts, ends, ts, vals)
        else:
            self._append_pending(sid, ts, vals)
        st.ingested = len(sid)
        misrouted = self._misrouted[seg_sid]
        if misrouted.any():
            st.misrouted = int((ends - starts)[misrouted].sum())
            st.first_misrouted = int(seg_sid[np.argmax(misrouted)])
        self._open += len(sid)
        self._max_ts = max(self._max_ts, int(ts.max()))

    def _append_runs(
        self,
        seg_sid: npt.NDArray[np.int64],
        starts: npt.NDArray[np.int64],
        ends: npt.NDArray[np.int64],
        ts: npt.NDArray[np.int64],
        vals: npt.NDArray[np.float64],
    ) -> None:
        """Append each series' run `[starts[i], ends[i])` of `ts`/`vals` to its buffer."""
        series = self._series
        for s, a, b in zip(seg_sid.tolist(), starts.tolist(), ends.tolist(), strict=True):
            ser = series[s]
            n = ser.n
            m = n + b - a
            if m > len(ser.ts):
                ser.grow(m)
            ser.ts[n:m] = ts[a:b]
            ser.vals[n:m] = vals[a:b]
            ser.n = m

    def _append_pending(
        self, sid: npt.NDArray[np.int64], ts: npt.NDArray[np.int64], vals: npt.NDArray[np.float64]
    ) -> None:
        n, k = self._pending, len(sid)
        if n + k > len(self._pending_sid):
            cap = max(n + k, 2 * len(self._pending_sid), 4096)
            self._pending_sid = _grown(self._pending_sid, cap, 0)
            self._pending_ts = _grown(self._pending_ts, cap, 0)
            self._pending_vals = _grown(self._pending_vals, cap, 0.0)
        self._pending_sid[n : n + k] = sid
        self._pending_ts[n : n + k] = ts
        self._pending_vals[n : n + k] = vals
        self._pending = n + k
        if self._pending >= _PENDING_MAX:
            self._settle()

    def _settle(self) -> None:
        """Move the pending samples into their series' buffers (before anything reads them).
        A series' pending samples are in arrival order, which is time order (each was newer
        than the series' last sample when accepted), and the sort keeps that order."""
        n = self._pending
        if not n:
            return
        sid = self._pending_sid[:n]
        order = np.argsort(sid, kind="stable")
        sid = sid[order]
        ts, vals = self._pending_ts[:n][order], self._pending_vals[:n][order]
        new_seg = np.empty(n, bool)
        new_seg[0] = True
        np.not_equal(sid[1:], sid[:-1], out=new_seg[1:])
        starts = np.flatnonzero(new_seg)
        ends = np.append(starts[1:], n)
        self._append_runs(sid[starts], starts, ends, ts, vals)
        self._pending = 0

    def _resolve(self, batch: SampleBatch, st: IngestStats) -> npt.NDArray[np.int64]:
        """Series ids of a batch's label sets, creating new series; -1 for invalid labels.

        A `KeyedBatch`'s keys (equal keys, equal labels) find known series with one C-level
        dict lookup each instead of sorting and hashing their labels: a line-protocol or remote
        write message carries one sample per series, so this is the per-sample cost."""
        keys = batch.keys if isinstance(batch, KeyedBatch) else None
        if not keys or len(keys) != len(batch.series):
            return self._resolve_labels(batch.series, st)
        known = self._resolved.get(id(keys))
        if known is not None and known[0] is keys:
            return known[1]  # the decoder's series table again: the same series, same ids
        out = np.fromiter(map(self._by_key.get, keys, itertools.repeat(-2)), I64, len(keys))
        missing = np.flatnonzero(out == -2)
        if len(missing):
            found = self._resolve_labels([batch.series[i] for i in missing], st)
            out[missing] = found
            if len(self._by_key) + len(missing) > 2 * len(self._index) + 100_000:
                self._by_key.clear()  # keys of series the decoders forgot: start afresh
            for i, sid in zip(missing.tolist(), found.tolist(), strict=True):
                if sid >= 0:
                    self._by_key[keys[i]] = sid
        if len(self._resolved) >= _RESOLVED_MAX:
            self._resolved.pop(next(iter(self._resolved)))
        out.flags.writeable = False  # shared by every batch of these keys
        self._resolved[id(keys)] = (keys, out)
        return out

    def _resolve_labels(self, series: Sequence[Labels], st: IngestStats) -> npt.NDArray[np.int64]:
        known = len(self._index)
        out = self._index.resolve(series)
        for sid in range(known, len(self._index)):
            self._add_series(sid)
        st.new_series += len(self._index) - known
        return out

    def _add_series(self, sid: int) -> None:
        """Sample state for a series the index has just added (ids are dense, in order)."""
        assert sid == len(self._series)
        labels = self._index.labels(sid)
        ph = partition_key_hash(labels, self.dataset)  # for the group and the shard check
        group = flush_group_of(labels, self.dataset, self.groups_per_shard, ph)
        if sid >= len(self._group):
            cap = max(1024, 2 * len(self._group))
            self._first_ts = _grown(self._first_ts, cap, NONE_TS)
            self._last_ts = _grown(self._last_ts, cap, NONE_TS)
            self._store_end = _grown(self._store_end, cap, NONE_TS)
            self._group = _grown(self._group, cap, 0)
            self._misrouted = _grown(self._misrouted, cap, False)
            self._late_since = _grown(self._late_since, cap, NO_LATE)
        self._late_since[sid] = NO_LATE
        self._first_ts[sid] = self._last_ts[sid] = self._store_end[sid] = NONE_TS
        self._group[sid] = group
        self._misrouted[sid] = shard_for_series(self.dataset, labels, None, ph) != self.shard
        self._series.append(Series(group))
        self._group_series[group].append(sid)

    # ------------------------------------------------------------------------- series index

    def set_downsampled(self, resolution_ms: int, until: int) -> None:
        """The shard's periods of the resolution are stored up to `until` (the downsampler):
        queries may read them, and samples at or before it are late from now on."""
        with self._lock:
            self.downsampled_until[resolution_ms] = until
            self._late_threshold = max(self.downsampled_until.values())

    def summarising(self, until: int) -> None:
        """The downsampler is about to read samples up to `until`: any sample at or before it
        accepted from now on is late (it may miss the read), even before the mark moves."""
        with self._lock:
            self._late_threshold = max(self._late_threshold, until)

    def take_late(self) -> dict[int, int]:
        """The series with late samples (`set_downsampled`) and each one's earliest, forgotten
        here: the downsampler redoes their slices from there."""
        with self._lock:
            sids = np.flatnonzero(self._late_since[: len(self._series)] != NO_LATE)
            late = dict(zip(sids.tolist(), self._late_since[sids].tolist(), strict=True))
            self._late_since[sids] = NO_LATE
        return late

    def late_series(self) -> int:
        """How many series have late samples waiting for the downsampler."""
        return int(np.count_nonzero(self._late_since[: len(self._series)] != NO_LATE))

    def earliest_late(self) -> int | None:
        """The earliest late sample waiting for the downsampler; None if none."""
        with self._lock:
            n = len(self._series)
            earliest = int(self._late_since[:n].min()) if n else NO_LATE
        return None if earliest == NO_LATE else earliest

    def put_back_late(self, late: Mapping[int, int]) -> None:
        """Late series `take_late` gave out whose slices could not be redone."""
        if not late:
            return
        with self._lock:
            sids = np.fromiter(late.keys(), I64, len(late))
            since = np.fromiter(late.values(), I64, len(late))
            self._late_since[sids] = np.minimum(self._late_since[sids], since)

    @property
    def newest_sample_ms(self) -> int | None:
        """The latest sample time held: ingested, or stored (the part keys loaded at
        recovery); None before any."""
        with self._lock:
            last = self._last_ts[: len(self._series)]
            newest = max(int(last.max()) if len(last) else NONE_TS, int(self._max_ts))
        return None if newest == NONE_TS else newest

    @property
    def num_series(self) -> int:
        return len(self._series)

    def series_id(self, labels_or_part_key: Mapping[str, str] | str) -> int | None:
        key = (
            labels_or_part_key
            if isinstance(labels_or_part_key, str)
            else encode_part_key(labels_or_part_key)
        )
        return self._index.id_of_part_key(key)

    def part_key(self, series_id: int) -> str:
        return self._index.part_key(series_id)

    def labels(self, series_id: int) -> Labels:
        return self._index.labels(series_id)

    def labels_many(self, series_ids: Iterable[int]) -> list[Labels]:
        return self._index.labels_many(series_ids)

    def group_of(self, series_id: int) -> int:
        return self._series[series_id].group

    def group_series(self, group: int) -> list[int]:
        return list(self._group_series[group])

    def find_series(self, matchers: Sequence[LabelMatcher]) -> list[int]:
        """Ids of the series satisfying every matcher (Prometheus semantics), ascending
        (`SeriesIndex.find`)."""
        with self._lock:
            return self._index.find(matchers)

    def delete_series(self, selectors: Sequence[Sequence[LabelMatcher]]) -> list[str]:
        """Forget the series any selector matches (Prometheus' delete_series): their samples in
        memory, open or in chunks, and their lookups; returns their part keys. Their ids stay
        (ids index the per-series arrays) as empty series no lookup finds; samples with the same
        labels afterwards make a new series. The caller removes them from the store."""
        with self._lock:
            self._settle()
            sids = sorted({sid for m in selectors for sid in self._index.find(m)})
            if not sids:
                return []
            keys = [self._index.part_key(sid) for sid in sids]
            gone = set(sids)
            self._sealer.drop(gone)
            for sid in sids:
                ser = self._series[sid]
                self._open -= ser.n
                self._series[sid] = Series(ser.group)
                self._group_series[ser.group].remove(sid)
            self._index.remove(sids)
            self._by_key = {k: v for k, v in self._by_key.items() if v not in gone}
            self._resolved.clear()
            ids = np.asarray(sids, I64)
            self._first_ts[ids] = self._last_ts[ids] = self._store_end[ids] = NONE_TS
            self._late_since[ids] = NO_LATE
            self.stats.deleted_series += len(sids)
            return keys

    # ------------------------------------------------------------------------------- queries

    def samples(
        self, series_id: int, start: int = INT64_MIN, end: int = INT64_MAX
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """The series' in-memory samples in [start, end] (copies), sealed chunks and open buffer.

        Samples before `memory_start(series_id)` are only in the ColumnStore."""
        _, ts, vals = self.snapshot(series_id, start, end)
        return ts, vals

    def snapshot(
        self, series_id: int, start: int = INT64_MIN, end: int = INT64_MAX
    ) -> tuple[int | None, npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """`(memory_start, ts, values)` taken atomically, so a query can read the ColumnStore
        for exactly the times before `memory_start` even while chunks are being evicted."""
        return read_memory(_Settled(self), series_id, start, end)

    def snapshot_many(
        self,
        series_ids: Sequence[int],
        start: int = INT64_MIN,
        end: int = INT64_MAX,
        cache: bool = True,
    ) -> tuple[npt.NDArray[I64], npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[I64]]:
        """`snapshot` of many series at once: their memory starts (`NONE_TS` for None), and
        their samples in [start, end] concatenated, series i's at `[bounds[i]:bounds[i + 1]]`
        (`shard_reader.read_memory_many`; `cache=False` leaves the decoded-chunk cache alone)."""
        return read_memory_many(_Settled(self), series_ids, start, end, cache)

    def memory_start(self, series_id: int) -> int | None:
        """Time of the series' oldest in-memory sample (None if none): memory holds every
        accepted sample of the series from there on, the ColumnStore everything before."""
        with _Settled(self) as series:
            return series[series_id].memory_start()

    def in_range(self, series_ids: Sequence[int], start: int, end: int) -> list[int]:
        """Those of `series_ids` whose first..last sample span (stored or in memory) meets
        [start, end], in their order: `time_range` of many at once."""
        ids = np.asarray(series_ids, np.int64)
        with self._lock:
            first, last = self._first_ts[ids], self._last_ts[ids]
        return ids[(first != NONE_TS) & (first <= end) & (last >= start)].tolist()

    @property
    def oldest_sample_ms(self) -> int | None:
        """The first sample time of the shard's oldest series (stored or in memory)."""
        with self._lock:
            first = self._first_ts[: len(self._series)]
            held = first[first != NONE_TS]
        return int(held.min()) if len(held) else None

    def time_range(self, series_id: int) -> tuple[int, int] | None:
        """(first, last) sample time of the series, stored or in memory; None if none yet."""
        first = int(self._first_ts[series_id])
        return None if first == NONE_TS else (first, int(self._last_ts[series_id]))

    # ---------------------------------------------------------------------- sealing, flushing

    def watermark(self, group: int) -> int:
        """Offset up to which the group's samples are in memory or flushed (-1: none)."""
        return int(self._watermark[group])

    def seal_group(self, group: int, *, complete_only: bool = False) -> SealedGroup:
        """Seal the group's open samples into chunks for the flusher to write; with
        `complete_only`, only its complete chunks, copying what stays open for the group's
        snapshot.

        A chunk is complete when it holds `max_chunk_samples` or its time bucket is over: the
        shard's newest sample is in a later bucket. The chunks stay in memory (unflushed, not
        evictable) until `mark_flushed`."""
        with self._lock:
            self._settle()
            sealed = self._sealer.seal(
                group,
                int(self._watermark[group]),
                self._index.part_key,
                self._first_ts,
                self._max_ts,
                complete_only=complete_only,
            )
            self._open -= sealed.samples
            return sealed

    def load_open_buffers(self, snapshot: OpenBuffers) -> int:
        """Recovery, after `load_part_keys`: put a group snapshot's samples back into their
        series' open buffers; returns how many samples were loaded.

        Samples at or before a series' stored end time are dropped (a flush that wrote their
        chunks and part keys after this snapshot was taken, then crashed before its own
        checkpoint: they are in the ColumnStore). Replay then skips them too."""
        with self._lock:
            self._settle()
            loaded = 0
            b = snapshot.bounds.tolist()
            for i, key in enumerate(snapshot.part_keys):
                sid = self._index.id_of_part_key(key)
                if sid is None:
                    sid = self._index.add(decode_part_key(key), key)
                    self._add_series(sid)
                ts, vals = snapshot.ts[b[i] : b[i + 1]], snapshot.vals[b[i] : b[i + 1]]
                keep = ts > self._last_ts[sid]
                ts, vals = ts[keep], vals[keep]
                first = int(self._first_ts[sid])
                first_ts = int(snapshot.first_ts[i])
                self._first_ts[sid] = first_ts if first == NONE_TS else min(first, first_ts)
                if not len(ts):
                    continue
                ser = self._series[sid]
                n, m = ser.n, ser.n + len(ts)
                if m > len(ser.ts):
                    ser.grow(m)
                ser.ts[n:m] = ts
                ser.vals[n:m] = vals
                ser.n = m
                self._last_ts[sid] = self._store_end[sid] = int(ts[-1])
                self._max_ts = max(self._max_ts, int(ts[-1]))
                # open and durable together: `unflushed_samples` reads them without the lock
                self._open += len(ts)
                self._sealer.snapshotted[int(self._group[sid])] += len(ts)
                loaded += len(ts)
            return loaded

    def mark_flushed(self, sealed: SealedGroup) -> None:
        """The sealed chunks are in the ColumnStore: make them evictable, then evict what the
        in-memory window or the memory bound no longer allows."""
        with self._lock:
            self._sealer.flushed(sealed)
            self._evict(self._max_ts - self.retention_ms if self._max_ts != NONE_TS else None)

    def evict(self, now_ms: int | None = None) -> int:
        """Evict flushed chunks older than the window before `now_ms` (default: the newest sample
        time ingested) and, over the memory bound, the oldest flushed ones; returns samples
        evicted."""
        with self._lock:
            ref = self._max_ts if now_ms is None else now_ms
            return self._evict(ref - self.retention_ms if ref != NONE_TS else None)

    def _evict(self, older_than: int | None) -> int:
        """Evict flushed chunks ending before `older_than`, then more while over the bound."""
        freed = self._sealer.evict(older_than, self._open)
        self.stats.evicted_samples += freed
        self.pressure = self.memory_samples() > self.max_samples
        return freed

    # ------------------------------------------------------------------------------- memory

    def memory_samples(self) -> int:
        """Samples held in memory: open buffers, sealed unflushed and flushed chunks."""
        sealer = self._sealer
        return self._open + sealer.sealed_unflushed + sealer.flushed_in_memory

    def unflushed_samples(self) -> int:
        """Samples not yet durable in the store (neither in written chunks nor in a flushed
        open-buffer snapshot): what a crash would make the next owner replay from Kafka."""
        sealer = self._sealer
        return self._open + sealer.sealed_unflushed - sum(sealer.snapshotted)

    def memory_bytes(self) -> int:
        """Approximate bytes of sample data: buffer capacity and encoded chunk bytes."""
        with self._lock:
            self._settle()
            total = 0
            for ser in self._series:
                total += ser.ts.nbytes + ser.vals.nbytes
                total += sum(len(c.record.data) for c in ser.chunks)
            return total


def _grown(a: np.ndarray, cap: int, fill: float) -> np.ndarray:
    out = np.full(cap, fill, a.dtype)
    out[: len(a)] = a
    return out
