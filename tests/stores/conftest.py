"""Both backends behind one fixture: a temporary SQLite file, and the real Cassandra node in a
keyspace of its own for this test session (dropped at the end)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from core.dataset import DatasetRef
from store import ColumnStore, MetaStore
from store.cassandra import open_cassandra_stores
from store.sqlite import open_sqlite_stores

from .support import MAX_CHUNK_SPAN_MS, Opener, Stores


@pytest.fixture(scope="session")
def cassandra_keyspace(cassandra_address: tuple[str, int]) -> Iterator[str]:
    keyspace = f"filopy_test_{uuid.uuid4().hex[:12]}"
    yield keyspace
    host, port = cassandra_address
    meta, column = open_cassandra_stores([host], port, keyspace)
    try:
        meta._conn.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
    finally:
        meta.close()
        column.close()


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.cassandra)])
def open_backend(request: pytest.FixtureRequest, tmp_path) -> Iterator[Opener]:
    """Opens store pairs on one backing store; each pair is an independent client (a "node")."""
    opened: list[Stores] = []
    if request.param == "sqlite":
        path = tmp_path / "filopy.db"

        def opener() -> Stores:
            pair = open_sqlite_stores(path, max_chunk_span_ms=MAX_CHUNK_SPAN_MS)
            opened.append(pair)
            return pair
    else:
        host, port = request.getfixturevalue("cassandra_address")
        keyspace = request.getfixturevalue("cassandra_keyspace")

        def opener() -> Stores:
            pair = open_cassandra_stores(
                [host],
                port,
                keyspace,
                max_chunk_span_ms=MAX_CHUNK_SPAN_MS,
                connect_timeout_s=10.0,
                request_timeout_s=10.0,
            )
            opened.append(pair)
            return pair

    yield opener
    for meta, column in opened:
        meta.close()
        column.close()


@pytest.fixture
def stores(open_backend: Opener) -> Stores:
    return open_backend()


@pytest.fixture
def meta(stores: Stores) -> MetaStore:
    return stores[0]


@pytest.fixture
def column(stores: Stores) -> ColumnStore:
    return stores[1]


@pytest.fixture
def ref() -> DatasetRef:
    """A dataset name of the test's own: tests share the session's keyspace."""
    return DatasetRef(name=f"ds_{uuid.uuid4().hex[:12]}")
