"""A shard's downsampler (ingest/downsampler.py) on both stores: what it writes equals the
periods of the raw samples it came from, read from memory and the store alike; a crash between
writing and the mark, or a new owner, leaves no gap and no duplicate; a deposed owner is fenced."""

from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest

from core.dataset import Dataset
from ingest.batch import SampleBatch
from ingest.downsampler import Downsampler
from ingest.flush import Flusher, recover_shard
from ingest.memstore import ShardMemstore
from ingest.shard_reader import read_merged_batch
from query.executor import NodeQuery, ShardSource, run_node_query
from query.functions import SampleBatch as QueryBatch
from query.functions import range_function
from query.promql import parse
from store import ColumnStore, MetaStore, StaleEpochError
from store.api import decode_part_key
from store.downsample import Periods, decode_periods, series_periods, summarise

from .support import Opener

MIN, HOUR = 60_000, 3_600_000
T0 = 1_750_000_000_000 // HOUR * HOUR
RESOLUTIONS = (MIN, 10 * MIN)
SERIES = 12


def _stream(hours: float, seed: int = 3) -> list[SampleBatch]:
    """15 s scrapes of counters (with resets) and gauges (with NaN), messages of a minute."""
    rng = np.random.default_rng(seed)
    labels = [{"_metric_": "m", "_ws_": "w", "_ns_": "n", "pod": f"p{s}"} for s in range(SERIES)]
    value = np.zeros(SERIES)
    out = []
    for minute in range(int(hours * 60)):
        ts = T0 + minute * MIN + np.arange(4) * 15_000
        rows = []
        for s in range(SERIES):
            if s == 0 and 30 <= minute < 50:
                continue  # a gap of 20 minutes
            for t in ts + rng.integers(0, 900, 4):
                value[s] = value[s] + rng.integers(0, 9) if rng.random() > 0.01 else 0.0
                v = value[s] if s % 2 else (np.nan if rng.random() < 0.02 else rng.normal())
                rows.append((s, int(t), float(v)))
        out.append(
            SampleBatch(
                labels,
                np.array([r[0] for r in rows], np.int32),
                np.array([r[1] for r in rows], np.int64),
                np.array([r[2] for r in rows], np.float64),
            )
        )
    return out


class Shard:
    """A shard's memstore fed a stream, half of it flushed to the store."""

    def __init__(self, meta: MetaStore, column: ColumnStore, stream: list[SampleBatch]) -> None:
        self.ds = Dataset(name=f"ds_{uuid.uuid4().hex[:10]}", num_shards=2)
        self.meta, self.column = meta, column
        self.epoch = meta.claim_epoch(self.ds.ref, 0, "a")
        self.mem = ShardMemstore(self.ds, 0, groups_per_shard=2, chunk_span_ms=10 * MIN)
        flusher = Flusher(self.mem, column, meta, self.ds.ref, 0, self.epoch, flush_interval_s=1)
        for offset, batch in enumerate(stream):
            self.mem.ingest(batch, offset)
            if offset == len(stream) // 2:
                flusher.flush_all()  # the older half comes from the store, the rest from memory

    def downsampler(self, epoch: int | None = None) -> Downsampler:
        return Downsampler(
            self.mem, self.column, self.meta, self.ds.ref, 0, epoch or self.epoch,
            RESOLUTIONS, delay_ms=MIN, interval_s=0.0,
        )  # fmt: skip

    def raw_periods(self, res: int, end: int) -> dict[str, Periods]:
        """What the periods must be: the raw samples up to `end`, summarised at once."""
        ids = list(range(self.mem.num_series))
        ts, vals, bounds = read_merged_batch(self.mem, self.column, self.ds.ref, 0, ids, 0, end)
        p = summarise(ts, vals, bounds, res)
        return {self.mem.part_key(s): series_periods(p, i) for i, s in enumerate(ids)}

    def stored_periods(self, res: int) -> dict[str, Periods]:
        keys = [self.mem.part_key(s) for s in range(self.mem.num_series)]
        found = self.column.read_downsampled(self.ds.ref, 0, res, keys, 0, 2**62)
        out = {}
        for key, records in found.items():
            parts = [decode_periods(r.data) for r in records]
            ends = np.concatenate([p.end for p in parts])
            assert (np.diff(ends) > 0).all(), f"{key}: periods repeated or out of order"
            out[key] = _concat(parts)
        return out


def _concat(parts: list[Periods]) -> Periods:
    names = [f for f in Periods.__dataclass_fields__ if f not in ("resolution_ms", "bounds")]
    cols = {f: np.concatenate([getattr(p, f) for p in parts]) for f in names}
    n = len(cols["end"])
    return Periods(parts[0].resolution_ms, **cols, bounds=np.array([0, n], np.int64))


def assert_equal(got: dict[str, Periods], want: dict[str, Periods]) -> None:
    want = {k: p for k, p in want.items() if len(p)}
    assert set(got) == set(want)
    for key, p in want.items():
        for f in Periods.__dataclass_fields__:
            if f not in ("resolution_ms", "bounds"):
                a, b = getattr(got[key], f), getattr(p, f)
                assert a.tobytes() == b.tobytes(), (key, f)


NOW = T0 + 3 * HOUR + 30 * MIN  # the stream ends at T0 + 3 h: all of it is complete


@pytest.mark.parametrize("per_read", [5, 10_000])
def test_the_periods_written_are_those_of_the_raw_samples(
    open_backend: Opener, per_read: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`per_read`: the series read at once (a slice of many series is read in parts)."""
    monkeypatch.setattr("ingest.downsampler.SERIES_PER_READ", per_read)
    meta, column = open_backend()
    shard = Shard(meta, column, _stream(3))
    done = shard.downsampler().run(NOW)
    assert done and {d.resolution_ms for d in done} == set(RESOLUTIONS)
    for res in RESOLUTIONS:
        mark = meta.read_downsample_marks(shard.ds.ref, 0)[res]
        complete = shard.mem.newest_sample_ms - MIN  # delay_ms: a minute
        span = shard.downsampler().slice_ms(res)
        assert span % res == 0 and mark % span == 0 and complete - span < mark <= complete
        assert_equal(shard.stored_periods(res), shard.raw_periods(res, mark))


def test_a_crash_before_the_mark_and_a_new_owner_leave_no_gap_and_no_duplicate(
    open_backend: Opener,
) -> None:
    meta, column = open_backend()
    shard = Shard(meta, column, _stream(3))
    first = shard.downsampler()
    first.run(T0 + HOUR)  # one hour done and marked

    class Crash(Exception):
        pass

    class CrashingMeta:  # the store, but the process dies at the mark
        def __getattr__(self, name: str) -> object:
            return getattr(meta, name)

        def commit_downsample_mark(self, *args: object) -> int:
            raise Crash

    crashing = shard.downsampler()
    crashing._meta = CrashingMeta()
    with pytest.raises(Crash):  # its records are written, its mark is not
        crashing.run(T0 + 2 * HOUR)
    epoch = meta.claim_epoch(shard.ds.ref, 0, "b")  # the next owner
    with pytest.raises(StaleEpochError):  # the deposed one cannot move the mark
        first.run(T0 + 2 * HOUR)
    shard.downsampler(epoch).run(NOW)
    for res in RESOLUTIONS:
        mark = meta.read_downsample_marks(shard.ds.ref, 0)[res]
        assert_equal(shard.stored_periods(res), shard.raw_periods(res, mark))


def test_nothing_held_nothing_done_and_a_second_run_adds_nothing(open_backend: Opener) -> None:
    meta, column = open_backend()
    shard = Shard(meta, column, [])
    assert shard.downsampler().run(NOW) == []
    shard = Shard(meta, column, _stream(1))
    d = shard.downsampler()
    assert d.run(NOW)
    assert d.run(NOW) == []  # up to date


def test_late_samples_and_series_sent_one_after_another_are_summarised_too(
    open_backend: Opener,
) -> None:
    """A backfill that sends whole series one after another: the later series' samples are
    older than the marks the first ones moved; and a lagging series' samples land in periods
    summarised before. The next round redoes those slices for those series."""
    meta, column = open_backend()
    stream = _stream(3)
    first_half = [_only(b, range(SERIES // 2)) for b in stream]
    shard = Shard(meta, column, first_half)
    d = shard.downsampler()
    assert d.run(NOW)
    rest = [_only(b, range(SERIES // 2, SERIES)) for b in stream]
    for offset, batch in enumerate(rest, start=len(stream)):
        shard.mem.ingest(batch, offset)
    d.run(NOW)
    assert d.repaired == SERIES - SERIES // 2
    for res in RESOLUTIONS:
        mark = meta.read_downsample_marks(shard.ds.ref, 0)[res]
        assert_equal(shard.stored_periods(res), shard.raw_periods(res, mark))
    assert d.run(NOW) == [] and d.repaired == SERIES - SERIES // 2  # nothing late is left


def test_late_samples_flushed_before_a_crash_are_redone_by_the_next_owner(
    open_backend: Opener,
) -> None:
    """Late samples flushed and checkpointed, then the node dies before its next round: the
    next owner's replay starts after the checkpoints and never sees them again; the redo
    record the flush left makes its first round redo their slices."""
    meta, column = open_backend()
    stream = _stream(3)
    shard = Shard(meta, column, [_only(b, range(SERIES // 2)) for b in stream])
    d = shard.downsampler()
    assert d.run(NOW)
    flusher = Flusher(
        shard.mem, column, meta, shard.ds.ref, 0, shard.epoch,
        flush_interval_s=1, before_checkpoint=d.keep_late,
    )  # fmt: skip
    rest = [_only(b, range(SERIES // 2, SERIES)) for b in stream]
    for offset, batch in enumerate(rest, start=len(stream)):
        shard.mem.ingest(batch, offset)
    earliest = shard.mem.earliest_late()
    assert earliest is not None and earliest < min(d.marks().values())
    flusher.flush_all()  # every checkpoint passes the late samples; then the node dies
    assert meta.read_downsample_redo(shard.ds.ref, 0) == earliest

    epoch = meta.claim_epoch(shard.ds.ref, 0, "b")
    shard.mem = ShardMemstore(shard.ds, 0, groups_per_shard=2, chunk_span_ms=10 * MIN)
    plan = recover_shard(shard.mem, meta, column, shard.ds.ref, 0, 2 * len(stream))
    assert plan.replay_until == -1 and shard.mem.earliest_late() is None  # nothing replayed
    new = shard.downsampler(epoch)
    new.run(NOW)
    for res in RESOLUTIONS:
        mark = meta.read_downsample_marks(shard.ds.ref, 0)[res]
        assert_equal(shard.stored_periods(res), shard.raw_periods(res, mark))
    assert meta.read_downsample_redo(shard.ds.ref, 0) is None  # redone: cleared
    assert new.run(NOW) == []


def test_a_redo_skips_the_slices_whose_raw_data_is_partly_past_retention(
    open_backend: Opener,
) -> None:
    """Their records summarise more raw data than is left: redone, they would lose some."""
    meta, column = open_backend()
    shard = Shard(meta, column, _stream(3))
    shard.downsampler().run(NOW)
    before = {res: shard.stored_periods(res) for res in RESOLUTIONS}
    epoch = meta.claim_epoch(shard.ds.ref, 0, "b")
    meta.set_downsample_redo(shard.ds.ref, 0, T0, epoch)  # as a crashed owner leaves it
    column.clock = lambda: NOW
    meta.set_retention(shard.ds.ref, NOW - (T0 + 15 * MIN))  # raw data from T0 + 15 min
    redone = shard.downsampler(epoch).run(NOW)
    assert redone and min(r.start for r in redone) >= T0 + 15 * MIN - 1
    for res in RESOLUTIONS:
        assert_equal(shard.stored_periods(res), before[res])
    assert meta.read_downsample_redo(shard.ds.ref, 0) is None


def _only(batch: SampleBatch, series: range) -> SampleBatch:
    keep = np.isin(batch.series_idx, list(series))
    return SampleBatch(
        batch.series, batch.series_idx[keep], batch.timestamps[keep], batch.values[keep]
    )


@pytest.mark.parametrize("func", ["rate", "max_over_time", "avg_over_time", "changes"])
def test_past_raw_retention_the_periods_answer(open_backend: Opener, func: str) -> None:
    """Raw data dropped by retention (here: all of it, hours old by the wall clock): whole-period
    windows are still answered exactly from the periods; other windows approximately, with a
    warning; a function periods cannot answer has nothing."""
    meta, column = open_backend()
    shard = Shard(meta, column, _stream(3))
    shard.downsampler().run(NOW)
    mark = meta.read_downsample_marks(shard.ds.ref, 0)[10 * MIN]
    ids = list(range(shard.mem.num_series))
    ts, vals, bounds = read_merged_batch(shard.mem, column, shard.ds.ref, 0, ids, 0, mark)
    raw = QueryBatch([{}] * (len(bounds) - 1), ts, vals, bounds)
    column.default_retention_ms = 3_600_000  # an hour: nothing of 2025 is left raw
    source = ShardSource(shard.ds, {0: shard.mem}, column)
    aligned = np.arange(T0 + HOUR, mark + 1, 10 * MIN, dtype=np.int64)
    answer = run_node_query(_range_query(f"{func}(m[30m])", aligned), source)
    want, present = range_function(func, raw, aligned, 30 * MIN, 0)
    got = _by_pod(answer.result)
    assert len(got) == SERIES and not answer.warnings
    for i, key in enumerate(shard.raw_periods(10 * MIN, mark)):
        np.testing.assert_allclose(got[_pod(key)], np.where(present[i], want[i], np.nan), 1e-9)

    source = ShardSource(shard.ds, {0: shard.mem}, column)
    shifted = run_node_query(_range_query(f"{func}(m[30m])", aligned + 1_000), source)
    assert len(_by_pod(shifted.result)) == SERIES
    assert any("approximate" in w for w in shifted.warnings), shifted.warnings

    source = ShardSource(shard.ds, {0: shard.mem}, column)
    none = run_node_query(_range_query("quantile_over_time(0.5, m[30m])", aligned), source)
    assert _by_pod(none.result) == {}


def SampleBatch_(ts, vals, bounds):
    from query.functions import SampleBatch as QueryBatch

    return QueryBatch([{}] * (len(bounds) - 1), ts, vals, bounds)


def _range_query(expr: str, times: np.ndarray) -> NodeQuery:
    return NodeQuery("series_local", expr=parse(expr), times=times)


def _pod(part_key: str) -> str:
    return decode_part_key(part_key)["pod"]


def _by_pod(matrix) -> dict[str, np.ndarray]:
    return {
        labels["pod"]: np.where(matrix.present[i], matrix.values[i], np.nan)
        for i, labels in enumerate(matrix.labels)
        if matrix.present[i].any()
    }


def test_a_sample_arriving_while_its_slice_is_read_is_redone(open_backend: Opener) -> None:
    """The read of a slice and its mark are not one step: a sample of the slice accepted in
    between is neither in the read nor after the mark; it counts as late, and is redone."""
    meta, column = open_backend()
    stream = _stream(3)
    shard = Shard(meta, column, [_only(b, range(SERIES - 1)) for b in stream])
    d = shard.downsampler()
    read = shard.mem.in_range

    def in_range_then_ingest(*args, **kwargs):
        found = read(*args, **kwargs)
        if shard.mem.in_range is in_range_then_ingest:  # once: the last series arrives now
            shard.mem.in_range = read
            for offset, b in enumerate(stream, start=len(stream)):
                shard.mem.ingest(_only(b, range(SERIES - 1, SERIES)), offset)
        return found

    shard.mem.in_range = in_range_then_ingest
    d.run(NOW)
    d.run(NOW)  # redoes what the first round missed
    for res in RESOLUTIONS:
        mark = meta.read_downsample_marks(shard.ds.ref, 0)[res]
        assert_equal(shard.stored_periods(res), shard.raw_periods(res, mark))


def test_a_pause_stops_a_round_at_its_next_read_and_leaves_its_mark(
    open_backend: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting series pauses downsampling (`Downsampler.paused`): a round in progress gives up
    before its next read, moving no mark; none starts inside the pause; the next round after
    it does the whole slice again, without duplicates."""
    import ingest.downsampler

    monkeypatch.setattr("ingest.downsampler.SERIES_PER_READ", 2)
    meta, column = open_backend()
    shard = Shard(meta, column, _stream(3))
    d = shard.downsampler()
    reading, go = threading.Event(), threading.Event()
    real_read, reads = ingest.downsampler.read_merged_batch, []

    def held_read(*args: object, **kwargs: object) -> object:
        reads.append(1)
        if len(reads) == 1:  # the round's first read waits until told to go on
            reading.set()
            assert go.wait(60)
        return real_read(*args, **kwargs)

    monkeypatch.setattr("ingest.downsampler.read_merged_batch", held_read)
    rounds: list[object] = []
    round_thread = threading.Thread(target=lambda: rounds.append(d.run_due()))
    round_thread.start()
    assert reading.wait(60)
    inside, leave = threading.Event(), threading.Event()

    def delete() -> None:
        with d.paused():
            inside.set()
            assert leave.wait(60)

    deleting = threading.Thread(target=delete)
    deleting.start()
    assert not inside.wait(0.2), "the pause waits for the round in progress"
    go.set()
    assert inside.wait(60)
    round_thread.join(60)
    assert rounds == [[]] and len(reads) == 1, "given up before its next read"
    assert meta.read_downsample_marks(shard.ds.ref, 0) == {}, "no mark moved"
    assert d.run_due() == [] and len(reads) == 1, "no round inside the pause"
    leave.set()
    deleting.join(60)
    assert d.run_due(), "the next round does the slices"
    for res in RESOLUTIONS:
        mark = meta.read_downsample_marks(shard.ds.ref, 0)[res]
        assert_equal(shard.stored_periods(res), shard.raw_periods(res, mark))
