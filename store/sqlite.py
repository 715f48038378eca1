"""The embedded backend: MetaStore and ColumnStore in one SQLite file.

One connection per thread (SQLite connections must not be used concurrently), WAL journal so
readers never block the writer, and every write in a `BEGIN IMMEDIATE` transaction: the write lock
is taken up front, so the epoch check and the checkpoint update cannot interleave with another
writer's, the same serialisation Cassandra's Paxos gives the other backend. Writers wait for the
lock up to `busy_timeout_s`, then fail with StoreTimeout.

`synchronous=NORMAL` in WAL mode may lose the last transactions on power loss but never reorders
them, so a surviving checkpoint always has its chunks (written in earlier transactions) with it.

Chunks live in one table per (dataset, time bucket of their start time), listed in
`chunk_buckets` with the bytes, chunks and latest end time written to each. Retention drops a
whole bucket (DROP TABLE) once its latest chunk ended before the cutoff, never deleting rows one
by one from a big table: the freed pages are reused by later writes, so under steady ingestion
the file stops growing, and a file created with `auto_vacuum=INCREMENTAL` also gives them back
to the file system. A file from before the buckets keeps its single `chunks` table, read as one
more bucket per dataset (no copy at upgrade) and dropped once no dataset has data left in it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.auth import Token
from core.dataset import Dataset
from store.api import (
    DEFAULT_MAX_CHUNK_SPAN_MS,
    INT64_MIN,
    ChunkRecord,
    ColumnStore,
    DatasetConflict,
    HoldsShared,
    MetaStore,
    OwnershipChange,
    PartKeyRecord,
    ShardEpoch,
    SharedHandle,
    StaleEpochError,
    StoredBytes,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
    SweepResult,
    TokenConflict,
)

# 2 added open_snapshots; a version-1 file is upgraded in place. The tokens table came later with
# no new version: a FiloPy from before it has no access control and never reads it, so it may
# still open the file (a version would lock it out for nothing). 3 moved chunks into time
# buckets (an older FiloPy would neither read nor expire them): the old `chunks` table is listed
# as one more bucket on upgrade.
SCHEMA_VERSION = 3
LEGACY_CHUNKS = "chunks"
DEFAULT_BUCKET_MS = 86_400_000
_IN_LIST = 500  # part keys per `IN (...)` query

SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets (
    name TEXT PRIMARY KEY,
    definition TEXT NOT NULL            -- Dataset.to_json()
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shard_epochs (
    dataset TEXT NOT NULL,
    shard INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    owner TEXT NOT NULL,
    PRIMARY KEY (dataset, shard)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    dataset TEXT NOT NULL,
    shard INTEGER NOT NULL,
    flush_group INTEGER NOT NULL,
    checkpoint INTEGER NOT NULL,        -- last Kafka offset safely in the chunks table
    PRIMARY KEY (dataset, shard, flush_group)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS part_keys (
    dataset TEXT NOT NULL,
    shard INTEGER NOT NULL,
    part_key TEXT NOT NULL,             -- canonical labels JSON
    start_time INTEGER NOT NULL,
    end_time INTEGER NOT NULL,
    PRIMARY KEY (dataset, shard, part_key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chunk_buckets (
    dataset TEXT NOT NULL,
    tbl TEXT NOT NULL,                  -- the bucket's chunks table (BUCKET_TABLE)
    bucket_start INTEGER NOT NULL,      -- chunks whose start_time is in [bucket_start, bucket_end)
    bucket_end INTEGER NOT NULL,
    bytes INTEGER NOT NULL,             -- encoded chunk bytes, maintained at write
    chunks INTEGER NOT NULL,
    max_end INTEGER NOT NULL,           -- the latest end_time written to it
    PRIMARY KEY (dataset, tbl)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS retention (
    dataset TEXT PRIMARY KEY,
    retention_ms INTEGER NOT NULL       -- 0: forever
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS size_limits (
    dataset TEXT PRIMARY KEY,
    max_bytes INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS open_snapshots (
    dataset TEXT NOT NULL,
    shard INTEGER NOT NULL,
    flush_group INTEGER NOT NULL,
    offset INTEGER NOT NULL,            -- the checkpoint it belongs to
    epoch INTEGER NOT NULL,             -- the owner that wrote it
    data BLOB NOT NULL,                 -- ingest/open_buffers.py
    PRIMARY KEY (dataset, shard, flush_group, offset, epoch)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ownership_history (
    dataset TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    shard INTEGER NOT NULL,
    to_node TEXT NOT NULL,              -- '' for none
    from_node TEXT NOT NULL,            -- '' for none
    reason TEXT NOT NULL,
    epoch INTEGER,
    replayed_offsets INTEGER,
    PRIMARY KEY (dataset, at_ms, shard, to_node)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    scopes TEXT NOT NULL,               -- JSON list, sorted
    secret_sha256 TEXT NOT NULL,        -- hex (the secret itself is never stored)
    created_ms INTEGER NOT NULL,
    datasets TEXT NOT NULL,             -- JSON list in the token's order, [] for every dataset
    tenant TEXT,                        -- NULL: any
    revoked_ms INTEGER                  -- NULL: not revoked
) WITHOUT ROWID;
"""

# One per (dataset, bucket); the dataset is in the name (hashed: any name is a safe identifier).
BUCKET_TABLE = """
CREATE TABLE IF NOT EXISTS "{tbl}" (
    shard INTEGER NOT NULL,
    part_key TEXT NOT NULL,
    start_time INTEGER NOT NULL,        -- the chunk id
    end_time INTEGER NOT NULL,
    num_samples INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (shard, part_key, start_time)
) WITHOUT ROWID
"""
# A write counts every chunk it writes as new; a rewrite (replay after a crash) replaced one, so
# it takes the replaced chunk back out of the counts, which stay exact without reading first.
BUCKET_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS "{tbl}_rewrite" AFTER UPDATE ON "{tbl}" BEGIN
    UPDATE chunk_buckets SET bytes = bytes - length(OLD.data), chunks = chunks - 1
    WHERE dataset = {dataset} AND tbl = '{tbl}';
END
"""


def _bucket_table(name: str, bucket_start: int) -> str:
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]
    return f"chunks_{digest}_{bucket_start}".replace("-", "m")


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


_TOKEN_COLUMNS = "id, name, scopes, secret_sha256, created_ms, datasets, tenant, revoked_ms"


def _token_row(t: Token) -> tuple[object, ...]:
    return (
        t.id,
        t.name,
        json.dumps(sorted(t.scopes)),
        t.secret_sha256,
        t.created_ms,
        json.dumps(list(t.datasets), ensure_ascii=False),
        t.tenant,
        t.revoked_ms,
    )


def _token(row: tuple[Any, ...]) -> Token:
    tid, name, scopes, digest, created, datasets, tenant, revoked = row
    return Token(
        id=tid,
        name=name,
        scopes=frozenset(json.loads(scopes)),
        secret_sha256=digest,
        created_ms=created,
        datasets=tuple(json.loads(datasets)),
        tenant=tenant,
        revoked_ms=revoked,
    )


class SqliteDatabase(SharedHandle):
    """The shared file: per-thread connections, schema creation, transactions.

    Reference-counted so that the MetaStore and ColumnStore opened on it close it together."""

    def __init__(self, path: str | Path, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: list[sqlite3.Connection] = []
        self._closed = False
        super().__init__()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = self.conn()
            # Takes effect only on a new file (before its first table): freed pages can then be
            # given back (`incremental_vacuum` after a sweep); an older file reuses them.
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            if conn.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() != "wal":
                raise StoreError(f"SQLite file {self.path} cannot use WAL journal mode")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, 1, 2, SCHEMA_VERSION):  # older ones are upgraded below
                raise StoreError(
                    f"SQLite file {self.path} has schema version {version}; "
                    f"this FiloPy reads version {SCHEMA_VERSION}"
                )
            with self.write() as c:
                for stmt in SCHEMA.split(";"):
                    if stmt.strip():
                        c.execute(stmt)
                if version < 3:
                    self._list_legacy_chunks(c)
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except (sqlite3.Error, OSError) as e:
            self.close()
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {e}") from e
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _list_legacy_chunks(c: sqlite3.Connection) -> None:
        """Upgrade: the single chunks table of an older file becomes one bucket per dataset, its
        counts taken once here (the only scan of it ever)."""
        exists = c.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (LEGACY_CHUNKS,)
        ).fetchone()
        if exists is None:
            return
        c.execute(
            "INSERT OR REPLACE INTO chunk_buckets "
            "(dataset, tbl, bucket_start, bucket_end, bytes, chunks, max_end) "
            "SELECT dataset, ?, min(start_time), max(start_time) + 1, sum(length(data)), "
            f"count(*), max(end_time) FROM {LEGACY_CHUNKS} GROUP BY dataset",
            (LEGACY_CHUNKS,),
        )

    def _shut_down(self) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
        for c in conns:
            c.close()

    def conn(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use."""
        c: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if c is None:
            with self._lock:
                if self._closed:
                    raise StoreUnavailable(f"SQLite store {self.path} is closed")
                c = sqlite3.connect(
                    self.path,
                    timeout=self.busy_timeout_s,
                    isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                    check_same_thread=False,  # only so close() can close every thread's conn
                )
                c.execute("PRAGMA synchronous=NORMAL")
                self._conns.append(c)
            self._local.conn = c
        elif self._closed:
            raise StoreUnavailable(f"SQLite store {self.path} is closed")
        return c

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction holding the database's write lock from its start."""
        with self._translate():
            c = self.conn()
            c.execute("BEGIN IMMEDIATE")
            try:
                yield c
            except BaseException:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: one consistent snapshot for several queries."""
        with self._translate():
            c = self.conn()
            c.execute("BEGIN")
            try:
                yield c
            finally:
                if c.in_transaction:
                    c.execute("COMMIT")

    @contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise StoreTimeout(
                    f"SQLite store {self.path} stayed locked for {self.busy_timeout_s} s: {e}"
                ) from e
            raise StoreError(f"SQLite store {self.path}: {e}") from e
        except sqlite3.Error as e:
            raise StoreError(f"SQLite store {self.path}: {e}") from e


class _UsesDatabase(HoldsShared):
    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db)
        self._db = db


class SqliteMetaStore(_UsesDatabase, MetaStore):
    def _create_dataset(self, dataset: Dataset) -> bool:
        with self._db.write() as c:
            row = c.execute(
                "SELECT definition FROM datasets WHERE name = ?", (dataset.name,)
            ).fetchone()
            if row is None:
                c.execute(
                    "INSERT INTO datasets (name, definition) VALUES (?, ?)",
                    (dataset.name, dataset.to_json()),
                )
                return True
        existing = Dataset.from_json(row[0])
        if existing != dataset:
            raise DatasetConflict(existing, dataset)
        return False

    def _get_dataset(self, name: str) -> Dataset | None:
        with self._db.read() as c:
            row = c.execute("SELECT definition FROM datasets WHERE name = ?", (name,)).fetchone()
        return None if row is None else Dataset.from_json(row[0])

    def _list_datasets(self) -> list[Dataset]:
        with self._db.read() as c:
            rows = c.execute("SELECT definition FROM datasets").fetchall()
        return [Dataset.from_json(r[0]) for r in rows]

    def _delete_dataset(self, name: str) -> bool:
        with self._db.write() as c:
            return c.execute("DELETE FROM datasets WHERE name = ?", (name,)).rowcount > 0

    def _claim_epoch(self, name: str, shard: int, owner: str) -> int:
        with self._db.write() as c:
            epoch = self._epoch(c, name, shard) + 1
            c.execute(
                "INSERT INTO shard_epochs (dataset, shard, epoch, owner) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (dataset, shard) DO UPDATE SET epoch = excluded.epoch, "
                "owner = excluded.owner",
                (name, shard, epoch, owner),
            )
        return epoch

    def _record_ownership(self, changes: list[OwnershipChange], retention_ms: int) -> None:
        rows = [
            (
                ch.dataset,
                ch.at_ms,
                ch.shard,
                ch.to_node or "",
                ch.from_node or "",
                ch.reason,
                ch.epoch,
                ch.replayed_offsets,
            )
            for ch in changes
        ]
        with self._db.write() as c:
            c.executemany(
                "INSERT OR REPLACE INTO ownership_history (dataset, at_ms, shard, to_node, "
                "from_node, reason, epoch, replayed_offsets) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            horizon = int(time.time() * 1000) - retention_ms
            for name in {ch.dataset for ch in changes}:
                c.execute(
                    "DELETE FROM ownership_history WHERE dataset = ? AND at_ms < ?",
                    (name, horizon),
                )

    def _ownership_history(self, name: str, shard: int | None, limit: int) -> list[OwnershipChange]:
        where, args = "dataset = ?", [name]
        if shard is not None:
            where, args = where + " AND shard = ?", [name, shard]
        with self._db.read() as c:
            rows = c.execute(
                "SELECT dataset, shard, at_ms, from_node, to_node, reason, epoch, "
                f"replayed_offsets FROM ownership_history WHERE {where} "
                "ORDER BY at_ms DESC, shard DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [
            OwnershipChange(d, sh, at, fr or None, to or None, why, ep, rep)
            for d, sh, at, fr, to, why, ep, rep in rows
        ]

    def _current_epoch(self, name: str, shard: int) -> ShardEpoch:
        with self._db.read() as c:
            row = c.execute(
                "SELECT epoch, owner FROM shard_epochs WHERE dataset = ? AND shard = ?",
                (name, shard),
            ).fetchone()
        return ShardEpoch(0, "") if row is None else ShardEpoch(row[0], row[1])

    def _commit_checkpoint(self, name: str, shard: int, group: int, offset: int, epoch: int) -> int:
        with self._db.write() as c:
            current = self._epoch(c, name, shard)
            if current != epoch:
                raise StaleEpochError(name, shard, epoch, current)
            return c.execute(
                "INSERT INTO checkpoints (dataset, shard, flush_group, checkpoint) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (dataset, shard, flush_group) "
                "DO UPDATE SET checkpoint = max(checkpoint, excluded.checkpoint) "
                "RETURNING checkpoint",
                (name, shard, group, offset),
            ).fetchone()[0]

    def _set_checkpoint(self, name: str, shard: int, group: int, value: int, epoch: int) -> None:
        with self._db.write() as c:
            current = self._epoch(c, name, shard)
            if current != epoch:
                raise StaleEpochError(name, shard, epoch, current)
            c.execute(
                "INSERT OR REPLACE INTO checkpoints (dataset, shard, flush_group, checkpoint) "
                "VALUES (?, ?, ?, ?)",
                (name, shard, group, value),
            )

    def _read_checkpoints(self, name: str, shard: int) -> dict[int, int]:
        with self._db.read() as c:
            rows = c.execute(
                "SELECT flush_group, checkpoint FROM checkpoints WHERE dataset = ? AND shard = ?",
                (name, shard),
            ).fetchall()
        return dict(rows)

    def _put_token(self, token: Token) -> None:
        with self._db.write() as c:
            inserted = c.execute(
                f"INSERT OR IGNORE INTO tokens ({_TOKEN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                _token_row(token),
            ).rowcount
        if not inserted:
            raise TokenConflict(f"a token with id {token.id!r} exists already")

    def _get_token(self, token_id: str) -> Token | None:
        with self._db.read() as c:
            row = c.execute(
                f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE id = ?", (token_id,)
            ).fetchone()
        return None if row is None else _token(row)

    def _list_tokens(self) -> list[Token]:
        with self._db.read() as c:
            rows = c.execute(f"SELECT {_TOKEN_COLUMNS} FROM tokens").fetchall()
        return [_token(r) for r in rows]

    def _revoke_token(self, token_id: str, now_ms: int) -> bool:
        with self._db.write() as c:
            return (
                c.execute(
                    "UPDATE tokens SET revoked_ms = ? WHERE id = ? AND revoked_ms IS NULL",
                    (now_ms, token_id),
                ).rowcount
                > 0
            )

    def _set_retention(self, name: str, retention_ms: int | None) -> None:
        with self._db.write() as c:
            if retention_ms is None:
                c.execute("DELETE FROM retention WHERE dataset = ?", (name,))
            else:
                c.execute(
                    "INSERT OR REPLACE INTO retention (dataset, retention_ms) VALUES (?, ?)",
                    (name, retention_ms),
                )

    def _get_retention(self, name: str) -> int | None:
        return _own_retention(self._db, name)

    def _set_size_limit(self, name: str, max_bytes: int | None) -> None:
        with self._db.write() as c:
            if max_bytes is None:
                c.execute("DELETE FROM size_limits WHERE dataset = ?", (name,))
            else:
                c.execute(
                    "INSERT OR REPLACE INTO size_limits (dataset, max_bytes) VALUES (?, ?)",
                    (name, max_bytes),
                )

    def _get_size_limit(self, name: str) -> int | None:
        return _own_size_limit(self._db, name)

    @staticmethod
    def _epoch(c: sqlite3.Connection, name: str, shard: int) -> int:
        row = c.execute(
            "SELECT epoch FROM shard_epochs WHERE dataset = ? AND shard = ?", (name, shard)
        ).fetchone()
        return 0 if row is None else row[0]


def _own_retention(db: SqliteDatabase, name: str) -> int | None:
    with db.read() as c:
        row = c.execute("SELECT retention_ms FROM retention WHERE dataset = ?", (name,)).fetchone()
    return None if row is None else int(row[0])


def _own_size_limit(db: SqliteDatabase, name: str) -> int | None:
    with db.read() as c:
        row = c.execute("SELECT max_bytes FROM size_limits WHERE dataset = ?", (name,)).fetchone()
    return None if row is None else int(row[0])


class SqliteColumnStore(_UsesDatabase, ColumnStore):
    """Chunks in time buckets (module docstring): `bucket_ms` wide by their start time, so a
    bucket is dropped whole by retention; a chunk's bucket never changes, so a rewrite lands on
    the row it replaces."""

    def __init__(
        self,
        db: SqliteDatabase,
        max_chunk_span_ms: int = DEFAULT_MAX_CHUNK_SPAN_MS,
        *,
        default_retention_ms: int = 0,
        bucket_ms: int = DEFAULT_BUCKET_MS,
    ) -> None:
        if bucket_ms <= 0:
            raise ValueError(f"bucket_ms must be positive, got {bucket_ms}")
        ColumnStore.__init__(self, max_chunk_span_ms, default_retention_ms)
        _UsesDatabase.__init__(self, db)
        self.bucket_ms = bucket_ms

    def _own_retention(self, name: str) -> int | None:
        return _own_retention(self._db, name)

    def _own_size_limit(self, name: str) -> int | None:
        return _own_size_limit(self._db, name)

    def _limit_size(self, name: str, max_bytes: int) -> tuple[int, int]:
        with self._db.write() as c:
            rows = c.execute(
                "SELECT tbl, bytes FROM chunk_buckets WHERE dataset = ? ORDER BY bucket_start",
                (name,),
            ).fetchall()
            total = sum(b for _, b in rows)
            gone: list[tuple[str, int]] = []
            for tbl, size in rows[:-1]:  # never the newest: it is being written
                if total <= max_bytes:
                    break
                gone.append((tbl, size))
                total -= size
            self._drop_buckets(c, name, [t for t, _ in gone])
        return len(gone), sum(b for _, b in gone)

    @staticmethod
    def _drop_buckets(c: sqlite3.Connection, name: str, tables: list[str]) -> None:
        """Forget the dataset's buckets; drop each table once no dataset lists it (the legacy
        one is shared). Then give the pages back if the file allows it."""
        for tbl in tables:
            c.execute("DELETE FROM chunk_buckets WHERE dataset = ? AND tbl = ?", (name, tbl))
            left = c.execute("SELECT 1 FROM chunk_buckets WHERE tbl = ?", (tbl,)).fetchone()
            if left is None:
                c.execute(f'DROP TABLE IF EXISTS "{tbl}"')
        if tables:
            c.execute("PRAGMA incremental_vacuum")  # a no-op unless auto_vacuum is on

    def _bucket(self, c: sqlite3.Connection, name: str, bucket_start: int) -> str:
        """The bucket's table, created (with its catalog row) if this is its first chunk."""
        tbl = _bucket_table(name, bucket_start)
        known = c.execute(
            "SELECT 1 FROM chunk_buckets WHERE dataset = ? AND tbl = ?", (name, tbl)
        ).fetchone()
        if known is None:
            c.execute(BUCKET_TABLE.format(tbl=tbl))
            c.execute(BUCKET_TRIGGER.format(tbl=tbl, dataset=_sql_text(name)))
            c.execute(
                "INSERT INTO chunk_buckets "
                "(dataset, tbl, bucket_start, bucket_end, bytes, chunks, max_end) "
                "VALUES (?, ?, ?, ?, 0, 0, ?)",
                (name, tbl, bucket_start, bucket_start + self.bucket_ms, INT64_MIN),
            )
        return tbl

    def _sweep(self, name: str, cutoff: int, part_key_cutoff: int) -> SweepResult:
        with self._db.write() as c:
            gone = c.execute(
                "SELECT tbl, bytes FROM chunk_buckets WHERE dataset = ? AND max_end < ?",
                (name, cutoff),
            ).fetchall()
            self._drop_buckets(c, name, [t for t, _ in gone])
            # Part keys are one row per series, far fewer than chunks: deleted by rows.
            keys = c.execute(
                "DELETE FROM part_keys WHERE dataset = ? AND end_time < ?", (name, part_key_cutoff)
            ).rowcount
        return SweepResult(len(gone), sum(b for _, b in gone), keys)

    def _delete_series(self, name: str, shard: int, part_keys: list[str]) -> int:
        deleted = 0
        with self._db.write() as c:  # one transaction: readers see the series whole or gone
            tables = c.execute(
                "SELECT tbl FROM chunk_buckets WHERE dataset = ?", (name,)
            ).fetchall()
            for i in range(0, len(part_keys), _IN_LIST):
                keys = part_keys[i : i + _IN_LIST]
                marks = ",".join("?" * len(keys))
                for (tbl,) in tables:
                    legacy = tbl == LEGACY_CHUNKS
                    where = "dataset = ? AND shard = ?" if legacy else "shard = ?"
                    args = ((name, shard) if legacy else (shard,)) + tuple(keys)
                    cond = f"{where} AND part_key IN ({marks})"
                    size, n = c.execute(
                        f'SELECT coalesce(sum(length(data)), 0), count(*) FROM "{tbl}" '
                        f"WHERE {cond}",
                        args,
                    ).fetchone()
                    if not n:
                        continue
                    c.execute(f'DELETE FROM "{tbl}" WHERE {cond}', args)
                    c.execute(
                        "UPDATE chunk_buckets SET bytes = bytes - ?, chunks = chunks - ? "
                        "WHERE dataset = ? AND tbl = ?",
                        (size, n, name, tbl),
                    )
                deleted += c.execute(
                    "DELETE FROM part_keys WHERE dataset = ? AND shard = ? "
                    f"AND part_key IN ({marks})",
                    (name, shard, *keys),
                ).rowcount
        return deleted

    def _stored_bytes(self, name: str) -> StoredBytes:
        with self._db.read() as c:
            rows = c.execute(
                "SELECT bucket_start, bytes, chunks FROM chunk_buckets WHERE dataset = ? "
                "ORDER BY bucket_start",
                (name,),
            ).fetchall()
        return StoredBytes(
            sum(r[1] for r in rows), sum(r[2] for r in rows), tuple((r[0], r[1]) for r in rows)
        )

    def _write_part_keys(
        self, name: str, shard: int, records: list[PartKeyRecord], retention_ms: int, now_ms: int
    ) -> None:
        with self._db.write() as c:
            c.executemany(
                "INSERT OR REPLACE INTO part_keys (dataset, shard, part_key, start_time, end_time)"
                " VALUES (?, ?, ?, ?, ?)",
                [(name, shard, r.part_key, r.start_time, r.end_time) for r in records],
            )

    def _list_part_keys(self, name: str, shard: int, start: int, end: int) -> list[PartKeyRecord]:
        with self._db.read() as c:
            rows = c.execute(
                "SELECT part_key, start_time, end_time FROM part_keys "
                "WHERE dataset = ? AND shard = ? AND start_time <= ? AND end_time >= ?",
                (name, shard, end, start),
            ).fetchall()
        return [PartKeyRecord(*r) for r in rows]

    def _write_chunks(
        self, name: str, shard: int, chunks: list[ChunkRecord], retention_ms: int, now_ms: int
    ) -> None:
        by_bucket: dict[int, list[ChunkRecord]] = {}
        for k in chunks:
            by_bucket.setdefault(k.start_time - k.start_time % self.bucket_ms, []).append(k)
        with self._db.write() as c:
            for bucket_start, ks in by_bucket.items():
                tbl = self._bucket(c, name, bucket_start)
                c.executemany(
                    f'INSERT INTO "{tbl}" '
                    "(shard, part_key, start_time, end_time, num_samples, data) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (shard, part_key, start_time) DO UPDATE "
                    "SET end_time = excluded.end_time, num_samples = excluded.num_samples, "
                    "data = excluded.data",
                    [
                        (shard, k.part_key, k.start_time, k.end_time, k.num_samples, k.data)
                        for k in ks
                    ],
                )
                c.execute(
                    "UPDATE chunk_buckets SET bytes = bytes + ?, chunks = chunks + ?, "
                    "max_end = max(max_end, ?) WHERE dataset = ? AND tbl = ?",
                    (
                        sum(len(k.data) for k in ks),
                        len(ks),
                        max(k.end_time for k in ks),
                        name,
                        tbl,
                    ),
                )

    def _read_chunks(
        self, name: str, shard: int, part_keys: list[str], lo: int, start: int, end: int
    ) -> dict[str, list[ChunkRecord]]:
        found: dict[str, dict[int, ChunkRecord]] = {}
        with self._db.read() as c:  # one snapshot: a concurrent sweep drops nothing under it
            tables = c.execute(
                "SELECT tbl FROM chunk_buckets WHERE dataset = ? AND bucket_start <= ? "
                "AND bucket_end > ? AND max_end >= ? ORDER BY tbl = ? DESC",
                (name, end, lo, start, LEGACY_CHUNKS),
            ).fetchall()
            for (tbl,) in tables:  # the legacy table first: a bucket's rewrite of a chunk wins
                legacy = tbl == LEGACY_CHUNKS
                where = "dataset = ? AND shard = ?" if legacy else "shard = ?"
                for i in range(0, len(part_keys), _IN_LIST):
                    keys = part_keys[i : i + _IN_LIST]
                    rows = c.execute(
                        "SELECT part_key, start_time, end_time, num_samples, data "
                        f'FROM "{tbl}" WHERE {where} '
                        f"AND part_key IN ({','.join('?' * len(keys))})"
                        " AND start_time >= ? AND start_time <= ? AND end_time >= ?",
                        ((name, shard) if legacy else (shard,)) + (*keys, lo, end, start),
                    )
                    for r in rows:
                        found.setdefault(r[0], {})[r[1]] = ChunkRecord(*r)
        return {k: list(v.values()) for k, v in found.items()}

    def _write_open_snapshot(
        self, name: str, shard: int, group: int, offset: int, epoch: int, data: bytes
    ) -> None:
        with self._db.write() as c:
            c.execute(
                "INSERT OR REPLACE INTO open_snapshots "
                "(dataset, shard, flush_group, offset, epoch, data) VALUES (?, ?, ?, ?, ?, ?)",
                (name, shard, group, offset, epoch, data),
            )

    def _read_open_snapshot(self, name: str, shard: int, group: int, offset: int) -> bytes | None:
        with self._db.read() as c:
            row = c.execute(
                "SELECT data FROM open_snapshots WHERE dataset = ? AND shard = ? "
                "AND flush_group = ? AND offset = ? ORDER BY epoch DESC LIMIT 1",
                (name, shard, group, offset),
            ).fetchone()
        return None if row is None else bytes(row[0])

    def _drop_open_snapshots(self, name: str, shard: int, group: int, below: int) -> None:
        with self._db.write() as c:
            c.execute(
                "DELETE FROM open_snapshots WHERE dataset = ? AND shard = ? AND flush_group = ? "
                "AND offset < ?",
                (name, shard, group, below),
            )


def open_sqlite_stores(
    path: str | Path,
    *,
    busy_timeout_s: float = 30.0,
    max_chunk_span_ms: int = DEFAULT_MAX_CHUNK_SPAN_MS,
    default_retention_ms: int = 0,
    bucket_ms: int = DEFAULT_BUCKET_MS,
) -> tuple[SqliteMetaStore, SqliteColumnStore]:
    """Open (creating if needed) the SQLite file and return the two stores sharing it."""
    db = SqliteDatabase(path, busy_timeout_s).acquire()  # held while the stores are built
    try:
        meta = SqliteMetaStore(db)
        try:
            column = SqliteColumnStore(
                db,
                max_chunk_span_ms,
                default_retention_ms=default_retention_ms,
                bucket_ms=bucket_ms,
            )
        except BaseException:
            meta.close()
            raise
        return meta, column
    finally:
        db.release()
