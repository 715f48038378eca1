"""The storage contract, run unchanged against SQLite and the real Cassandra node."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from core.auth import Token, new_token
from core.dataset import Dataset, DatasetRef
from core.errors import Invalid
from store import (
    INT64_MAX,
    INT64_MIN,
    ChunkRecord,
    ColumnStore,
    DatasetConflict,
    LabelMatcher,
    MetaStore,
    OwnershipChange,
    PartKeyRecord,
    ShardEpoch,
    StaleEpochError,
    TokenConflict,
    encode_part_key,
)

from .support import MAX_CHUNK_SPAN_MS, Opener

T0 = 1_700_000_000_000
STEP = 15_000


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.uint64)


def _series(i: int) -> str:
    return encode_part_key({"__name__": "http_requests_total", "job": "api", "instance": f"i{i}"})


def _chunk(key: str, start: int, n: int, seed: int = 0) -> ChunkRecord:
    rng = np.random.default_rng(seed)
    ts = start + np.arange(n, dtype=np.int64) * STEP + rng.integers(-20, 21, n) * (np.arange(n) > 0)
    values = np.round(rng.normal(100, 10, n), 2)
    return ChunkRecord.from_samples(key, ts, values)


def _parallel(n: int, fn: Callable[[int], object]) -> list[object]:
    """Run fn(0..n-1) on n threads released at once; re-raise the first failure."""
    barrier = threading.Barrier(n)

    def run(i: int) -> object:
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


# ------------------------------------------------------------------------------------- datasets


def test_dataset_create_get_list_delete(meta: MetaStore, ref: DatasetRef) -> None:
    ds = Dataset(name=ref.name, num_shards=8, min_num_nodes=2)
    other = Dataset(name=ref.name + "-b", num_shards=2)
    assert meta.get_dataset(ref) is None
    assert meta.create_dataset(ds) is True
    assert meta.create_dataset(ds) is False  # identical: idempotent
    assert meta.create_dataset(other) is True
    assert meta.get_dataset(ref) == ds
    listed = [d for d in meta.list_datasets() if d.name.startswith(ref.name)]
    assert listed == [ds, other]
    assert meta.delete_dataset(ref) is True
    assert meta.delete_dataset(ref) is False
    assert meta.get_dataset(ref) is None
    assert meta.get_dataset(other.ref) == other


def test_dataset_with_a_different_definition_conflicts(meta: MetaStore, ref: DatasetRef) -> None:
    ds = Dataset(name=ref.name, num_shards=8)
    meta.create_dataset(ds)
    changed = Dataset(name=ref.name, num_shards=16)
    with pytest.raises(DatasetConflict, match="different definition") as err:
        meta.create_dataset(changed)
    assert err.value.existing == ds and err.value.proposed == changed
    assert meta.get_dataset(ref) == ds


def test_deleting_a_dataset_keeps_its_epochs_and_checkpoints(
    meta: MetaStore, ref: DatasetRef
) -> None:
    meta.create_dataset(Dataset(name=ref.name, num_shards=4))
    epoch = meta.claim_epoch(ref, 1)
    meta.commit_checkpoint(ref, 1, 0, 42, epoch)
    meta.delete_dataset(ref)
    meta.create_dataset(Dataset(name=ref.name, num_shards=4))
    assert meta.read_checkpoints(ref, 1) == {0: 42}
    assert meta.claim_epoch(ref, 1) == epoch + 1


# ------------------------------------------------------------------------ epochs and checkpoints


def test_epochs_increase_per_shard_and_record_the_owner(meta: MetaStore, ref: DatasetRef) -> None:
    assert meta.current_epoch(ref, 0) == ShardEpoch(0, "")
    assert [meta.claim_epoch(ref, 0, f"node-{i}") for i in range(3)] == [1, 2, 3]
    assert meta.claim_epoch(ref, 5, "node-x") == 1  # shards are independent
    assert meta.current_epoch(ref, 0) == ShardEpoch(3, "node-2")
    assert meta.current_epoch(ref, 5) == ShardEpoch(1, "node-x")


def test_checkpoints_round_trip_all_groups_of_a_shard(meta: MetaStore, ref: DatasetRef) -> None:
    assert meta.read_checkpoints(ref, 3) == {}
    epoch = meta.claim_epoch(ref, 3)
    assert meta.read_checkpoints(ref, 3) == {}  # an epoch alone is no checkpoint
    for group, offset in [(0, 10), (1, 0), (7, INT64_MAX), (2, 99)]:
        assert meta.commit_checkpoint(ref, 3, group, offset, epoch) == offset
    assert meta.read_checkpoints(ref, 3) == {0: 10, 1: 0, 2: 99, 7: INT64_MAX}
    assert meta.read_checkpoints(ref, 4) == {}


def test_checkpoints_never_go_backwards(meta: MetaStore, ref: DatasetRef) -> None:
    epoch = meta.claim_epoch(ref, 0)
    assert meta.commit_checkpoint(ref, 0, 0, 500, epoch) == 500
    assert meta.commit_checkpoint(ref, 0, 0, 400, epoch) == 500
    assert meta.commit_checkpoint(ref, 0, 0, 500, epoch) == 500  # a retry is harmless
    newer = meta.claim_epoch(ref, 0)
    assert meta.commit_checkpoint(ref, 0, 0, 10, newer) == 500  # nor across epochs
    assert meta.commit_checkpoint(ref, 0, 0, 501, newer) == 501
    assert meta.read_checkpoints(ref, 0) == {0: 501}


def test_the_seal_mark_is_fenced_never_goes_back_and_is_no_group_checkpoint(
    open_backend: Opener, ref: DatasetRef
) -> None:
    (old_node, _), (new_node, _) = open_backend(), open_backend()
    assert old_node.read_seal_mark(ref, 6) is None
    old = old_node.claim_epoch(ref, 6, "old")
    assert old_node.raise_seal_mark(ref, 6, 70, old) == 70
    old_node.commit_checkpoint(ref, 6, 0, 50, old)
    assert old_node.raise_seal_mark(ref, 6, 60, old) == 70  # never backwards
    assert new_node.read_checkpoints(ref, 6) == {0: 50}  # the mark is not a group's
    assert new_node.read_seal_mark(ref, 6) == 70
    assert new_node.read_seal_mark(ref, 7) is None
    new = new_node.claim_epoch(ref, 6, "new")
    with pytest.raises(StaleEpochError):
        old_node.raise_seal_mark(ref, 6, 90, old)  # a deposed owner, before its chunk writes
    assert new_node.raise_seal_mark(ref, 6, 80, new) == 80
    assert old_node.read_seal_mark(ref, 6) == 80
    with pytest.raises(ValueError):
        new_node.raise_seal_mark(ref, 6, -1, new)


def test_the_downsample_redo_record_goes_both_ways_is_fenced_and_is_no_mark(
    open_backend: Opener, ref: DatasetRef
) -> None:
    (old_node, _), (new_node, _) = open_backend(), open_backend()
    assert old_node.read_downsample_redo(ref, 3) is None
    old = old_node.claim_epoch(ref, 3, "old")
    with pytest.raises(StaleEpochError):
        old_node.set_downsample_redo(ref, 4, 10, old)  # shard 4 was never claimed
    old_node.commit_downsample_mark(ref, 3, 60_000, 600_000, old)
    old_node.set_downsample_redo(ref, 3, 500_000, old)
    assert new_node.read_downsample_redo(ref, 3) == 500_000
    old_node.set_downsample_redo(ref, 3, 700_000, old)  # unlike a mark, it may go up...
    assert new_node.read_downsample_redo(ref, 3) == 700_000
    old_node.set_downsample_redo(ref, 3, 0, old)  # ...and down
    assert new_node.read_downsample_redo(ref, 3) == 0
    assert new_node.read_downsample_marks(ref, 3) == {60_000: 600_000}  # it is not a mark
    assert new_node.read_checkpoints(ref, 3) == {}  # nor a group's checkpoint
    new = new_node.claim_epoch(ref, 3, "new")
    with pytest.raises(StaleEpochError):
        old_node.set_downsample_redo(ref, 3, None, old)  # a deposed owner cannot clear it
    assert new_node.read_downsample_redo(ref, 3) == 0
    new_node.set_downsample_redo(ref, 3, None, new)
    assert old_node.read_downsample_redo(ref, 3) is None
    with pytest.raises(ValueError):
        new_node.set_downsample_redo(ref, 3, -5, new)


def test_a_stale_writer_is_fenced_and_the_fresh_one_proceeds(
    open_backend: Opener, ref: DatasetRef
) -> None:
    (old_node, _), (new_node, _) = open_backend(), open_backend()
    old = old_node.claim_epoch(ref, 2, "old")
    old_node.commit_checkpoint(ref, 2, 0, 100, old)

    new = new_node.claim_epoch(ref, 2, "new")  # the shard moves while the old node hangs
    assert new > old
    assert new_node.read_checkpoints(ref, 2) == {0: 100}
    with pytest.raises(StaleEpochError) as err:
        old_node.commit_checkpoint(ref, 2, 0, 150, old)
    assert (err.value.epoch, err.value.current_epoch, err.value.shard) == (old, new, 2)
    with pytest.raises(StaleEpochError):
        old_node.commit_checkpoint(ref, 2, 9, 1, old)  # nor may it start a new group

    assert new_node.commit_checkpoint(ref, 2, 0, 120, new) == 120
    assert old_node.read_checkpoints(ref, 2) == {0: 120}
    assert old_node.current_epoch(ref, 2) == ShardEpoch(new, "new")


def test_commits_need_the_current_epoch(meta: MetaStore, ref: DatasetRef) -> None:
    with pytest.raises(StaleEpochError) as err:
        meta.commit_checkpoint(ref, 0, 0, 1, 1)  # never claimed
    assert err.value.current_epoch == 0
    epoch = meta.claim_epoch(ref, 0)
    with pytest.raises(StaleEpochError):
        meta.commit_checkpoint(ref, 0, 0, 1, epoch + 1)  # not claimed yet
    assert meta.read_checkpoints(ref, 0) == {}


@pytest.mark.parametrize(
    "args",
    [(-1, 0, 0, 1), (0, -1, 0, 1), (0, 0, -1, 1), (0, 0, 0, 0), (1 << 31, 0, 0, 1)],
)
def test_bad_checkpoint_arguments_are_rejected(
    meta: MetaStore, ref: DatasetRef, args: tuple[int, int, int, int]
) -> None:
    with pytest.raises(ValueError):
        meta.commit_checkpoint(ref, *args)


def test_concurrent_claims_all_get_distinct_epochs(open_backend: Opener, ref: DatasetRef) -> None:
    nodes = [open_backend()[0] for _ in range(2)]
    claims = _parallel(8, lambda i: [nodes[i % 2].claim_epoch(ref, 0, f"n{i}") for _ in range(3)])
    epochs = sorted(e for c in claims for e in c)
    assert epochs == list(range(1, 25))
    assert nodes[0].current_epoch(ref, 0).epoch == 24


def test_a_claim_racing_commits_loses_no_acknowledged_checkpoint(
    open_backend: Opener, ref: DatasetRef
) -> None:
    (writer, _), (claimer, _) = open_backend(), open_backend()
    epoch = writer.claim_epoch(ref, 0, "writer")
    acked: dict[int, int] = {}
    fenced: list[int] = []
    lock = threading.Lock()

    def commit_loop(group: int) -> None:
        offset, deadline = 0, time.monotonic() + 30
        while time.monotonic() < deadline:  # until fenced
            offset += 1
            try:
                writer.commit_checkpoint(ref, 0, group, offset, epoch)
            except StaleEpochError:
                with lock:
                    fenced.append(group)
                return
            with lock:
                acked[group] = offset

    def claim() -> int:
        deadline = time.monotonic() + 30
        while len(acked) < 4 and time.monotonic() < deadline:  # claim mid-stream
            time.sleep(0.005)
        return claimer.claim_epoch(ref, 0, "claimer")

    with ThreadPoolExecutor(5) as pool:
        loops = [pool.submit(commit_loop, g) for g in range(4)]
        new = pool.submit(claim).result()
        for f in loops:
            f.result()
    assert new == epoch + 1
    assert sorted(fenced) == [0, 1, 2, 3], "every writer thread was fenced"
    assert sorted(acked) == [0, 1, 2, 3]
    # Exactly the acknowledged commits were applied: none lost, no rejected one slipped in.
    assert claimer.read_checkpoints(ref, 0) == acked


# ------------------------------------------------------------------------------------ part keys


def test_ownership_history_newest_first_per_dataset_and_shard(
    meta: MetaStore, ref: DatasetRef
) -> None:
    other = DatasetRef(name=ref.name + "x")
    changes = [
        OwnershipChange(ref.name, 0, T0, None, "n1", "created"),
        OwnershipChange(ref.name, 1, T0, None, "n2", "created", epoch=1, replayed_offsets=0),
        OwnershipChange(ref.name, 0, T0 + 5, "n1", "n3", "rebalance", 2, 0),
        OwnershipChange(ref.name, 1, T0 + 9, "n2", None, "failed (no answer to pings)"),
        OwnershipChange(other.name, 0, T0 + 1, None, "n1", "created"),
    ]
    years = 20 * 365 * 86_400_000  # T0 is in 2023
    meta.record_ownership(changes, retention_ms=years)
    meta.record_ownership(changes[2:3], retention_ms=years)  # a retry: no duplicate
    assert meta.ownership_history(ref) == [changes[3], changes[2], changes[1], changes[0]]
    assert meta.ownership_history(ref, shard=0) == [changes[2], changes[0]]
    assert meta.ownership_history(ref, limit=1) == [changes[3]]
    assert meta.ownership_history(other) == [changes[4]]
    assert meta.ownership_history(DatasetRef(name=ref.name + "none")) == []
    with pytest.raises(ValueError):
        meta.ownership_history(ref, limit=0)


def test_ownership_history_retention_is_bounded(meta: MetaStore, ref: DatasetRef) -> None:
    day = 86_400_000
    now = int(time.time() * 1000)
    kept = OwnershipChange(ref.name, 1, now - day, None, "n1", "created")
    old = OwnershipChange(ref.name, 0, now - 3 * day, None, "n1", "created")
    new = OwnershipChange(ref.name, 0, now, "n1", "n2", "rebalance")
    meta.record_ownership([kept, old, new], retention_ms=2 * day)  # old is past 2 days
    assert meta.ownership_history(ref) == [new, kept]


def test_part_keys_upsert_last_write_wins(column: ColumnStore, ref: DatasetRef) -> None:
    a, b = _series(1), _series(2)
    column.write_part_keys(ref, 0, [PartKeyRecord(a, 100, 200), PartKeyRecord(b, 50, 60)])
    column.write_part_keys(ref, 0, [PartKeyRecord(a, 100, 900)])
    column.write_part_keys(ref, 0, [])
    assert column.list_part_keys(ref, 0) == sorted(
        [PartKeyRecord(a, 100, 900), PartKeyRecord(b, 50, 60)], key=lambda r: r.part_key
    )
    assert column.list_part_keys(ref, 1) == []
    assert column.list_part_keys(DatasetRef(name=ref.name + "x"), 0) == []


def test_part_keys_by_time_range_edges_inclusive(column: ColumnStore, ref: DatasetRef) -> None:
    recs = [
        PartKeyRecord(_series(0), 1000, 2000),
        PartKeyRecord(_series(1), 2000, 2000),
        PartKeyRecord(_series(2), INT64_MIN, INT64_MAX),
    ]
    column.write_part_keys(ref, 7, recs)

    def found(start: int, end: int) -> set[str]:
        return {r.part_key for r in column.list_part_keys(ref, 7, start, end)}

    all_keys = {r.part_key for r in recs}
    assert found(INT64_MIN, INT64_MAX) == all_keys
    assert found(2000, 2000) == all_keys
    assert found(0, 1000) == {_series(0), _series(2)}
    assert found(0, 999) == {_series(2)}
    assert found(2001, 5000) == {_series(2)}
    assert found(1500, 1600) == {_series(0), _series(2)}


def test_part_keys_filtered_by_label_matchers(column: ColumnStore, ref: DatasetRef) -> None:
    series = [
        {"__name__": "up", "job": "api", "env": "prod"},
        {"__name__": "up", "job": "api-canary", "env": "prod"},
        {"__name__": "up", "job": "db"},
        {"__name__": "cpu", "job": "db", "env": "dev"},
    ]
    column.write_part_keys(ref, 0, [PartKeyRecord.from_labels(s, 0, 10) for s in series])

    def names(*matchers: LabelMatcher) -> list[dict[str, str]]:
        recs = column.list_part_keys(ref, 0, matchers=list(matchers))
        return sorted((r.labels for r in recs), key=lambda d: sorted(d.items()))

    def expect(*idx: int) -> list[dict[str, str]]:
        return sorted((series[i] for i in idx), key=lambda d: sorted(d.items()))

    assert names(LabelMatcher("__name__", "=", "up")) == expect(0, 1, 2)
    assert names(LabelMatcher("job", "=~", "api")) == expect(0)  # anchored: not api-canary
    assert names(LabelMatcher("job", "=~", "api.*")) == expect(0, 1)
    assert names(LabelMatcher("job", "!~", "api.*")) == expect(2, 3)
    assert names(LabelMatcher("env", "!=", "prod")) == expect(2, 3)
    assert names(LabelMatcher("env", "=", "")) == expect(2)  # missing label equals ""
    assert names(LabelMatcher("env", "=~", "prod|")) == expect(0, 1, 2)
    assert names(LabelMatcher("__name__", "=", "up"), LabelMatcher("env", "!~", ".+")) == expect(2)
    assert names(LabelMatcher("nope", "=", "x")) == []


# --------------------------------------------------------------------------------------- chunks


def test_chunks_of_many_series_round_trip(column: ColumnStore, ref: DatasetRef) -> None:
    chunks = [_chunk(_series(i), T0 + i, 50 + i, seed=i) for i in range(40)]
    special = ChunkRecord.from_samples(
        _series(99),
        [T0, T0 + 1, T0 + 2, T0 + 3],
        np.array([np.nan, -0.0, np.inf, -np.inf]),
    )
    column.write_chunks(ref, 3, [*chunks, special])
    keys = [c.part_key for c in chunks] + [special.part_key, _series(1000)]
    got = column.read_chunks(ref, 3, keys, INT64_MIN, INT64_MAX)
    assert set(got) == {c.part_key for c in [*chunks, special]}  # no chunks: absent
    for c in [*chunks, special]:
        (back,) = got[c.part_key]
        assert back == c
        ts, vals = back.samples()
        want_ts, want_vals = c.samples()
        assert np.array_equal(ts, want_ts) and np.array_equal(_bits(vals), _bits(want_vals))
    assert column.read_chunks(ref, 2, keys, INT64_MIN, INT64_MAX) == {}


def test_rewriting_a_chunk_is_idempotent(column: ColumnStore, ref: DatasetRef) -> None:
    key = _series(1)
    first, second = _chunk(key, T0, 100, seed=1), _chunk(key, T0 + 100 * STEP, 100, seed=2)
    column.write_chunks(ref, 0, [first, second])
    column.write_chunks(ref, 0, [first, second])  # a replay after a crash
    column.write_chunks(ref, 0, [first])
    assert column.read_chunks(ref, 0, [key], INT64_MIN, INT64_MAX) == {key: [first, second]}
    # A replay that flushed later re-encodes more samples under the same chunk id: it replaces.
    longer = _chunk(key, T0, 120, seed=1)
    assert longer.start_time == first.start_time
    column.write_chunks(ref, 0, [longer])
    assert column.read_chunks(ref, 0, [key], INT64_MIN, INT64_MAX) == {key: [longer, second]}


def test_time_range_reads_at_chunk_edges(column: ColumnStore, ref: DatasetRef) -> None:
    key = _series(5)
    a = ChunkRecord.from_samples(key, [10_000, 20_000, 30_000], [1.0, 2.0, 3.0])
    b = ChunkRecord.from_samples(key, [40_000, 50_000], [4.0, 5.0])
    single = ChunkRecord.from_samples(key, [60_000], [6.0])
    column.write_chunks(ref, 1, [a, b, single])

    def starts(start: int, end: int) -> list[int]:
        return [c.start_time for c in column.read_chunks(ref, 1, [key], start, end).get(key, [])]

    assert starts(0, 9_999) == []
    assert starts(0, 10_000) == [10_000]  # touches a's first sample
    assert starts(30_000, 30_000) == [10_000]  # touches a's last sample
    assert starts(30_001, 39_999) == []  # the gap between chunks
    assert starts(30_001, 40_000) == [40_000]
    assert starts(25_000, 45_000) == [10_000, 40_000]
    assert starts(50_000, 60_000) == [40_000, 60_000]
    assert starts(60_000, 60_000) == [60_000]
    assert starts(60_001, INT64_MAX) == []
    assert starts(INT64_MIN, INT64_MAX) == [10_000, 40_000, 60_000]


def test_chunks_spanning_up_to_the_limit_are_found_from_their_end(
    column: ColumnStore, ref: DatasetRef
) -> None:
    key = _series(6)
    longest = ChunkRecord.from_samples(key, [0, MAX_CHUNK_SPAN_MS], [1.0, 2.0])
    column.write_chunks(ref, 0, [longest])
    assert column.read_chunks(ref, 0, [key], MAX_CHUNK_SPAN_MS, INT64_MAX) == {key: [longest]}
    too_long = ChunkRecord.from_samples(key, [0, MAX_CHUNK_SPAN_MS + 1], [1.0, 2.0])
    with pytest.raises(ValueError, match="max_chunk_span_ms"):
        column.write_chunks(ref, 0, [too_long])


def test_many_chunks_of_one_series_in_one_write(column: ColumnStore, ref: DatasetRef) -> None:
    """More rows for one partition than one Cassandra batch may carry."""
    key = _series(7)
    chunks = [_chunk(key, T0 + i * 400 * STEP, 200, seed=i) for i in range(300)]
    column.write_chunks(ref, 0, chunks)
    got = column.read_chunks(ref, 0, [key], INT64_MIN, INT64_MAX)[key]
    assert got == chunks
    mid = chunks[150]
    window = column.read_chunks(ref, 0, [key], mid.start_time, mid.end_time)[key]
    assert window == [mid]


def test_concurrent_writers_from_several_threads(open_backend: Opener, ref: DatasetRef) -> None:
    nodes = [open_backend()[1] for _ in range(2)]
    per_thread = 25

    def write(t: int) -> list[ChunkRecord]:
        chunks = [_chunk(_series(t * 100 + i), T0, 30, seed=t * 100 + i) for i in range(per_thread)]
        store = nodes[t % 2]
        for i in range(0, per_thread, 5):  # several writes per thread, interleaving
            store.write_chunks(ref, 0, chunks[i : i + 5])
            store.write_part_keys(
                ref, 0, [PartKeyRecord(c.part_key, c.start_time, c.end_time) for c in chunks]
            )
        return chunks

    written = [c for batch in _parallel(6, write) for c in batch]
    keys = [c.part_key for c in written]
    got = nodes[0].read_chunks(ref, 0, keys, INT64_MIN, INT64_MAX)
    assert got == {c.part_key: [c] for c in written}
    assert {r.part_key for r in nodes[1].list_part_keys(ref, 0)} == set(keys)


# ---------------------------------------------------------------------- open-buffer snapshots


def test_open_snapshots_round_trip_by_group_and_offset(
    column: ColumnStore, ref: DatasetRef
) -> None:
    assert column.read_open_snapshot(ref, 0, 0, 10) is None
    column.write_open_snapshot(ref, 0, 0, 10, 1, b"g0@10")
    column.write_open_snapshot(ref, 0, 1, 10, 1, b"g1@10")
    column.write_open_snapshot(ref, 0, 0, 20, 1, b"g0@20")
    column.write_open_snapshot(ref, 1, 0, 10, 1, b"s1")
    assert column.read_open_snapshot(ref, 0, 0, 10) == b"g0@10"
    assert column.read_open_snapshot(ref, 0, 1, 10) == b"g1@10"
    assert column.read_open_snapshot(ref, 0, 0, 20) == b"g0@20"
    assert column.read_open_snapshot(ref, 1, 0, 10) == b"s1"
    assert column.read_open_snapshot(ref, 0, 0, 15) is None
    column.write_open_snapshot(ref, 0, 0, 10, 1, b"g0@10")  # a retried write: same bytes
    assert column.read_open_snapshot(ref, 0, 0, 10) == b"g0@10"
    column.write_open_snapshot(ref, 0, 2, -1, 1, b"")  # nothing ingested yet; empty is valid
    assert column.read_open_snapshot(ref, 0, 2, -1) == b""


def test_the_newest_epochs_open_snapshot_wins(column: ColumnStore, ref: DatasetRef) -> None:
    column.write_open_snapshot(ref, 0, 0, 10, 3, b"new owner")
    column.write_open_snapshot(ref, 0, 0, 10, 2, b"deposed owner, late")
    assert column.read_open_snapshot(ref, 0, 0, 10) == b"new owner"


def test_dropping_open_snapshots_below_an_offset(column: ColumnStore, ref: DatasetRef) -> None:
    for off in (5, 10, 20):
        column.write_open_snapshot(ref, 0, 0, off, 1, f"@{off}".encode())
    column.write_open_snapshot(ref, 0, 1, 5, 1, b"other group")
    column.drop_open_snapshots(ref, 0, 0, 20)
    assert column.read_open_snapshot(ref, 0, 0, 5) is None
    assert column.read_open_snapshot(ref, 0, 0, 10) is None
    assert column.read_open_snapshot(ref, 0, 0, 20) == b"@20"
    assert column.read_open_snapshot(ref, 0, 1, 5) == b"other group"
    column.drop_open_snapshots(ref, 0, 0, 20)  # idempotent


def test_large_open_snapshots_round_trip(column: ColumnStore, ref: DatasetRef) -> None:
    data = np.random.default_rng(7).bytes(1_300_000)  # several pages on Cassandra
    column.write_open_snapshot(ref, 0, 3, 42, 1, data)
    assert column.read_open_snapshot(ref, 0, 3, 42) == data


@pytest.mark.parametrize(("group", "offset", "epoch"), [(-1, 0, 1), (0, -2, 1), (0, 0, 0)], ids=str)
def test_bad_open_snapshot_arguments_are_rejected(
    column: ColumnStore, ref: DatasetRef, group: int, offset: int, epoch: int
) -> None:
    with pytest.raises(ValueError):
        column.write_open_snapshot(ref, 0, group, offset, epoch, b"x")


# --------------------------------------------------------------------------------------- tokens


def _mine(meta: MetaStore, *tokens: Token) -> list[Token]:
    """The listed tokens among these (tests share the session's keyspace)."""
    ids = {t.id for t in tokens}
    return [t for t in meta.list_tokens() if t.id in ids]


def test_tokens_round_trip_every_field_and_list_oldest_first(meta: MetaStore) -> None:
    full, _ = new_token(
        "ingest from the edge é", ["write", "read"], T0 + 5, datasets=["b", "a"], tenant="t1"
    )
    bare, _ = new_token("dashboards", ["read"], T0)
    same_ms, _ = new_token("ops", ["admin"], T0 + 5)
    revoked = dataclasses.replace(
        new_token("gone", ["admin"], T0 + 1)[0], datasets=("z", "a"), revoked_ms=T0 + 2
    )  # datasets in no particular order: stored as given
    for t in (full, bare, same_ms, revoked):
        assert meta.get_token(t.id) is None
        assert meta.put_token(t) is None
    for t in (full, bare, same_ms, revoked):
        back = meta.get_token(t.id)
        assert back == t
        assert back is not None and type(back.scopes) is frozenset
        assert type(back.datasets) is tuple
    assert full.datasets == ("a", "b") and full.tenant == "t1"
    assert bare.datasets == () and bare.tenant is None and bare.revoked_ms is None
    by_time = [bare, revoked, *sorted([full, same_ms], key=lambda t: t.id)]
    assert _mine(meta, full, bare, same_ms, revoked) == by_time


def test_a_taken_token_id_is_refused_and_the_stored_token_kept(meta: MetaStore) -> None:
    token, _ = new_token("first", ["read"], T0)
    meta.put_token(token)
    other, _ = new_token("second", ["admin"], T0 + 1)
    with pytest.raises(TokenConflict, match=token.id):
        meta.put_token(dataclasses.replace(other, id=token.id))  # another secret, more scopes
    with pytest.raises(TokenConflict):
        meta.put_token(token)  # the same token again: written once
    meta.revoke_token(token.id, T0 + 2)
    with pytest.raises(TokenConflict):
        meta.put_token(token)  # nor can a put lift a revocation
    assert meta.get_token(token.id) == dataclasses.replace(token, revoked_ms=T0 + 2)


def test_revoking_a_token_once_keeps_it_listed_with_its_time(meta: MetaStore) -> None:
    token, _ = new_token("ci", ["write"], T0)
    kept, _ = new_token("kept", ["read"], T0)
    meta.put_token(token)
    meta.put_token(kept)
    assert meta.revoke_token(token.id, T0 + 100) is True
    assert meta.revoke_token(token.id, T0 + 200) is False  # idempotent: the first time stays
    revoked = meta.get_token(token.id)
    assert revoked == dataclasses.replace(token, revoked_ms=T0 + 100)
    assert revoked is not None and revoked.revoked
    assert meta.get_token(kept.id) == kept  # only that token
    assert _mine(meta, token, kept) == sorted([revoked, kept], key=lambda t: t.id)


def test_unknown_tokens_are_none_and_revoking_one_creates_nothing(meta: MetaStore) -> None:
    unknown = new_token("never stored", ["read"], T0)[0].id
    assert meta.get_token(unknown) is None
    assert meta.revoke_token(unknown, T0) is False
    assert meta.get_token(unknown) is None
    assert all(t.id != unknown for t in meta.list_tokens())


def test_a_token_put_on_one_node_is_seen_and_revoked_on_another(open_backend: Opener) -> None:
    """The REST server on the head and a gateway on another host share the tokens."""
    (head, _), (gateway, _) = open_backend(), open_backend()
    token, _ = new_token("grafana", ["read"], T0, datasets=["metrics"])
    head.put_token(token)
    assert gateway.get_token(token.id) == token
    assert _mine(gateway, token) == [token]
    assert gateway.revoke_token(token.id, T0 + 9) is True
    assert head.get_token(token.id) == dataclasses.replace(token, revoked_ms=T0 + 9)
    assert head.revoke_token(token.id, T0 + 10) is False


def test_concurrent_revocations_succeed_once(open_backend: Opener) -> None:
    nodes = [open_backend()[0] for _ in range(2)]
    token, _ = new_token("raced", ["admin"], T0)
    nodes[0].put_token(token)
    won = _parallel(6, lambda i: nodes[i % 2].revoke_token(token.id, T0 + 1 + i))
    assert won.count(True) == 1
    back = nodes[1].get_token(token.id)
    assert back is not None and back.revoked_ms == T0 + 1 + won.index(True)


@pytest.mark.parametrize("token_id", [12, None, b"abc", ["ab"]], ids=repr)
def test_a_token_id_of_another_type_is_a_type_error(meta: MetaStore, token_id: object) -> None:
    with pytest.raises(TypeError):
        meta.get_token(token_id)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        meta.revoke_token(token_id, T0)  # type: ignore[arg-type]


@pytest.mark.parametrize("token_id", ["", "ABCDEF012345", "ab cd", "fpy_0123", "a" * 65], ids=repr)
def test_a_malformed_token_id_is_invalid(meta: MetaStore, token_id: str) -> None:
    with pytest.raises(Invalid):
        meta.get_token(token_id)
    with pytest.raises(Invalid):
        meta.revoke_token(token_id, T0)


@pytest.mark.parametrize("now_ms", [-1, 1 << 63, 1.5, True, None], ids=repr)
def test_revoking_needs_a_time_in_ms(meta: MetaStore, now_ms: object) -> None:
    token, _ = new_token("t", ["read"], T0)
    meta.put_token(token)
    with pytest.raises(Invalid):
        meta.revoke_token(token.id, now_ms)  # type: ignore[arg-type]
    assert meta.get_token(token.id) == token


_GOOD = new_token("good", ["read"], T0)[0]


@pytest.mark.parametrize(
    "changes",
    [
        {"id": ""},
        {"id": "NOT-HEX"},
        {"name": " "},
        {"scopes": frozenset()},
        {"scopes": frozenset({"read", "root"})},
        {"scopes": {"read"}},  # a set, not the frozenset read back
        {"secret_sha256": "abc"},
        {"secret_sha256": "A" * 64},
        {"created_ms": -1},
        {"created_ms": 1.0},
        {"datasets": ["a"]},  # a list, not the tuple read back
        {"datasets": ("a", "")},
        {"tenant": ""},
        {"revoked_ms": -5},
    ],
    # Sorted, not repr: a set's repr follows string hashing, which differs between processes,
    # and pytest-xdist's workers must collect the same ids.
    ids=lambda changes: ",".join(
        f"{k}={sorted(v) if isinstance(v, set | frozenset) else v!r}" for k, v in changes.items()
    ),
)
def test_a_malformed_token_is_refused_before_the_store(
    meta: MetaStore, changes: dict[str, object]
) -> None:
    bad = dataclasses.replace(_GOOD, **changes)  # type: ignore[arg-type]
    with pytest.raises(Invalid):
        meta.put_token(bad)
    assert meta.get_token(_GOOD.id) is None


def test_put_token_takes_only_a_token(meta: MetaStore) -> None:
    with pytest.raises(TypeError):
        meta.put_token(dataclasses.asdict(_GOOD))  # type: ignore[arg-type]
