"""What only one backend can show: connection failures, lock waits, the settings factory."""

from __future__ import annotations

import socket
import sqlite3
import time
import uuid
from pathlib import Path

import pytest

from core.auth import new_token
from core.config import load_settings
from core.dataset import Dataset, DatasetRef
from store import (
    PartKeyRecord,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
    open_stores,
)
from store.cassandra import CassandraColumnStore, CassandraMetaStore, open_cassandra_stores
from store.sqlite import SCHEMA_VERSION, SqliteColumnStore, SqliteMetaStore, open_sqlite_stores


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_cassandra_fails_fast_naming_where() -> None:
    port = _unused_port()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=rf"127\.0\.0\.1 \(port {port}\)"):
        open_cassandra_stores(["127.0.0.1"], port, "filopy_nowhere", connect_timeout_s=3.0)
    assert time.monotonic() - started < 5.0


@pytest.mark.cassandra
def test_too_few_replicas_is_store_unavailable(cassandra_address: tuple[str, int]) -> None:
    """A keyspace wanting 3 replicas on our single node cannot reach LOCAL_QUORUM."""
    host, port = cassandra_address
    keyspace = f"filopy_rf3_{uuid.uuid4().hex[:10]}"
    meta, column = open_cassandra_stores(
        [host], port, keyspace, {"class": "SimpleStrategy", "replication_factor": "3"}
    )
    ref = DatasetRef(name="rf3")
    try:
        with pytest.raises(StoreUnavailable, match="replicas"):
            meta.claim_epoch(ref, 0)
        with pytest.raises(StoreUnavailable, match="replicas"):
            column.write_part_keys(ref, 0, [PartKeyRecord('{"a":"b"}', 0, 1)])
    finally:
        meta._conn.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
        meta.close()
        column.close()


@pytest.mark.cassandra
def test_open_stores_uses_the_configured_cassandra(
    cassandra_address: tuple[str, int], cassandra_keyspace: str
) -> None:
    host, port = cassandra_address
    base = load_settings()
    settings = base.model_copy(
        update={
            "store": base.store.model_copy(update={"backend": "cassandra"}),
            "cassandra": base.cassandra.model_copy(
                update={"contact_points": (host,), "port": port, "keyspace": cassandra_keyspace}
            ),
        }
    )
    meta, column = open_stores(settings)
    with meta, column:
        assert isinstance(meta, CassandraMetaStore) and isinstance(column, CassandraColumnStore)
        ds = Dataset(name=f"factory_{uuid.uuid4().hex[:8]}", num_shards=2)
        meta.create_dataset(ds)
        assert meta.get_dataset(ds.ref) == ds
    with pytest.raises(StoreUnavailable):
        meta.get_dataset(ds.ref)  # closed with its last store


def test_open_stores_uses_the_configured_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "filopy.db"
    settings = load_settings(store={"backend": "sqlite", "sqlite_path": str(path)})
    meta, column = open_stores(settings)
    assert isinstance(meta, SqliteMetaStore) and isinstance(column, SqliteColumnStore)
    ds = Dataset(name="factory", num_shards=2)
    meta.create_dataset(ds)
    meta.close()
    assert column.list_part_keys(ds.ref, 0) == []  # the file stays open for the other store
    column.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        column.list_part_keys(ds.ref, 0)
    assert path.is_file()
    again, column2 = open_stores(settings)  # reopening finds the schema and the data
    with again, column2:
        assert again.get_dataset(ds.ref) == ds


def test_sqlite_writer_waiting_too_long_for_the_lock_times_out(tmp_path: Path) -> None:
    path = tmp_path / "filopy.db"
    meta, column = open_sqlite_stores(path, busy_timeout_s=0.2)
    ref = DatasetRef(name="locked")
    epoch = meta.claim_epoch(ref, 0)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with pytest.raises(StoreTimeout, match="locked"):
            meta.commit_checkpoint(ref, 0, 0, 5, epoch)
        assert meta.read_checkpoints(ref, 0) == {}  # readers are not blocked (WAL)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert meta.commit_checkpoint(ref, 0, 0, 5, epoch) == 5
    meta.close()
    column.close()


def test_sqlite_file_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "filopy.db"
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="schema version 99"):
        open_sqlite_stores(path)


def test_a_version_1_sqlite_file_is_upgraded_and_keeps_its_data(tmp_path: Path) -> None:
    """Version 2 only added the open-buffer snapshots table: a version-1 file opens, keeps its
    rows, gains the table and says the current version (an older FiloPy then refuses it, as it
    must: it would ignore the snapshots its checkpoints rely on)."""
    path = tmp_path / "filopy.db"
    ref = DatasetRef(name="old")
    meta, column = open_sqlite_stores(path)
    epoch = meta.claim_epoch(ref, 0, "n1")
    meta.commit_checkpoint(ref, 0, 0, 7, epoch)
    meta.close()
    column.close()
    with sqlite3.connect(path) as c:
        c.execute("DROP TABLE open_snapshots")
        c.execute("PRAGMA user_version = 1")
    meta, column = open_sqlite_stores(path)
    try:
        assert meta.read_checkpoints(ref, 0) == {0: 7}
        column.write_open_snapshot(ref, 0, 0, 7, epoch, b"open")
        assert column.read_open_snapshot(ref, 0, 0, 7) == b"open"
    finally:
        meta.close()
        column.close()
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_sqlite_file_from_before_tokens_gains_their_table_on_open(tmp_path: Path) -> None:
    """The tokens table came without a schema version: a file of version 2 without it opens,
    keeps its rows and gains the table (the version it then says is the time buckets' one)."""
    path = tmp_path / "filopy.db"
    ds = Dataset(name="old", num_shards=2)
    meta, column = open_sqlite_stores(path)
    meta.create_dataset(ds)
    meta.close()
    column.close()
    with sqlite3.connect(path) as c:
        c.execute("DROP TABLE tokens")
    meta, column = open_sqlite_stores(path)
    try:
        assert meta.get_dataset(ds.ref) == ds
        token, _ = new_token("after the upgrade", ["admin"], 1_700_000_000_000)
        meta.put_token(token)
        assert meta.get_token(token.id) == token
        assert meta.revoke_token(token.id, 1_700_000_000_001) is True
    finally:
        meta.close()
        column.close()
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
