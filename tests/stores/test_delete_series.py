"""Deleting series (Prometheus' delete_series), run unchanged against SQLite and the real
Cassandra node: part keys, raw chunks in every bucket and downsampled records go; every other
series, shard and dataset stays; bytes stored go down by what left."""

from __future__ import annotations

import numpy as np

from core.dataset import DatasetRef
from store import INT64_MAX, INT64_MIN, ChunkRecord, ColumnStore, PartKeyRecord, encode_part_key

DAY = 86_400_000
STEP = 15_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % DAY
RES = 300_000


def _key(host: str) -> str:
    return encode_part_key({"__name__": "cpu", "host": host})


def _chunks(key: str, day: int) -> ChunkRecord:
    ts = T0 + day * DAY + np.arange(20, dtype=np.int64) * STEP
    return ChunkRecord.from_samples(key, ts, np.arange(20, dtype=np.float64))


def _write(column: ColumnStore, ref: DatasetRef, shard: int, hosts: list[str]) -> None:
    for h in hosts:
        k = _key(h)
        column.write_chunks(ref, shard, [_chunks(k, d) for d in range(3)])  # three buckets
        column.write_part_keys(ref, shard, [PartKeyRecord(k, T0, T0 + 2 * DAY + 19 * STEP)])
        column.write_downsampled(ref, shard, RES, [_chunks(k, 0)])


def _stored(column: ColumnStore, ref: DatasetRef, shard: int) -> dict[str, int]:
    keys = [r.part_key for r in column.list_part_keys(ref, shard)]
    raw = column.read_chunks(ref, shard, [_key(h) for h in "abc"], INT64_MIN, INT64_MAX)
    down = column.read_downsampled(ref, shard, RES, [_key(h) for h in "abc"], INT64_MIN, INT64_MAX)
    return {
        "part_keys": len(keys),
        "chunks": sum(len(v) for v in raw.values()),
        "downsampled": sum(len(v) for v in down.values()),
    }


def test_delete_series_removes_part_keys_chunks_and_periods_of_those_series_only(
    column: ColumnStore, ref: DatasetRef
) -> None:
    column.downsample_retention_ms = {RES: 0}
    other = DatasetRef(name=f"{ref.name}_other")
    _write(column, ref, 0, ["a", "b", "c"])
    _write(column, ref, 1, ["a"])
    _write(column, other, 0, ["a"])
    before = column.stored_bytes(ref)

    assert column.delete_series(ref, 0, [_key("a"), _key("b"), _key("nosuch")]) == 2

    left = column.list_part_keys(ref, 0)
    assert [r.labels["host"] for r in left] == ["c"]
    raw = column.read_chunks(ref, 0, [_key(h) for h in "abc"], INT64_MIN, INT64_MAX)
    assert sorted(raw) == [_key("c")] and len(raw[_key("c")]) == 3
    down = column.read_downsampled(ref, 0, RES, [_key(h) for h in "abc"], INT64_MIN, INT64_MAX)
    assert sorted(down) == [_key("c")]
    # another shard and another dataset keep their series of the same labels
    assert _stored(column, ref, 1) == {"part_keys": 1, "chunks": 3, "downsampled": 1}
    assert _stored(column, other, 0) == {"part_keys": 1, "chunks": 3, "downsampled": 1}
    after = column.stored_bytes(ref)
    gone = sum(len(_chunks(_key(h), d).data) for h in "ab" for d in range(3))
    assert after.bytes == before.bytes - gone
    assert after.chunks == before.chunks - 6

    # idempotent; the series written again afterwards is a new one, alone
    assert column.delete_series(ref, 0, [_key("a")]) == 0
    column.write_chunks(ref, 0, [_chunks(_key("a"), 5)])
    again = column.read_chunks(ref, 0, [_key("a")], INT64_MIN, INT64_MAX)
    assert [c.start_time for c in again[_key("a")]] == [T0 + 5 * DAY]
