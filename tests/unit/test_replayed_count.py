"""The ownership history's "replayed" count (`ingest.tenure.offsets_read_before`) and the
release notes it reads. Pure, but for one SQLite file; the cluster cases are in
tests/runtime/test_replayed.py."""

from __future__ import annotations

from pathlib import Path

from core.dataset import DatasetRef
from ingest.tenure import RELEASE_GROUP, note_release, noted_release, offsets_read_before
from store.sqlite import open_sqlite_stores

GROUPS_AT_99 = dict.fromkeys(range(4), 99)


def test_the_first_owner_read_nothing_again_whatever_the_partition_holds() -> None:
    assert offsets_read_before(0, 500, {}, earlier_owner=False, noted=None) == 0


def test_after_a_drain_exactly_what_the_old_owner_read_past_the_new_ones_start() -> None:
    # Its final flush checkpointed every group at its last offset: nothing, even with 20 more
    # offsets produced between its release and the new owner's claim.
    assert offsets_read_before(100, 120, GROUPS_AT_99, earlier_owner=True, noted=100) == 0
    # Its final flush failed: the new owner starts at older checkpoints, re-reading 40.
    assert offsets_read_before(60, 120, {0: 59, 1: 80}, earlier_owner=True, noted=100) == 40


def test_a_killed_owner_may_have_read_everything_below_the_end_at_the_claim() -> None:
    # Never flushed: from the partition's first offset.
    assert offsets_read_before(0, 20, {}, earlier_owner=True, noted=None) == 20
    # Flushed: from the lowest checkpoint + 1, past the highest one (what it read since).
    assert offsets_read_before(60, 130, {0: 59, 1: 99}, earlier_owner=True, noted=None) == 70
    # Every group flushed at its last offset before it died: nothing to read again.
    assert offsets_read_before(100, 100, GROUPS_AT_99, earlier_owner=True, noted=None) == 0
    # Kafka retention already dropped what it had read.
    assert offsets_read_before(300, 300, GROUPS_AT_99, earlier_owner=True, noted=None) == 0


def test_a_release_note_is_read_by_the_epoch_that_wrote_it_only(tmp_path: Path) -> None:
    meta, columns = open_sqlite_stores(tmp_path / "filopy.db")
    ref = DatasetRef(name="notes")
    try:
        assert noted_release(columns, ref, 3, 1) is None
        note_release(columns, ref, 3, 1, 100)
        note_release(columns, ref, 3, 2, 250)  # drops the note of epoch 1
        assert noted_release(columns, ref, 3, 2) == 250
        assert noted_release(columns, ref, 3, 1) is None
        # An owner of epoch 3 killed before letting go leaves no note: epoch 4 finds none.
        assert noted_release(columns, ref, 3, 3) is None
        assert noted_release(columns, ref, 2, 2) is None  # per shard
        # Not an open-buffer snapshot of any flush group a shard can have.
        assert columns.read_open_snapshot(ref, 3, 0, 2) is None
        assert RELEASE_GROUP >= 2**31 - 1
    finally:
        meta.close()
        columns.close()
