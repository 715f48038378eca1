"""Downsampling a shard on its owner: periods whose samples are complete, summarised per
resolution (store/downsample.py) and written beside the raw chunks, checkpointed like ingestion.

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

A sample arriving more than `delay_ms` after its period ended is in the raw data but not in that
period's summary (docs/lifecycle.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from core.dataset import DatasetRef
from ingest.memstore import ShardMemstore
from ingest.shard_reader import read_merged_batch
from store.api import ChunkRecord, ColumnStore, MetaStore
from store.downsample import encode_periods, period_ends, series_periods, summarise

log = logging.getLogger(__name__)


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
    """One shard's downsampling, run by its flush thread (`run_due`)."""

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

    def marks(self) -> dict[int, int]:
        """Per resolution, the end of the last period done (absent: none yet)."""
        if self._marks is None:
            self._marks = self._meta.read_downsample_marks(self._ref, self._shard)
            self._memstore.downsampled_until.update(self._marks)
        return dict(self._marks)

    def run_due(self) -> list[DownsampleRound]:
        """Every slice due, once per `interval_s`; nothing while the memstore is recovering
        (its replay is not complete, so neither are its periods)."""
        now = self._clock()
        if now < self._next_due or self._memstore.recovering:
            return []
        done = self.run(int(now * 1000))
        self._next_due = now + self._interval_s
        return done

    def run(self, now_ms: int) -> list[DownsampleRound]:
        """Downsample every complete period up to `now_ms - delay_ms`, slice by slice."""
        marks = self.marks()
        done: list[DownsampleRound] = []
        newest = self._memstore.newest_sample_ms
        if newest is None:
            return done
        complete = min(now_ms, newest) - self._delay_ms
        for res in self.resolutions_ms:
            target = int(period_ends(np.array([complete]), res)[0])
            if target > complete:
                target -= res  # the period holding `complete` is not over yet
            mark = marks.get(res)
            if mark is None:
                mark = self._first_mark(res)
                if mark is None:
                    continue  # no sample held yet
            span = max(res, self._columns.max_chunk_span_ms // res * res)
            while mark < target:
                end = min(target, mark + span)
                done.append(self._slice(res, mark, end))
                mark = end
        return done

    def _first_mark(self, res: int) -> int | None:
        """The period end before the shard's oldest sample held (memory or store)."""
        oldest = None
        for sid in range(self._memstore.num_series):
            span = self._memstore.time_range(sid)
            if span is not None and (oldest is None or span[0] < oldest):
                oldest = span[0]
        if oldest is None:
            return None
        return int(period_ends(np.array([oldest]), res)[0]) - res

    def _slice(self, res: int, start: int, end: int) -> DownsampleRound:
        mem = self._memstore
        ids = mem.in_range(range(mem.num_series), start + 1, end)
        records: list[ChunkRecord] = []
        n_samples = n_periods = 0
        if ids:
            ts, vals, bounds = read_merged_batch(
                mem, self._columns, self._ref, self._shard, ids, start + 1, end
            )
            periods = summarise(ts, vals, bounds, res)
            n_samples, n_periods = len(ts), len(periods)
            for i, sid in enumerate(ids):
                if periods.bounds[i + 1] > periods.bounds[i]:
                    one = series_periods(periods, i)
                    records.append(
                        ChunkRecord(
                            mem.part_key(sid), start + 1, end, len(one), encode_periods(one)
                        )
                    )
        self._columns.write_downsampled(self._ref, self._shard, res, records)
        assert self._marks is not None
        self._marks[res] = self._meta.commit_downsample_mark(
            self._ref, self._shard, res, end, self._epoch
        )
        self._memstore.downsampled_until[res] = self._marks[res]  # queries may read them now
        self.rounds += 1
        self.samples += n_samples
        self.periods += n_periods
        return DownsampleRound(res, start, end, len(records), n_samples, n_periods)
