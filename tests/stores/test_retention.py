"""Retention, run unchanged against SQLite and the real Cassandra node (the contract), then what
each backend does to free the space: SQLite drops whole time buckets (and its file stops
growing), Cassandra writes TTLs and compacts by time window."""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from core.dataset import DatasetRef
from core.errors import Invalid, Unsupported
from store import (
    INT64_MAX,
    INT64_MIN,
    ChunkRecord,
    ColumnStore,
    MetaStore,
    PartKeyRecord,
    encode_part_key,
)
from store.sqlite import LEGACY_CHUNKS, SqliteColumnStore, open_sqlite_stores

from .support import Opener

NOW = 1_700_000_000_000
HOUR = 3_600_000
STEP = 15_000


def _key(i: int) -> str:
    return encode_part_key({"__name__": "cpu", "host": f"h{i}"})


def _chunk(key: str, end: int, n: int = 20, seed: int = 0) -> ChunkRecord:
    """A chunk whose last sample is at `end`."""
    ts = end - (n - 1 - np.arange(n, dtype=np.int64)) * STEP
    values = np.random.default_rng(seed).normal(50, 5, n)
    return ChunkRecord.from_samples(key, ts, values)


def _ends(column: ColumnStore, ref: DatasetRef, keys: list[str]) -> dict[str, list[int]]:
    found = column.read_chunks(ref, 0, keys, INT64_MIN, INT64_MAX)
    return {k: [c.end_time for c in cs] for k, cs in found.items()}


def _at(column: ColumnStore, now: int) -> None:
    column.clock = lambda: now


# ------------------------------------------------------------------------------------ contract


def test_retention_record_set_get_clear(meta: MetaStore, column: ColumnStore, ref: DatasetRef):
    assert meta.get_retention(ref) is None
    assert column.retention_ms(ref) == 0  # no value, no default: forever
    meta.set_retention(ref, 2 * HOUR)
    assert meta.get_retention(ref) == 2 * HOUR
    assert column.retention_ms(ref) == 2 * HOUR
    meta.set_retention(ref, 0)  # an explicit forever beats a cluster default
    column.default_retention_ms = HOUR
    assert (meta.get_retention(ref), column.retention_ms(ref)) == (0, 0)
    meta.set_retention(ref, None)
    assert (meta.get_retention(ref), column.retention_ms(ref)) == (None, HOUR)
    with pytest.raises(Invalid):
        meta.set_retention(ref, -1)


def test_oldest_data_stops_answering_exactly_at_the_boundary(
    meta: MetaStore, column: ColumnStore, ref: DatasetRef
) -> None:
    """Written before the retention was set (so nothing was freed or skipped): a chunk ending
    1 ms before `now - retention` is gone from reads and part-key listings, one ending exactly
    at it stays, and so does everything newer."""
    _at(column, NOW)
    old, edge, new = _key(0), _key(1), _key(2)
    cutoff = NOW - HOUR
    column.write_chunks(
        ref, 0, [_chunk(old, cutoff - 1), _chunk(edge, cutoff), _chunk(new, NOW - 60_000)]
    )
    column.write_part_keys(
        ref,
        0,
        [
            _part(old, cutoff - 1),
            _part(edge, cutoff),
            _part(new, NOW - 60_000),
        ],
    )
    keys = [old, edge, new]
    assert set(_ends(column, ref, keys)) == set(keys)
    meta.set_retention(ref, HOUR)
    assert _ends(column, ref, keys) == {edge: [cutoff], new: [NOW - 60_000]}
    assert [r.part_key for r in column.list_part_keys(ref, 0)] == sorted([edge, new])
    # A range wholly before the cutoff answers nothing; one ending at it answers the edge.
    assert column.read_chunks(ref, 0, keys, INT64_MIN, cutoff - 1) == {}
    assert list(column.read_chunks(ref, 0, keys, INT64_MIN, cutoff)) == [edge]
    assert column.list_part_keys(ref, 0, INT64_MIN, cutoff - 1) == []
    # One millisecond later the edge is past retention too.
    _at(column, NOW + 1)
    assert list(_ends(column, ref, keys)) == [new]


def _part(key: str, end: int) -> PartKeyRecord:
    return PartKeyRecord(key, end - HOUR, end)


def test_data_past_retention_is_not_written(
    meta: MetaStore, column: ColumnStore, ref: DatasetRef
) -> None:
    _at(column, NOW)
    meta.set_retention(ref, HOUR)
    late, fresh = _key(0), _key(1)
    column.write_chunks(ref, 0, [_chunk(late, NOW - HOUR - 1), _chunk(fresh, NOW)])
    column.write_part_keys(ref, 0, [_part(late, NOW - HOUR - 1), _part(fresh, NOW)])
    meta.set_retention(ref, 0)  # forever: whatever was written answers again
    assert list(_ends(column, ref, [late, fresh])) == [fresh]
    assert [r.part_key for r in column.list_part_keys(ref, 0)] == [fresh]


def test_a_change_of_retention_takes_effect_on_reads_at_once(
    meta: MetaStore, column: ColumnStore, ref: DatasetRef
) -> None:
    """Shorter hides older data at once; longer (before a sweep freed it) shows it again; the
    cluster default applies to a dataset without its own value."""
    _at(column, NOW)
    keys = [_key(i) for i in range(4)]
    column.write_chunks(ref, 0, [_chunk(k, NOW - i * HOUR) for i, k in enumerate(keys)])
    assert len(_ends(column, ref, keys)) == 4
    meta.set_retention(ref, 90 * 60_000)
    assert sorted(_ends(column, ref, keys)) == sorted(keys[:2])
    meta.set_retention(ref, 150 * 60_000)
    assert sorted(_ends(column, ref, keys)) == sorted(keys[:3])
    meta.set_retention(ref, None)
    column.default_retention_ms = 30 * 60_000
    assert list(_ends(column, ref, keys)) == [keys[0]]


def test_bytes_stored_are_counted_at_write(column: ColumnStore, ref: DatasetRef) -> None:
    _at(column, NOW)
    chunks = [_chunk(_key(i), NOW - i * 60_000, seed=i) for i in range(30)]
    column.write_chunks(ref, 0, chunks[:10])
    column.write_chunks(ref, 1, chunks[10:])
    stored = column.stored_bytes(ref)
    assert stored.bytes == sum(len(c.data) for c in chunks)
    assert stored.chunks == 30
    assert sum(b for _, b in stored.buckets) == stored.bytes
    assert column.stored_bytes(DatasetRef(name=ref.name + "x")).bytes == 0


def test_sweep_frees_what_is_past_retention_and_keeps_the_rest(
    open_backend: Opener, ref: DatasetRef
) -> None:
    """Days of data, a retention of two days: a sweep (two at once, from two clients) forgets
    the byte counts of the days past retention, every chunk still within it still answers, and
    a second sweep finds nothing more. (The first client sets the retention: another process's
    Cassandra client sees a change within seconds, its own at once.)"""
    meta, first = open_backend()
    columns = [first, open_backend()[1]]
    day = 86_400_000
    now = NOW - NOW % day + day // 2
    for c in columns:
        _at(c, now)
    column = columns[0]
    keys = [_key(i) for i in range(6)]
    column.write_chunks(ref, 0, [_chunk(k, now - i * day) for i, k in enumerate(keys)])
    before = column.stored_bytes(ref)
    meta.set_retention(ref, 2 * day)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: c.sweep(ref), columns))
    dropped = sum(r.buckets_dropped for r in results)
    assert dropped >= 1
    after = column.stored_bytes(ref)
    assert after.bytes < before.bytes
    assert max(r.bytes_freed for r in results) == before.bytes - after.bytes
    assert sorted(_ends(column, ref, keys)) == sorted(keys[:3])
    assert column.sweep(ref).buckets_dropped == 0  # idempotent
    meta.set_retention(ref, 0)
    assert column.sweep(ref).buckets_dropped == 0  # kept forever: nothing to sweep


# -------------------------------------------------------------------------------------- SQLite


def _sqlite_tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as c:
        return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_sqlite_drops_whole_buckets_and_rewrites_count_once(tmp_path: Path) -> None:
    path = tmp_path / "filopy.db"
    meta, column = open_sqlite_stores(path, bucket_ms=HOUR)
    ref = DatasetRef(name="ds")
    try:
        _at(column, NOW)
        keys = [_key(i) for i in range(5)]
        chunks = [_chunk(k, NOW - i * HOUR - 1) for i, k in enumerate(keys)]
        column.write_chunks(ref, 0, chunks)
        column.write_chunks(ref, 0, chunks[:2])  # a replay's rewrite: replaced, counted once
        assert column.stored_bytes(ref).bytes == sum(len(c.data) for c in chunks)
        buckets = {t for t in _sqlite_tables(path) if t.startswith("chunks_")}
        assert len(buckets) == len(column.stored_bytes(ref).buckets) >= 5
        meta.set_retention(ref, 2 * HOUR)
        swept = column.sweep(ref)
        left = {t for t in _sqlite_tables(path) if t.startswith("chunks_")}
        assert len(left) == len(buckets) - swept.buckets_dropped < len(buckets)
        assert column.stored_bytes(ref).buckets == tuple(
            (b, n) for b, n in column.stored_bytes(ref).buckets if b >= NOW - 4 * HOUR
        )
        assert sorted(_ends(column, ref, keys)) == sorted(keys[:2])
    finally:
        meta.close()
        column.close()


def _fill(column: SqliteColumnStore, ref: DatasetRef, buckets: int, series: int) -> list[int]:
    """Steady writes, a bucket's worth at a time, a sweep after each; the file size after each."""
    path = column._db.path
    sizes = []
    for b in range(buckets):
        now = NOW + (b + 1) * column.bucket_ms
        _at(column, now)
        column.write_chunks(
            ref,
            0,
            [_chunk(_key(i), now - 1, n=60, seed=b * series + i) for i in range(series)],
        )
        column.sweep(ref)
        column._db.conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the WAL into the file
        sizes.append(path.stat().st_size)
    return sizes


def test_sqlite_file_stops_growing_under_steady_writes(tmp_path: Path) -> None:
    """The same writes with and without a retention of three buckets: without, the file grows
    with every bucket; with, it stops growing once the first buckets are past retention (their
    pages are reused, or given back: a new file uses incremental auto-vacuum)."""
    ref = DatasetRef(name="steady")
    runs = {}
    for retention in (0, 3 * 60_000):
        meta, column = open_sqlite_stores(tmp_path / f"r{retention}.db", bucket_ms=60_000)
        try:
            meta.set_retention(ref, retention)
            runs[retention] = _fill(column, ref, buckets=30, series=40)
        finally:
            meta.close()
            column.close()
    kept, bounded = runs[0], runs[3 * 60_000]
    assert kept[-1] > 3 * kept[5]  # keeps growing, a bucket's worth at a time
    assert max(bounded[10:]) <= max(bounded[:10])  # flat after the first buckets expired
    assert bounded[-1] * 3 < kept[-1]


def test_a_sqlite_file_with_the_old_chunks_table_reads_and_expires_it(tmp_path: Path) -> None:
    """A version-2 file keeps its single chunks table: it is read as one more bucket, a rewrite
    of one of its chunks wins over it, its bytes are counted, and a sweep drops it once its
    data is past retention."""
    path = tmp_path / "filopy.db"
    ref = DatasetRef(name="old")
    old = _chunk(_key(0), NOW - 3 * HOUR)
    with sqlite3.connect(path) as c:
        c.execute(
            "CREATE TABLE chunks (dataset TEXT NOT NULL, shard INTEGER NOT NULL, "
            "part_key TEXT NOT NULL, start_time INTEGER NOT NULL, end_time INTEGER NOT NULL, "
            "num_samples INTEGER NOT NULL, data BLOB NOT NULL, "
            "PRIMARY KEY (dataset, shard, part_key, start_time)) WITHOUT ROWID"
        )
        c.execute(
            "INSERT INTO chunks VALUES (?, 0, ?, ?, ?, ?, ?)",
            (ref.name, old.part_key, old.start_time, old.end_time, old.num_samples, old.data),
        )
        c.execute("PRAGMA user_version = 2")
    meta, column = open_sqlite_stores(path, bucket_ms=HOUR)
    try:
        _at(column, NOW)
        assert _ends(column, ref, [old.part_key]) == {old.part_key: [old.end_time]}
        assert column.stored_bytes(ref).bytes == len(old.data)
        fresh = _chunk(_key(1), NOW)
        column.write_chunks(ref, 0, [fresh])
        assert set(_ends(column, ref, [old.part_key, fresh.part_key])) == {
            old.part_key,
            fresh.part_key,
        }
        meta.set_retention(ref, HOUR)
        assert column.sweep(ref).buckets_dropped == 1
        assert LEGACY_CHUNKS not in _sqlite_tables(path)
        assert column.stored_bytes(ref).bytes == len(fresh.data)
    finally:
        meta.close()
        column.close()


def test_sqlite_size_limit_drops_the_oldest_buckets_first(tmp_path: Path) -> None:
    """With no retention, a size limit: the sweep drops whole buckets, oldest first, until the
    dataset holds at most the limit, and never the newest bucket, even alone over it."""
    meta, column = open_sqlite_stores(tmp_path / "filopy.db", bucket_ms=HOUR)
    ref = DatasetRef(name="sized")
    try:
        _at(column, NOW)
        chunks = [_chunk(_key(i), NOW - i * HOUR - 1, seed=i) for i in range(6)]
        column.write_chunks(ref, 0, chunks)
        sizes = [len(c.data) for c in chunks]  # newest first
        assert meta.get_size_limit(ref) is None
        assert column.sweep(ref).size_buckets_dropped == 0
        meta.set_size_limit(ref, sum(sizes[:3]))
        assert meta.get_size_limit(ref) == sum(sizes[:3])
        swept = column.sweep(ref)
        assert (swept.size_buckets_dropped, swept.size_bytes_freed) == (3, sum(sizes[3:]))
        assert column.stored_bytes(ref).bytes == sum(sizes[:3])
        keys = [c.part_key for c in chunks]
        assert sorted(_ends(column, ref, keys)) == sorted(keys[:3])
        assert column.sweep(ref).size_buckets_dropped == 0  # within the limit: idempotent
        meta.set_size_limit(ref, 1)  # smaller than the newest bucket alone: it stays
        assert column.sweep(ref).size_buckets_dropped == 2
        assert list(_ends(column, ref, keys)) == [keys[0]]
        meta.set_size_limit(ref, None)
        assert meta.get_size_limit(ref) is None
        with pytest.raises(Invalid):
            meta.set_size_limit(ref, 0)
    finally:
        meta.close()
        column.close()


# ----------------------------------------------------------------------------------- Cassandra


@pytest.mark.cassandra
def test_cassandra_refuses_a_size_limit(
    cassandra_address: tuple[str, int], cassandra_keyspace: str
) -> None:
    """Not enforced there (rows expire by TTL), so not accepted either: an operator is told."""
    from store.cassandra import open_cassandra_stores

    host, port = cassandra_address
    meta, column = open_cassandra_stores([host], port, cassandra_keyspace)
    ref = DatasetRef(name="sized")
    try:
        with pytest.raises(Unsupported, match="retention instead"):
            meta.set_size_limit(ref, 1 << 30)
        meta.set_size_limit(ref, None)
        assert meta.get_size_limit(ref) is None
    finally:
        meta.close()
        column.close()


@pytest.mark.cassandra
def test_cassandra_writes_ttls_from_the_chunk_end_and_compacts_by_time_window(
    cassandra_address: tuple[str, int], cassandra_keyspace: str
) -> None:
    from store.cassandra import open_cassandra_stores

    host, port = cassandra_address
    meta, column = open_cassandra_stores([host], port, cassandra_keyspace)
    ref = DatasetRef(name=f"ttl_{time.time_ns()}")
    try:
        meta.set_retention(ref, 2 * HOUR)
        now = int(time.time() * 1000)
        chunk = _chunk(_key(0), now - HOUR)
        column.write_chunks(ref, 0, [chunk])
        column.write_part_keys(ref, 0, [_part(chunk.part_key, chunk.end_time)])
        session = meta._conn.session
        ttl = session.execute(
            f"SELECT TTL(data) FROM {cassandra_keyspace}.chunks "
            "WHERE dataset = %s AND shard = 0 AND part_key = %s",
            (ref.name, chunk.part_key),
        ).one()[0]
        assert HOUR / 1000 - 60 <= ttl <= HOUR / 1000 + 1  # expires when it leaves retention
        ttl = session.execute(
            f"SELECT TTL(end_time) FROM {cassandra_keyspace}.part_keys "
            "WHERE dataset = %s AND shard = 0 AND part_key = %s",
            (ref.name, chunk.part_key),
        ).one()[0]
        assert HOUR / 1000 - 60 <= ttl <= HOUR / 1000 + 1
        compaction = session.execute(
            "SELECT compaction FROM system_schema.tables "
            "WHERE keyspace_name = %s AND table_name = 'chunks'",
            (cassandra_keyspace,),
        ).one()[0]
        assert compaction["class"].endswith("TimeWindowCompactionStrategy")
        # A keyspace from before retention (size-tiered) gets time windows when opened.
        session.execute(
            f"ALTER TABLE {cassandra_keyspace}.chunks WITH compaction = "
            "{'class': 'SizeTieredCompactionStrategy'}"
        )
        again = open_cassandra_stores([host], port, cassandra_keyspace)
        for store in again:
            store.close()
        compaction = session.execute(
            "SELECT compaction FROM system_schema.tables "
            "WHERE keyspace_name = %s AND table_name = 'chunks'",
            (cassandra_keyspace,),
        ).one()[0]
        assert compaction["class"].endswith("TimeWindowCompactionStrategy")
    finally:
        meta.close()
        column.close()
