"""Flush, checkpoint and recovery on both backends (SQLite file, real Cassandra).

The exactness tests run a message stream through a node, crash it at a chosen point of a flush,
recover a new node from the stores, replay, and then compare every series, sample by sample and
bit by bit, with a sequential model of the ordering policy. They read the ColumnStore without any
de-duplication, so a replay that wrote overlapping chunks fails them (one test shows it does).
"""

from __future__ import annotations

import random
import sqlite3
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.dataset import Dataset, DatasetRef
from ingest.batch import SampleBatch
from ingest.flush import Flusher, recover_shard, replay_start
from ingest.memstore import ShardMemstore
from ingest.shard_reader import read_merged
from store import (
    INT64_MAX,
    INT64_MIN,
    ChunkRecord,
    ColumnStore,
    MetaStore,
    PartKeyRecord,
    StaleEpochError,
    StoreUnavailable,
    encode_part_key,
)
from store.cassandra import open_cassandra_stores
from store.sqlite import open_sqlite_stores

from ..stores.support import MAX_CHUNK_SPAN_MS

SHARD = 3
GROUPS = 3
SPAN = 2_000  # chunk time buckets, ms
MAX_CHUNK = 4

Stores = tuple[MetaStore, ColumnStore]


# -------------------------------------------------------------------------------- backends


@pytest.fixture(scope="module")
def cassandra_stores(cassandra_address: tuple[str, int]) -> Iterator[Stores]:
    host, port = cassandra_address
    keyspace = f"filopy_flush_{uuid.uuid4().hex[:12]}"
    meta, column = open_cassandra_stores(
        [host], port, keyspace, max_chunk_span_ms=MAX_CHUNK_SPAN_MS, request_timeout_s=20.0
    )
    yield meta, column
    try:
        meta._conn.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
    finally:
        meta.close()
        column.close()


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.cassandra)])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    """Both stores of one backend; tests use a dataset of their own, so sharing is safe."""
    if request.param == "cassandra":
        yield request.getfixturevalue("cassandra_stores")
        return
    meta, column = open_sqlite_stores(tmp_path / "f.db", max_chunk_span_ms=MAX_CHUNK_SPAN_MS)
    yield meta, column
    meta.close()
    column.close()


def _dataset() -> Dataset:
    return Dataset(name=f"ds_{uuid.uuid4().hex[:12]}", num_shards=8)


# ------------------------------------------------------------------------------ the stream


def make_stream(
    rng: random.Random, messages: int, series: int, per_message: int
) -> list[SampleBatch]:
    """Messages of scrape-like samples with jitter, repeats and stragglers (out of order)."""
    clock = [rng.randrange(0, 1_000) for _ in range(series)]
    out = []
    for _ in range(messages):
        rows: list[tuple[int, int, float]] = []
        for _ in range(rng.randrange(0, per_message + 1)):
            s = rng.randrange(series)
            # dense enough for several chunks per 2 s bucket (count cuts), with repeats,
            # stragglers and the odd gap across buckets
            r = rng.random()
            step = 5_000 if r < 0.03 else rng.choice([0, -300] if r < 0.13 else [100, 150, 200])
            clock[s] += step
            value = rng.choice([rng.random(), float(rng.randrange(100)), -0.0, float("nan")])
            rows.append((s, clock[s], value))
        out.append(_batch(rows))
    return out


def _labels(s: int) -> dict[str, str]:
    return {"_metric_": "req", "_ws_": "w", "_ns_": "n", "pod": f"p{s}"}


def _batch(rows: list[tuple[int, int, float]]) -> SampleBatch:
    present = sorted({s for s, _, _ in rows})
    local = {s: i for i, s in enumerate(present)}
    return SampleBatch(
        [_labels(s) for s in present],
        np.array([local[s] for s, _, _ in rows], np.int32),
        np.array([t for _, t, _ in rows], np.int64),
        np.array([v for _, _, v in rows], np.float64),
    )


def expected_samples(stream: list[SampleBatch]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The ordering policy, one sample at a time: per message, each series' samples in time
    order (a repeated timestamp keeps its first sample); keep what beats every timestamp of
    earlier messages."""
    last: dict[str, int] = {}
    out: dict[str, tuple[list[int], list[float]]] = {}
    for b in stream:
        keys = [encode_part_key(lab) for lab in b.series]
        rows = sorted(
            (keys[b.series_idx[i]], int(b.timestamps[i]), i, float(b.values[i]))
            for i in range(len(b))
        )
        before = dict(last)
        seen: set[tuple[str, int]] = set()
        for key, t, _, v in rows:
            if (key, t) in seen:
                continue
            seen.add((key, t))
            if t > before.get(key, INT64_MIN):
                last[key] = max(last.get(key, INT64_MIN), t)
                ts, vs = out.setdefault(key, ([], []))
                ts.append(t)
                vs.append(v)
    return {k: (np.array(t, np.int64), np.array(v, np.float64)) for k, (t, v) in out.items()}


def _same(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> bool:
    return np.array_equal(got[0], want[0]) and np.array_equal(
        got[1].view(np.uint64), want[1].view(np.uint64)
    )


def stored_samples(column: ColumnStore, ref: DatasetRef) -> dict[str, tuple[np.ndarray, ...]]:
    """Every stored chunk of every stored series, concatenated as is (no de-duplication)."""
    keys = [r.part_key for r in column.list_part_keys(ref, SHARD)]
    found = column.read_chunks(ref, SHARD, keys, INT64_MIN, INT64_MAX)
    out = {}
    for key, chunks in found.items():
        for c in chunks:
            assert c.end_time - c.start_time < SPAN and c.num_samples <= MAX_CHUNK
        parts = [c.samples() for c in chunks]
        out[key] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return out


def assert_exact(
    column: ColumnStore,
    ref: DatasetRef,
    want: dict[str, tuple[np.ndarray, np.ndarray]],
    mem: ShardMemstore | None = None,
) -> None:
    """The ColumnStore alone (mem None) or ColumnStore + memstore hold exactly `want`."""
    if mem is None:
        got = stored_samples(column, ref)
        assert sorted(got) == sorted(want)
        ranges = {r.part_key: (r.start_time, r.end_time) for r in column.list_part_keys(ref, SHARD)}
        assert ranges == {k: (int(ts[0]), int(ts[-1])) for k, (ts, _) in want.items()}
    else:
        got = {}
        for key in want:
            sid = mem.series_id(key)
            assert sid is not None, key
            got[key] = read_merged(mem, column, ref, SHARD, sid)
    for key, w in want.items():
        g = got[key]
        values, counts = np.unique(g[0], return_counts=True)
        assert _same(g, w), (
            f"{key}: {len(g[0])} samples, want {len(w[0])}; repeated ts {values[counts > 1]}"
        )


# ------------------------------------------------------------------------------ the nodes


class Crash(Exception):
    """The node died here."""


class FaultyColumnStore:
    """A ColumnStore whose next write of the chosen kind dies part-way or after the fact."""

    def __init__(self, inner: ColumnStore) -> None:
        self.inner = inner
        # "before_chunks" | "chunks_partial" | "after_chunks" | "before_snapshot" | "unavailable"
        self.fail: str | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def write_chunks(self, ref: DatasetRef, shard: int, chunks: Iterable[ChunkRecord]) -> None:
        batch = list(chunks)
        if self.fail == "unavailable":
            self.fail = None
            raise StoreUnavailable("injected")
        if self.fail == "before_chunks":  # the seal mark raised, nothing written
            raise Crash("before write_chunks")
        if self.fail == "chunks_partial":
            self.inner.write_chunks(ref, shard, batch[: len(batch) // 2])
            raise Crash("during write_chunks")
        self.inner.write_chunks(ref, shard, batch)

    def write_part_keys(
        self, ref: DatasetRef, shard: int, records: Iterable[PartKeyRecord]
    ) -> None:
        if self.fail == "after_chunks":
            raise Crash("after write_chunks")
        self.inner.write_part_keys(ref, shard, records)

    def write_open_snapshot(self, *args: object) -> None:
        if self.fail == "before_snapshot":
            raise Crash("after the chunks and part keys, before the open-buffer snapshot")
        self.inner.write_open_snapshot(*args)  # type: ignore[arg-type]


class FaultyMetaStore:
    def __init__(self, inner: MetaStore) -> None:
        self.inner = inner
        self.fail = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def commit_checkpoint(self, *args: object) -> int:
        if self.fail:
            raise Crash("before commit_checkpoint")
        return self.inner.commit_checkpoint(*args)  # type: ignore[arg-type]


@dataclass
class Node:
    """One incarnation of the shard's ingester: claim, recover, replay, ingest, flush."""

    mem: ShardMemstore
    flusher: Flusher
    column: FaultyColumnStore
    meta: FaultyMetaStore
    start: int
    replay_until: int

    @classmethod
    def start_up(
        cls, stores: Stores, ds: Dataset, produced: int, max_samples: int = 1_000_000
    ) -> Node:
        meta, column = FaultyMetaStore(stores[0]), FaultyColumnStore(stores[1])
        epoch = meta.claim_epoch(ds.ref, SHARD, "test")
        mem = ShardMemstore(
            ds,
            SHARD,
            groups_per_shard=GROUPS,
            max_chunk_samples=MAX_CHUNK,
            chunk_span_ms=SPAN,
            retention_ms=3_000,
            max_samples=max_samples,
        )
        plan = recover_shard(mem, meta, column, ds.ref, SHARD, produced)  # type: ignore[arg-type]
        flusher = Flusher(
            mem,
            column,
            meta,
            ds.ref,
            SHARD,
            epoch,
            checkpoints=plan.checkpoints,  # type: ignore[arg-type]
        )
        start = 0 if plan.start_offset is None else plan.start_offset
        return cls(mem, flusher, column, meta, start, plan.replay_until)

    def run(self, stream: list[SampleBatch], upto: int, flush_every: int) -> None:
        """Ingest messages [start, upto), flushing one group every `flush_every` messages."""
        for off in range(self.start, upto):
            self.mem.ingest(stream[off], off)
            if flush_every and off % flush_every == flush_every - 1:
                result = self.flusher.flush_group((off // flush_every) % GROUPS)
                assert result.held == (off < self.replay_until)
        self.start = upto

    def crash_in_flush(self, mode: str, group: int, everything: bool = False) -> bool:
        """Flush `group` (sealing `everything`, as a clean stop or memory pressure does),
        dying at the point `mode` names; False if the flush had nothing to write (or commit)
        and so did not reach that point."""
        if mode == "after_checkpoint":
            self.flusher.flush_group(group, everything=everything)
            return True
        if mode == "before_checkpoint":
            self.meta.fail = True
        else:
            self.column.fail = mode
        try:
            self.flusher.flush_group(group, everything=everything)
        except Crash:
            return True
        return False


CRASH_MODES = [
    "none",
    "before_chunks",
    "chunks_partial",
    "after_chunks",
    "before_snapshot",
    "before_checkpoint",
    "after_checkpoint",
]


def crash_and_recover(
    stores: Stores,
    stream: list[SampleBatch],
    crash_at: int,
    mode: str,
    flush_every: int = 3,
    everything: bool = False,
) -> Node:
    """Crash in a flush of long segments (with count cuts), then recover flushing often."""
    ds = _dataset()
    first = Node.start_up(stores, ds, produced=0)
    first.run(stream, crash_at, flush_every if mode != "none" else 0)
    if mode != "none":
        for g in range(GROUPS - 1):
            first.flusher.flush_group(g)
        first.run(stream, min(crash_at + 8, len(stream)), 0)
        # only a group with open samples writes a snapshot (and can die before it)
        groups = [GROUPS - 1, 0, 1] if mode == "before_snapshot" else [GROUPS - 1, 0]
        crashed = [g for g in groups if first.crash_in_flush(mode, g, everything)]
        assert crashed if mode == "before_snapshot" else crashed == groups
    produced = first.start
    del first  # the crash: memory gone
    second = Node.start_up(stores, ds, produced)
    second.run(stream, len(stream), flush_every=1)
    want = expected_samples(stream)
    assert_exact(second.column.inner, ds.ref, want, second.mem)
    second.flusher.flush_all()
    assert_exact(second.column.inner, ds.ref, want)
    assert_exact(second.column.inner, ds.ref, want, second.mem)
    last = len(stream) - 1
    assert stores[0].read_checkpoints(ds.ref, SHARD) == dict.fromkeys(range(GROUPS), last)
    return second


# ---------------------------------------------------------------------------------- tests


@pytest.mark.parametrize(
    ("mode", "everything"),
    # a flush that seals everything (a clean stop, memory pressure) writes no snapshot
    [(m, False) for m in CRASH_MODES] + [(m, True) for m in CRASH_MODES if m != "before_snapshot"],
)
def test_exact_after_crash_and_replay(stores: Stores, mode: str, everything: bool) -> None:
    stream = make_stream(random.Random(7), messages=40, series=8, per_message=12)
    node = crash_and_recover(stores, stream, crash_at=20, mode=mode, everything=everything)
    st = node.mem.stats
    if mode in ("after_checkpoint", "before_checkpoint"):
        assert st.skipped_replay + st.skipped_flushed > 0  # the recovery skip rules did work


def test_clean_stop_replays_nothing(stores: Stores) -> None:
    ds = _dataset()
    stream = make_stream(random.Random(1), messages=10, series=5, per_message=6)
    node = Node.start_up(stores, ds, produced=0)
    node.run(stream, 10, 0)
    for g in range(GROUPS):  # a flush with open samples: each group's checkpoint has a snapshot
        node.flusher.flush_group(g)
    node.flusher.flush_all()  # everything sealed: no snapshot is left to read at the next start
    for g, offset in stores[0].read_checkpoints(ds.ref, SHARD).items():
        assert stores[1].read_open_snapshot(ds.ref, SHARD, g, offset) is None
    again = Node.start_up(stores, ds, produced=10)
    assert (again.start, again.replay_until, again.mem.recovering) == (10, -1, False)
    assert again.mem.num_series == 5  # part keys indexed, samples left in the store
    assert again.mem.memory_samples() == 0
    assert_exact(stores[1], ds.ref, expected_samples(stream), again.mem)


def test_flushes_are_held_while_replaying_up_to_the_seal_mark(stores: Stores) -> None:
    stream = make_stream(random.Random(2), messages=8, series=4, per_message=5)
    fresh = Node.start_up(stores, _dataset(), produced=8)  # nothing stored, 8 in Kafka
    assert not fresh.mem.recovering and fresh.replay_until == -1  # nothing to contradict
    ds = _dataset()
    first = Node.start_up(stores, ds, produced=0)
    first.run(stream, 4, 0)
    assert first.crash_in_flush("after_chunks", group=0, everything=True)  # chunks of 0..3
    assert stores[0].read_seal_mark(ds.ref, SHARD) == 3
    node = Node.start_up(stores, ds, produced=8)  # 8 messages in Kafka, the mark at 3
    assert node.mem.recovering and node.replay_until == 3
    node.mem.ingest(stream[0], 0)
    assert node.flusher.flush_group(0).held
    assert node.flusher.flush_due(now=1e9) == []
    node.run(stream, 4, 0)  # reaching offset 3 ends recovery, before the partition's end
    assert not node.mem.recovering and not node.flusher.flush_group(0).held
    node.run(stream, 8, 1)
    node.flusher.flush_all()
    assert_exact(stores[1], ds.ref, expected_samples(stream))


def test_detects_duplicates_when_flushing_before_replay_caught_up(stores: Stores) -> None:
    """Why flushes are held: after a crash that left a buffer's chunks without their part
    keys (a flush sealing everything: a clean stop that died), flushing early cuts the replayed
    buffer elsewhere, and the old chunk past the cut overlaps a new one. The exactness check
    sees the repeated samples."""
    ds = _dataset()
    rows = [[(0, 1000 + 100 * i, float(i))] for i in range(10)]  # one series, one bucket
    stream = [_batch(r) for r in rows]
    first = Node.start_up(stores, ds, produced=0)
    first.run(stream, 10, 0)
    assert first.crash_in_flush("after_chunks", group=first.mem.group_of(0), everything=True)
    assert stored_samples(stores[1], ds.ref) == {}  # chunks written, part keys not
    second = Node.start_up(stores, ds, produced=10)
    second.mem.end_recovery()  # what the hold prevents
    second.run(stream, 6, 0)
    second.flusher.flush_all()
    second.run(stream, 10, 0)
    second.flusher.flush_all()
    with pytest.raises(AssertionError, match="repeated ts"):
        assert_exact(stores[1], ds.ref, expected_samples(stream))
    # the same crash, recovered with the hold, is exact
    ds2 = _dataset()
    first = Node.start_up(stores, ds2, produced=0)
    first.run(stream, 10, 0)
    assert first.crash_in_flush("after_chunks", group=first.mem.group_of(0), everything=True)
    second = Node.start_up(stores, ds2, produced=10)
    second.run(stream, 6, 0)
    second.flusher.flush_all()
    second.run(stream, 10, 0)
    second.flusher.flush_all()
    assert_exact(stores[1], ds2.ref, expected_samples(stream))


def test_stale_epoch_is_fenced(stores: Stores) -> None:
    meta = stores[0]
    ds = _dataset()
    stream = make_stream(random.Random(3), messages=8, series=6, per_message=6)
    old = Node.start_up(stores, ds, produced=0)
    old.run(stream, 4, 0)
    old.flusher.flush_all()
    before = meta.read_checkpoints(ds.ref, SHARD)
    assert before == dict.fromkeys(range(GROUPS), 3)
    old.run(stream, 8, 0)
    new_epoch = meta.claim_epoch(ds.ref, SHARD, "new owner")
    with pytest.raises(StaleEpochError) as err:
        old.flusher.flush_group(0)
    assert err.value.current_epoch == new_epoch
    # without the pre-write check, chunks get written but the commit is still refused
    old.flusher.check_epoch = False
    with pytest.raises(StaleEpochError):
        old.flusher.flush_group(1)
    assert meta.read_checkpoints(ds.ref, SHARD) == before


def test_store_errors_leave_the_flush_pending_and_retry_it(stores: Stores) -> None:
    ds = _dataset()
    stream = make_stream(random.Random(4), messages=12, series=6, per_message=8)
    node = Node.start_up(stores, ds, produced=0)
    node.run(stream, 6, 0)
    node.column.fail = "unavailable"
    with pytest.raises(StoreUnavailable):
        node.flusher.flush_group(1)
    assert node.flusher.group_stats[1].failures == 1
    node.run(stream, 12, 0)  # more samples arrive for the group meanwhile
    retried = node.flusher.flush_group(1)
    assert retried.checkpoint == 5  # the pending seal, not a new one
    assert node.flusher.flush_group(1).checkpoint == 11
    node.flusher.flush_all()
    assert_exact(stores[1], ds.ref, expected_samples(stream))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 10_000),
    messages=st.integers(1, 30),
    crashes=st.lists(
        st.tuples(st.floats(0, 1), st.sampled_from(CRASH_MODES[1:]), st.booleans()),
        min_size=1,
        max_size=3,
    ),
    flush_every=st.integers(1, 5),
    unflushed=st.integers(0, 10),
    max_samples=st.sampled_from([15, 1_000_000]),
)
def test_property_random_streams_and_crashes_are_exact(
    seed: int,
    messages: int,
    crashes: list[tuple[float, str, bool]],
    flush_every: int,
    unflushed: int,
    max_samples: int,
) -> None:
    """Any stream, crashed at any points in any phase of a flush, ends up stored exactly once.
    A small memory bound also exercises eviction and the memory/store split of reads."""
    rng = random.Random(seed)
    stream = make_stream(rng, messages, series=6, per_message=8)
    want = expected_samples(stream)
    ds = _dataset()
    with tempfile.TemporaryDirectory() as tmp:
        stores = open_sqlite_stores(Path(tmp) / "p.db", max_chunk_span_ms=MAX_CHUNK_SPAN_MS)
        try:
            produced = 0
            for frac, mode, everything in sorted(crashes):
                node = Node.start_up(stores, ds, produced, max_samples)
                crash_at = max(node.start, int(frac * messages))  # maybe mid-replay
                node.run(stream, crash_at, flush_every)
                if not node.mem.recovering:  # let a long segment build up, then die flushing it
                    crash_at = min(messages, crash_at + unflushed)
                    node.run(stream, crash_at, 0)
                    node.crash_in_flush(mode, rng.randrange(GROUPS), everything)
                produced = max(produced, crash_at)
            node = Node.start_up(stores, ds, produced, max_samples)
            node.run(stream, messages, flush_every)
            assert_exact(stores[1], ds.ref, want, node.mem)
            node.flusher.flush_all()
            assert_exact(stores[1], ds.ref, want)
            assert_exact(stores[1], ds.ref, want, node.mem)
        finally:
            stores[0].close()
            stores[1].close()


# ------------------------------------------------------------------------------- scheduling


def test_replay_start_needs_every_group() -> None:
    assert replay_start({}, 3) is None
    assert replay_start({0: 5, 1: 9}, 3) is None
    assert replay_start({0: 5, 1: 9, 2: 7}, 3) == 6
    assert replay_start({0: 5, 1: 9, 2: 7, 3: 2}, 3) == 3  # groups_per_shard shrank


def test_flush_due_spreads_groups_across_the_interval(tmp_path: Path) -> None:
    meta, column = open_sqlite_stores(tmp_path / "s.db", max_chunk_span_ms=MAX_CHUNK_SPAN_MS)
    ds = _dataset()
    epoch = meta.claim_epoch(ds.ref, 0)
    mem = ShardMemstore(ds, 0, groups_per_shard=4, chunk_span_ms=SPAN, max_samples=50)
    flusher = Flusher(mem, column, meta, ds.ref, 0, epoch, flush_interval_s=40.0)
    order: list[int] = []
    assert flusher.flush_due(now=0.0) == []  # the schedule starts: a group every 10 s
    assert flusher.seconds_until_due(now=0.0) == 10.0
    for now in [5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0]:
        mem.ingest(_batch([(0, int(now * 1000), 1.0)]), int(now))
        order += [r.group for r in flusher.flush_due(now=now)]
    assert order == [0, 1, 2, 3, 0]
    # a stall longer than the interval flushes every group once, not every missed slot
    order = [r.group for r in flusher.flush_due(now=500.0)]
    assert order == [1, 2, 3, 0]
    # memory pressure flushes ahead of schedule until relieved
    rows = [(s, 600_000 + k, 1.0) for s in range(30) for k in range(3)]
    mem.ingest(_batch(rows), 1000)
    assert mem.pressure
    early = flusher.flush_due(now=501.0)
    assert early and not mem.pressure
    assert meta.read_checkpoints(ds.ref, 0)[early[0].group] == 1000
    meta.close()
    column.close()


def test_flusher_rejects_chunks_longer_than_the_store_allows(tmp_path: Path) -> None:
    meta, column = open_sqlite_stores(tmp_path / "x.db", max_chunk_span_ms=1_000)
    mem = ShardMemstore(_dataset(), 0, chunk_span_ms=2_000)
    with pytest.raises(ValueError, match="max_chunk_span_ms"):
        Flusher(mem, column, meta, DatasetRef(name="x"), 0, 1)
    meta.close()
    column.close()


def test_flush_due_rides_out_a_locked_store_with_backoff_then_catches_up(tmp_path: Path) -> None:
    """A real SQLite write lock held by another connection: flush_due never raises, counts each
    failed try, backs off (1, 2, 4, 4 s), and the first try after the lock is gone flushes and
    checkpoints every group at once."""
    path = tmp_path / "f.db"
    meta, column = open_sqlite_stores(
        path, busy_timeout_s=0.05, max_chunk_span_ms=MAX_CHUNK_SPAN_MS
    )
    ds = _dataset()
    meta.create_dataset(ds)
    epoch = meta.claim_epoch(ds.ref, SHARD, "n1")
    mem = ShardMemstore(
        ds, SHARD, groups_per_shard=GROUPS, max_chunk_samples=MAX_CHUNK, chunk_span_ms=SPAN
    )
    now = [0.0]
    flusher = Flusher(
        mem,
        column,
        meta,
        ds.ref,
        SHARD,
        epoch,
        flush_interval_s=3.0,
        clock=lambda: now[0],
        retry_initial_s=1.0,
        retry_max_s=4.0,
    )
    stream = make_stream(random.Random(9), messages=12, series=6, per_message=8)
    for off in range(6):
        mem.ingest(stream[off], off)
    assert flusher.flush_due() == []  # t=0: the first group is due at t=1
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        tries = []
        for t in [1.0, 1.5, 2.0, 3.0, 4.0, 7.0, 8.0, 11.0, 12.0]:
            now[0] = t
            assert flusher.flush_due() == []
            tries.append(flusher.totals().failures)
        assert tries == [1, 1, 2, 2, 3, 3, 4, 4, 5]  # retries at 1, 2, 4, 8, 12: backoff capped
        assert flusher.store_error is not None and "locked" in flusher.store_error
        assert flusher.seconds_until_due() == 4.0
        for off in range(6, 12):  # ingestion goes on meanwhile
            mem.ingest(stream[off], off)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    now[0] = 16.0
    done = flusher.flush_due()
    # The catch-up round: the failed group's pending seal, the others, then the failed group's
    # samples that came in since.
    assert [r.group for r in done] == [0, 1, 2, 0]
    assert flusher.store_error is None and flusher.outages == 1
    assert meta.read_checkpoints(ds.ref, SHARD) == dict.fromkeys(range(GROUPS), 11)
    assert mem.unflushed_samples() == 0
    # durable: what a new owner recovers from the store (chunks + open-buffer snapshots),
    # with nothing left to replay, is exactly the stream
    again = Node.start_up((meta, column), ds, produced=12)
    assert (again.start, again.replay_until) == (12, -1)
    assert_exact(column, ds.ref, expected_samples(stream), again.mem)
    meta.close()


# ------------------------------------------------------------------- large chunks, short replay


def test_frequent_flushes_write_full_chunks_and_a_crash_replays_one_interval(
    stores: Stores,
) -> None:
    """15 s scrapes flushed after every scrape: stored chunks are still full (120 samples),
    the rest is in the open-buffer snapshot, and a crash replays only what came after the last
    flush; the recovered node goes on filling the same open chunk."""
    meta, column = stores
    ds = _dataset()
    labels = [{"_metric_": "cpu", "_ws_": "w", "_ns_": "n", "pod": f"p{i}"} for i in range(3)]
    t0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000  # a bucket's start

    def scrape(k: int) -> SampleBatch:
        return SampleBatch(
            labels, np.arange(3, dtype=np.int32), np.full(3, t0 + 15_000 * k), np.full(3, k * 0.5)
        )

    def node(produced: int) -> tuple[ShardMemstore, Flusher, int]:
        epoch = meta.claim_epoch(ds.ref, SHARD, "test")
        mem = ShardMemstore(ds, SHARD, groups_per_shard=1, max_chunk_samples=120)
        plan = recover_shard(mem, meta, column, ds.ref, SHARD, produced)
        flusher = Flusher(mem, column, meta, ds.ref, SHARD, epoch, checkpoints=plan.checkpoints)
        return mem, flusher, 0 if plan.start_offset is None else plan.start_offset

    stream = [scrape(k) for k in range(300)]
    mem, flusher, start = node(0)
    for off in range(0, 200):
        mem.ingest(stream[off], off)
        flusher.flush_group(0)
    for off in range(200, 205):  # after the last flush: lost with the crash, replayed
        mem.ingest(stream[off], off)
    keys = [r.part_key for r in column.list_part_keys(ds.ref, SHARD)]
    chunks = column.read_chunks(ds.ref, SHARD, keys, INT64_MIN, INT64_MAX)
    assert sorted(len(cs) for cs in chunks.values()) == [1, 1, 1]
    assert {c.num_samples for cs in chunks.values() for c in cs} == {120}
    assert mem.unflushed_samples() == 3 * 5
    del mem, flusher  # the crash

    mem, flusher, start = node(205)
    assert start == 200  # one flush interval (here: one message) to replay, not 80 scrapes
    assert mem.unflushed_samples() == 0 and mem.memory_samples() == 3 * 80
    for off in range(start, 300):
        mem.ingest(stream[off], off)
        flusher.flush_group(0)
    flusher.flush_all()
    chunks = column.read_chunks(ds.ref, SHARD, keys, INT64_MIN, INT64_MAX)
    assert {tuple(c.num_samples for c in cs) for cs in chunks.values()} == {(120, 120, 60)}
    want = expected_samples(stream)
    assert_exact_any_chunk_size(column, ds.ref, want)


def assert_exact_any_chunk_size(
    column: ColumnStore, ref: DatasetRef, want: dict[str, tuple[np.ndarray, np.ndarray]]
) -> None:
    keys = [r.part_key for r in column.list_part_keys(ref, SHARD)]
    found = column.read_chunks(ref, SHARD, keys, INT64_MIN, INT64_MAX)
    assert sorted(found) == sorted(want)
    for key, chunks in found.items():
        parts = [c.samples() for c in chunks]
        got = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        assert _same(got, want[key]), key


def test_idle_groups_flush_without_deleting_anything(stores: Stores) -> None:
    """Snapshots are dropped only when the store may hold some: a group with nothing open
    flushes again and again without a delete (on Cassandra each would be a tombstone)."""
    ds = _dataset()
    node = Node.start_up(stores, ds, produced=0)
    drops: list[tuple[int, int]] = []
    inner_drop = node.column.inner.drop_open_snapshots

    def counting_drop(ref: DatasetRef, shard: int, group: int, below: int) -> None:
        drops.append((group, below))
        inner_drop(ref, shard, group, below)

    node.column.drop_open_snapshots = counting_drop  # type: ignore[method-assign]
    stream = make_stream(random.Random(5), messages=6, series=4, per_message=5)
    node.run(stream, 6, 0)
    node.flusher.flush_all()  # everything sealed, nothing open: no snapshot was ever written
    for off in range(6, 12):  # messages of other series only advance the watermarks
        node.mem.ingest(SampleBatch.empty(), off)
        node.flusher.flush_all()
    assert drops == []
    for g, offset in stores[0].read_checkpoints(ds.ref, SHARD).items():
        assert offset == 11 and stores[1].read_open_snapshot(ds.ref, SHARD, g, offset) is None
