"""Downsampling a shard on its owner: periods whose samples are complete, summarised per
resolution (store/downsample.py) and written beside the raw chunks, checkpointed like ingestion.
Rounds run on a thread of their own per shard (`DownsampleWorker`): a round reads whole slices
from memory and the store, which may take seconds on a busy shard, and neither consuming nor
flushing waits for it.

For each resolution r the shard keeps a mark in the MetaStore: the end of the last period done
(a multiple of r). A round takes the slice (mark, target] where target is the latest period end
at least `delay_ms` before both the clock and the newest sample the shard has ingested (samples
of a period may arrive until then: a late scraper, a remote-write queue catching up; and a shard
replaying or backfilling old data is only as far as its newest sample), at most
`max_chunk_span_ms` at a time; reads every series of
the shard with samples in the slice, from the ColumnStore and memory alike (`read_merged_batch`,
what queries read); writes one record per series and slice, identified by (part key, slice
start); then raises the mark, fenced by the shard's ownership epoch.

Exactly once, whatever crashes: a round that dies after writing and before its mark is done
again by the shard's next owner from the same mark, and its records replace the first ones (same
identity, the same or more samples: that owner recovered everything from the checkpoints and
Kafka before its first round, as the memstore holds flushes until its replay is complete).
Nothing is skipped: the mark only moves past slices whose records are written. A deposed owner
fails at the fenced mark (`StaleEpochError`), as it does at a checkpoint. A shard never
downsampled starts from its oldest sample still held.

Late samples (accepted for a time at or before a mark: a series lagging more than the delay, or
a backfill sending one series after another) are kept track of by the memstore; the next round
redoes the slices they fell into for their series, from the raw data, under the same record
identities. Across a crash: a new owner's replay starts after the checkpoints, so it never sees
again a late sample flushed before the crash. So before a flush's checkpoint passes late
samples not yet redone, the flush thread records in the MetaStore the earliest of them
(`keep_late`, `MetaStore.set_downsample_redo`); a new owner's first round redoes every series'
slices from there, and a round that has redone everything lowers or clears the record.
Slices that begin before the raw retention's cutoff are never redone: their raw data is partly
gone, and their records summarise more of it than a redo could.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from core.dataset import DatasetRef
from core.worker import CheckedWorker
from ingest.memstore import ShardMemstore
from ingest.shard_reader import read_merged_batch
from store.api import ChunkRecord, ColumnStore, MetaStore, StaleEpochError, StoreUnavailable
from store.downsample import encode_records, summarise

log = logging.getLogger(__name__)

PERIODS_PER_RECORD = 24  # a record: 2 hours of 5-minute periods, a day of hourly ones
SERIES_PER_READ = 2_000  # series read and summarised at once: a round's memory, bounded


class _Paused(Exception):
    """A round given up between two reads because `Downsampler.paused` was asked for."""


@dataclass(frozen=True, slots=True)
class DownsampleRound:
    """What one slice of one resolution did."""

    resolution_ms: int
    start: int  # the slice is (start, end]
    end: int
    series: int
    samples: int
    periods: int


class Downsampler:
    """One shard's downsampling, run by its `DownsampleWorker` (`run_due`)."""

    def __init__(
        self,
        memstore: ShardMemstore,
        columns: ColumnStore,
        meta: MetaStore,
        ref: DatasetRef,
        shard: int,
        epoch: int,
        resolutions_ms: Sequence[int],
        delay_ms: int,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._memstore = memstore
        self._columns = columns
        self._meta = meta
        self._ref = ref
        self._shard = shard
        self._epoch = epoch
        self.resolutions_ms = tuple(sorted(resolutions_ms))
        self._delay_ms = delay_ms
        self._interval_s = interval_s
        self._clock = clock
        self._marks: dict[int, int] | None = None  # read at the first round
        self._next_due = 0.0
        self.rounds = 0
        self.samples = 0
        self.periods = 0
        self.failures = 0
        self.repaired = 0  # series whose slices were redone for late samples
        self._repairing = 0  # series being redone now
        self.last_error: str | None = None  # the last round's failure; None once one succeeds
        self._round_lock = threading.Lock()  # held by a round; `paused` waits for it
        # The redo record (`keep_late`): what the store holds, and the earliest late time
        # known here and not in the memstore's count: the record a new owner found, until
        # redone, and the late samples a repair in progress took. Under `_late_lock`, which
        # orders the record's writes by the flush thread and the rounds.
        self._late_lock = threading.Lock()
        self._redo_stored: int | None = None
        self._redo_found: int | None = None
        self._redo_taken: int | None = None
        self._pause = threading.Event()  # a round gives up at its next read while set

    def marks(self) -> dict[int, int]:
        """Per resolution, the end of the last period done (absent: none yet)."""
        if self._marks is None:
            marks = self._meta.read_downsample_marks(self._ref, self._shard)
            with self._late_lock:
                self._redo_stored = self._meta.read_downsample_redo(self._ref, self._shard)
                self._redo_found = self._redo_stored
            for res, mark in marks.items():
                self._memstore.set_downsampled(res, mark)
            self._marks = marks
        return dict(self._marks)

    def keep_late(self) -> None:
        """Called by the flush thread before it commits a checkpoint: the store's redo record
        must name the earliest late sample not yet redone, which the checkpoint may pass (a
        new owner would not replay it). Writes only when that changed: no write in the steady
        state."""
        self.marks()  # the record a previous owner left is kept until redone
        with self._late_lock:
            self._store_redo()

    def _store_redo(self) -> None:
        """Under `_late_lock`: write the redo record if it differs from the truth."""
        known = [self._memstore.earliest_late(), self._redo_found, self._redo_taken]
        since = min((t for t in known if t is not None), default=None)
        if since != self._redo_stored:
            self._meta.set_downsample_redo(self._ref, self._shard, since, self._epoch)
            self._redo_stored = since

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No round runs inside this block (deleting series: a round that read a series before
        its delete must not write its records after). A round in progress gives up at its next
        read, leaving its mark where it was (the next round does it again, as after a crash)."""
        self._pause.set()
        try:
            with self._round_lock:
                yield
        finally:
            self._pause.clear()
            self._next_due = 0.0  # do what was given up at once

    def run_due(self) -> list[DownsampleRound]:
        """Every slice due, once per `interval_s`; nothing while the memstore is recovering
        (its replay is not complete, so neither are its periods)."""
        now = self._clock()
        if now < self._next_due or self._memstore.recovering or self._pause.is_set():
            return []
        self._next_due = now + self._interval_s
        try:
            with self._round_lock:
                done = self.run(int(now * 1000))
        except _Paused:
            return []
        except StaleEpochError:
            raise  # another node owns the shard: the ingester stops
        except Exception as e:  # the next interval retries from the same marks
            self.failures += 1
            self.last_error = f"{type(e).__name__}: {e}"
            # A store outage is expected now and then; anything else is a bug, logged in full,
            # and never stops ingestion (the raw samples are kept either way).
            how = log.warning if isinstance(e, StoreUnavailable) else log.exception
            how("%s shard %d: downsampling failed: %s", self._ref.name, self._shard, e)
            return []
        self.last_error = None
        return done

    def stats(self) -> dict[str, object]:
        """For status and metrics: the marks, what the rounds did, the last failure."""
        return {
            "marks": dict(self._marks or {}),
            "rounds": self.rounds,
            "samples": self.samples,
            "periods": self.periods,
            "failures": self.failures,
            "repaired": self.repaired,
            # series with late samples whose slices are not redone yet
            "late_series": self._memstore.late_series() + self._repairing,
            # the redo record in the store: slices from there are redone if this node dies
            "redo_since_ms": self._redo_stored,
            "last_error": self.last_error,
        }

    def slice_ms(self, res: int) -> int:
        """The span of a record: `PERIODS_PER_RECORD` periods, within the store's chunk span.
        Slices are a fixed grid (multiples of this), so a slice's records always have the same
        identity, whoever writes them and however often."""
        most = max(res, self._columns.max_chunk_span_ms // res * res)
        return min(res * PERIODS_PER_RECORD, most)

    def run(self, now_ms: int) -> list[DownsampleRound]:
        """Redo the slices late samples fell into, then downsample every whole slice complete
        by `now_ms - delay_ms` (and by the newest sample ingested)."""
        marks = self.marks()
        done = self._repair(marks)
        newest = self._memstore.newest_sample_ms
        if newest is None:
            return done
        complete = min(now_ms, newest) - self._delay_ms
        for res in self.resolutions_ms:
            span = self.slice_ms(res)
            target = complete // span * span  # the last whole slice over by `complete`
            mark = marks.get(res)
            if mark is None:
                mark = self._first_mark(span)
                if mark is None:
                    continue  # no sample held yet
            while mark < target:
                done.append(self._slice(res, mark, mark + span))
                mark += span
        return done

    def _repair(self, marks: dict[int, int]) -> list[DownsampleRound]:
        """Late samples (accepted at or before a mark, `ShardMemstore.take_late`): redo the
        slices from each late series' earliest one up to the mark, for those series only; and
        from the redo record a previous owner left (`keep_late`), for every series. The
        records replace the ones written before (same identities)."""
        # Counted as being redone before they leave the memstore's count, so `stats` never
        # shows none pending while some are.
        self._repairing = self._memstore.late_series()
        with self._late_lock:
            late = self._memstore.take_late()
            found = self._redo_found
            self._redo_taken = min(late.values(), default=None)
        done: list[DownsampleRound] = []
        if not late and found is None:
            self._repairing = 0
            return done
        self._repairing = max(self._repairing, len(late))
        try:
            self._redo(late, found, marks, done)
        except BaseException:
            self._memstore.put_back_late(late)  # the next round tries again
            with self._late_lock:
                self._redo_taken = None
            raise
        finally:
            self._repairing = 0
        with self._late_lock:
            self._redo_taken = self._redo_found = None
            self._store_redo()  # lowered or cleared: what is left is in the memstore's count
        self.repaired += len(late)
        return done

    def _redo(
        self,
        late: dict[int, int],
        found: int | None,
        marks: dict[int, int],
        done: list[DownsampleRound],
    ) -> None:
        cutoff = self._columns.cutoff(self._ref)  # older raw data is gone: never redone
        for res in self.resolutions_ms:
            mark, span = marks.get(res), self.slice_ms(res)
            if mark is None:
                continue
            by_slice: dict[int, list[int]] = {}
            for sid, since in late.items():
                for start in _slices(since, mark, span, cutoff):
                    by_slice.setdefault(start, []).append(sid)
            every = set(_slices(found, mark, span, cutoff)) if found is not None else set()
            for start in sorted(every | set(by_slice)):
                sids = None if start in every else by_slice[start]
                done.append(self._slice(res, start, start + span, sids, commit=False))

    def _first_mark(self, span: int) -> int | None:
        """The slice boundary before the shard's oldest sample held (memory or store)."""
        oldest = self._memstore.oldest_sample_ms
        return None if oldest is None else (oldest - 1) // span * span

    def _slice(
        self,
        res: int,
        start: int,
        end: int,
        series: Sequence[int] | None = None,
        commit: bool = True,
    ) -> DownsampleRound:
        """Summarise (start, end] of `series` (all by default), write their records and, for a
        new slice (`commit`), raise the mark past it."""
        mem = self._memstore
        mem.summarising(end)  # a sample of the slice arriving during the read is late, redone
        every = np.arange(mem.num_series, dtype=np.int64)
        ids = mem.in_range(every if series is None else series, start + 1, end)
        n_records = n_samples = n_periods = 0
        for i in range(0, len(ids), SERIES_PER_READ):  # bounded memory on a shard of millions
            if self._pause.is_set():
                raise _Paused
            some = ids[i : i + SERIES_PER_READ]
            ts, vals, bounds = read_merged_batch(
                mem, self._columns, self._ref, self._shard, some, start + 1, end, cache=False
            )
            periods = summarise(ts, vals, bounds, res)
            sizes = np.diff(periods.bounds).tolist()
            records = [
                ChunkRecord(mem.part_key(sid), start + 1, end, size, data)
                for sid, size, data in zip(some, sizes, encode_records(periods), strict=True)
                if size
            ]
            self._columns.write_downsampled(self._ref, self._shard, res, records)
            n_records += len(records)
            n_samples += len(ts)
            n_periods += len(periods)
        if commit:
            assert self._marks is not None
            self._marks[res] = self._meta.commit_downsample_mark(
                self._ref, self._shard, res, end, self._epoch
            )
            self._memstore.set_downsampled(res, self._marks[res])  # queries may read them now
        self.rounds += 1
        self.samples += n_samples
        self.periods += n_periods
        return DownsampleRound(res, start, end, n_records, n_samples, n_periods)


def _slices(since: int, mark: int, span: int, cutoff: int) -> range:
    """The starts of the slices from the one holding `since` up to `mark`, but none beginning
    before `cutoff` (its raw data is partly gone)."""
    first = (since - 1) // span * span  # the slice (first, first + span] holding it
    if first + 1 < cutoff:
        first += -(-(cutoff - 1 - first) // span) * span
    return range(first, mark, span)


class DownsampleWorker(CheckedWorker):
    """A shard's downsampling rounds on their own thread: `run_due` every second while
    `ready()` (the store takes writes: no round while flushes retry). A failure it does not
    survive (`StaleEpochError`: another node owns the shard) ends the thread; `check()`
    re-raises it on the ingesting thread, as the flush thread's."""

    TICK_S = 1.0

    def __init__(self, downsampler: Downsampler, ready: Callable[[], bool], name: str) -> None:
        super().__init__(name)
        self.downsampler = downsampler
        self._ready = ready
        self.start()

    def _loop(self) -> None:
        while not self.wait(self.TICK_S):
            if self._ready():
                self.downsampler.run_due()
