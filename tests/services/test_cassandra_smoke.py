"""Cassandra is real: a keyspace and table created, rows written and read back."""

from __future__ import annotations

import uuid

import pytest
from cassandra.cluster import Cluster
from cassandra.concurrent import execute_concurrent_with_args

pytestmark = pytest.mark.cassandra


@pytest.fixture
def session(cassandra_address: tuple[str, int]):
    host, port = cassandra_address
    cluster = Cluster([host], port=port, connect_timeout=10)
    s = cluster.connect()
    keyspace = f"smoke_{uuid.uuid4().hex[:10]}"
    s.execute(
        f"CREATE KEYSPACE {keyspace} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    s.set_keyspace(keyspace)
    yield s
    s.execute(f"DROP KEYSPACE {keyspace}")
    cluster.shutdown()


def test_write_and_read_rows_with_prepared_statements(session) -> None:
    session.execute(
        "CREATE TABLE samples (series text, ts bigint, value double, PRIMARY KEY (series, ts))"
    )
    insert = session.prepare("INSERT INTO samples (series, ts, value) VALUES (?, ?, ?)")
    rows = [(f"s{i % 10}", i, i * 0.5) for i in range(500)]
    results = execute_concurrent_with_args(session, insert, rows, concurrency=50)
    assert all(ok for ok, _ in results)

    select = session.prepare("SELECT ts, value FROM samples WHERE series = ? AND ts >= ?")
    got = list(session.execute(select, ("s3", 100)))
    expected = [(ts, v) for s, ts, v in rows if s == "s3" and ts >= 100]
    assert [(r.ts, r.value) for r in got] == expected
    count = session.execute("SELECT count(*) FROM samples").one()[0]
    assert count == len(rows)
