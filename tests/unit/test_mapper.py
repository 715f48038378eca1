"""ShardMapper: event rules, queries, rendering, snapshots; and the test helpers built on it
(tests/mapper_helpers.py: register/unassign, minimal events, merge, bitmap)."""

from __future__ import annotations

import pickle

import pytest

from core.shard_status import ShardMapState
from filopy import (
    Active,
    Assigned,
    Down,
    Error,
    IngestionError,
    IngestionStarted,
    IngestionStopped,
    Recovery,
    RecoveryInProgress,
    ShardAssignmentStarted,
    ShardDown,
    ShardEvent,
    ShardEventError,
    ShardMapper,
    ShardStatus,
    Stopped,
    Unassigned,
)
from tests.mapper_helpers import (
    active_bitmap,
    merge_from,
    minimal_events,
    num_assigned_shards,
    register_node,
    unassign_shard,
)

from .support import ref

R = ref("foo")


@pytest.mark.parametrize("num_shards", [0, 3, 34, 100])
def test_num_shards_must_be_a_power_of_two(num_shards: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        ShardMapper(num_shards)


def test_new_mapper_is_all_unassigned() -> None:
    m = ShardMapper(8)
    assert all(m.owner(s) is None and m.status(s) == Unassigned() for s in range(8))
    assert num_assigned_shards(m) == 0
    assert m.unassigned_shards() == list(range(8))
    assert not m.is_healthy()


@pytest.mark.parametrize(
    ("event", "status", "owner"),
    [
        (ShardAssignmentStarted(R, 3, "b"), Assigned(), "b"),
        (IngestionStarted(R, 3, "b"), Active(), "b"),
        (RecoveryInProgress(R, 3, "b", 40), Recovery(40), "b"),
        (IngestionError(R, 3, "a", "boom"), Error("boom"), None),
        (IngestionStopped(R, 3, "a"), Stopped(), "a"),
        (ShardDown(R, 3, "a"), Down(), None),
    ],
)
def test_event_effect_on_status_and_owner(event: object, status: ShardStatus, owner: str) -> None:
    m = ShardMapper(8)
    m.update_from_event(IngestionStarted(R, 3, "a"))  # start from Active on node a
    assert m.update_from_event(event)  # type: ignore[arg-type]
    assert m.status(3) == status
    assert m.owner(3) == owner
    assert m.shards_for_node("a") == ([3] if owner == "a" else [])
    assert m.shards_for_node("b") == ([3] if owner == "b" else [])
    assert (3 in m.unassigned_shards()) == (owner is None)


@pytest.mark.parametrize("shard", [-1, 8, 9, 1000])
def test_event_for_out_of_range_shard_is_rejected(shard: int) -> None:
    m = ShardMapper(8)
    before = m.copy()
    with pytest.raises(ShardEventError, match=f"invalid shard {shard}"):
        m.update_from_event(IngestionStarted(R, shard, "a"))
    assert m == before
    assert m.version == before.version


def test_bare_base_event_is_rejected() -> None:
    with pytest.raises(ShardEventError, match="unknown shard event type"):
        ShardMapper(8).update_from_event(ShardEvent(R, 1, "a"))


def test_owner_setting_event_must_name_a_node() -> None:
    m = ShardMapper(8)
    with pytest.raises(ShardEventError, match="must name the owning node"):
        m.update_from_event(ShardAssignmentStarted(R, 1, None))


def test_filodb_status_filtering_scenario() -> None:
    m = ShardMapper(32)
    assert m.active_or_recovering_shards([1, 5, 10]) == []
    m.update_from_event(ShardAssignmentStarted(R, 2, "ref1"))
    m.update_from_event(IngestionStarted(R, 2, "ref1"))
    assert num_assigned_shards(m) == 1
    m.update_from_event(RecoveryInProgress(R, 4, "ref1", 0))
    assert num_assigned_shards(m) == 2
    assert m.active_or_recovering_shards([1, 2, 3, 4]) == [2, 4]
    m.update_from_event(ShardAssignmentStarted(R, 3, "ref2"))
    m.update_from_event(IngestionStarted(R, 3, "ref2"))
    assert m.active_or_recovering_shards([1, 2, 3, 4]) == [2, 3, 4]
    assert m.active_shards() == [2, 3]
    assert num_assigned_shards(m) == 3
    m.update_from_event(ShardDown(R, 4, "ref1"))
    assert m.active_or_recovering_shards() == [2, 3]
    assert num_assigned_shards(m) == 2
    assert m.owner(4) is None
    assert m.all_nodes() == {"ref1", "ref2"}
    assert m.assigned_shards() == [2, 3]
    assert m.num_assigned_nodes == 2


def test_healthy_only_when_every_shard_is_active() -> None:
    m = ShardMapper(4)
    for s in range(4):
        m.update_from_event(IngestionStarted(R, s, "a"))
    assert m.is_healthy()
    m.update_from_event(RecoveryInProgress(R, 2, "a", 99))
    assert not m.is_healthy()


def test_register_unassign_and_remove_node() -> None:
    m = ShardMapper(32)
    register_node(m, [0, 1], "c1")
    register_node(m, [0, 1], "c1")  # idempotent
    assert m.shards_for_node("c1") == [0, 1]
    assert m.status(0) == Assigned()
    assert num_assigned_shards(m) == 2
    register_node(m, [1], "c2")  # a shard moves
    assert m.shards_for_node("c1") == [0]
    assert m.shards_for_node("c2") == [1]
    register_node(m, [2, 3], "c2")
    m.update_from_event(IngestionStarted(R, 3, "c2"))
    unassign_shard(m, 3)
    assert m.owner(3) is None and m.status(3) == Unassigned()
    assert m.remove_node("nobody") == []
    assert m.remove_node("c2") == [1, 2]
    assert m.remove_node("c2") == []
    assert m.all_nodes() == {"c1"}
    assert m.unassigned_shards() == [s for s in range(32) if s != 0]


def test_register_keeps_a_stopped_shard_stopped() -> None:
    m = ShardMapper(4)
    m.update_from_event(IngestionStopped(R, 1, None))
    register_node(m, [1], "a")
    assert (m.owner(1), m.status(1)) == ("a", Stopped())
    m.update_from_event(IngestionError(R, 2, "x", "bad"))
    register_node(m, [2], "a")
    assert m.status(2) == Assigned()


def test_unassigned_limit_returns_lowest_first() -> None:
    m = ShardMapper(16)
    register_node(m, [0, 2, 3], "a")
    assert m.unassigned_shards(limit=3) == [1, 4, 5]
    assert m.unassigned_shards(limit=0) == []
    m.remove_node("a")
    assert m.unassigned_shards(limit=2) == [0, 1]


def test_copy_is_independent_and_equal() -> None:
    m = ShardMapper(8)
    m.update_from_event(IngestionStarted(R, 1, "a"))
    c = m.copy()
    assert c == m
    c.update_from_event(ShardDown(R, 1, "a"))
    assert c != m
    assert m.owner(1) == "a"
    assert m.shards_for_node("a") == [1]


def test_equality_ignores_version_but_not_size() -> None:
    a, b = ShardMapper(8), ShardMapper(8)
    a.update_from_event(IngestionStarted(R, 1, "x"))
    a.update_from_event(ShardDown(R, 1, "x"))
    b.update_from_event(ShardDown(R, 1, "y"))
    assert a == b and a.version != b.version
    assert ShardMapper(8) != ShardMapper(16)


def test_version_grows_with_every_change_only() -> None:
    m = ShardMapper(8)
    v = m.version
    assert m.update_from_event(IngestionStarted(R, 1, "a"))
    assert m.version == v + 1
    assert not m.update_from_event(IngestionStarted(R, 1, "a"))  # no change
    assert m.version == v + 1
    m.update_from_event(RecoveryInProgress(R, 1, "a", 10))
    m.update_from_event(RecoveryInProgress(R, 1, "a", 20))
    assert m.version == v + 3
    register_node(m, [2], "b")
    unassign_shard(m, 2)
    m.remove_node("a")
    assert m.version == v + 6


def test_minimal_events_rebuild_an_equal_mapper() -> None:
    m = ShardMapper(32)
    for e in [
        ShardAssignmentStarted(R, 2, "ref1"),
        IngestionStarted(R, 2, "ref1"),
        RecoveryInProgress(R, 4, "ref1", 50),
        IngestionStarted(R, 3, "ref2"),
        ShardDown(R, 4, "ref1"),
        ShardAssignmentStarted(R, 5, "ref2"),
        RecoveryInProgress(R, 6, "ref2", 70),
        IngestionError(R, 7, "ref2", "disk full"),
        IngestionStarted(R, 8, "ref1"),
        IngestionStopped(R, 8, "ref1"),
        IngestionStopped(R, 9, None),
    ]:
        m.update_from_event(e)
    events = minimal_events(m, R)
    rebuilt = ShardMapper(32)
    for e in events:
        rebuilt.update_from_event(e)
    assert rebuilt == m
    # One event per non-Unassigned shard, plus one for the owned Stopped shard.
    assert len(events) == 8 + 1
    assert [type(e) for e in events[:3]] == [IngestionStarted, IngestionStarted, ShardDown]
    assert all(e.ref == R for e in events)


def test_merge_from_adopts_other_non_unassigned_shards() -> None:
    mine, other = ShardMapper(8), ShardMapper(8)
    mine.update_from_event(IngestionStarted(R, 0, "a"))
    mine.update_from_event(IngestionStarted(R, 1, "a"))
    other.update_from_event(IngestionStarted(R, 1, "b"))
    other.update_from_event(ShardDown(R, 2, None))
    assert merge_from(mine, other, R) is mine
    assert [mine.owner(s) for s in range(3)] == ["a", "b", None]
    assert mine.status(2) == Down()
    with pytest.raises(ValueError, match="cannot merge"):
        merge_from(mine, ShardMapper(16), R)


def test_active_bitmap_filodb_vectors() -> None:
    m = ShardMapper(32)
    assert active_bitmap(m) == bytes(4)
    register_node(m, range(32), "n")
    assert active_bitmap(m) == bytes(4)  # assigned is not active
    for s in [*range(8), *range(24, 32)]:
        m.update_from_event(IngestionStarted(R, s, "n"))
    assert active_bitmap(m) == bytes([0xFF, 0x00, 0x00, 0xFF])

    big = ShardMapper(256)
    for s in range(256):
        big.update_from_event(IngestionStarted(R, s, "n"))
    assert active_bitmap(big) == b"\xff" * 32
    for s in range(60, 64):
        big.update_from_event(RecoveryInProgress(R, s, "n", 50))
    for s in range(64, 68):
        big.update_from_event(ShardDown(R, s, "n"))
    bits = active_bitmap(big)
    assert bits[:7] == b"\xff" * 7 and bits[7] == 0xF0 and bits[8] == 0x0F
    assert bits[9:] == b"\xff" * 23

    two = ShardMapper(2)
    for s in range(2):
        two.update_from_event(IngestionStarted(R, s, "n"))
    assert active_bitmap(two) == bytes([0xC0])
    two.update_from_event(ShardDown(R, 1, "n"))
    assert active_bitmap(two) == bytes([0x80])


def test_render_grid_has_sixteen_shards_per_row() -> None:
    m = ShardMapper(64)
    m.update_from_event(IngestionStarted(R, 0, "node-a"))
    m.update_from_event(RecoveryInProgress(R, 17, "node-b", 5))
    m.update_from_event(IngestionError(R, 63, "node-b", "x"))
    for s in (1, 2, 3):
        m.update_from_event(ShardAssignmentStarted(R, s, "node-a"))
    text = m.render()
    rows = [line for line in text.splitlines() if "-" in line and line.startswith("  ")]
    grid = [r for r in rows if r.strip()[0].isdigit()]
    assert len(grid) == 4
    assert grid[0].split()[1:] == ["ANNN....", "........"]
    assert grid[1].split()[1:] == [".R......", "........"]
    assert grid[3].split()[-1] == ".......E"
    assert "node-a: 0-3" in text
    assert "node-b: 17" in text
    assert str(m) == text


def test_snapshot_is_immutable_cached_and_round_trips() -> None:
    m = ShardMapper(8)
    m.update_from_event(IngestionStarted(R, 1, "a"))
    snap = m.snapshot()
    assert m.snapshot() is snap
    assert snap.owners[1] == "a" and snap.version == m.version
    m.update_from_event(ShardDown(R, 1, "a"))
    assert snap.owners[1] == "a"  # the old snapshot did not change
    new = m.snapshot()
    assert new is not snap and new.version == m.version
    again = ShardMapper.from_state(new)
    assert again == m and again.version == m.version
    assert again.unassigned_shards() == m.unassigned_shards()
    with pytest.raises(ValueError, match="wrong number"):
        ShardMapper.from_state(ShardMapState(8, (None,), (Unassigned(),), 0))


def test_state_helpers_for_nodes() -> None:
    m = ShardMapper(8)
    m.update_from_event(IngestionStarted(R, 1, "a"))
    m.update_from_event(ShardAssignmentStarted(R, 2, "a"))
    m.update_from_event(ShardAssignmentStarted(R, 3, "a"))
    m.update_from_event(IngestionStopped(R, 3, "a"))
    state = m.snapshot()
    assert state.shards_for_node("a") == [1, 2, 3]
    assert state.ingesting_shards("a") == [1, 2]


def test_snapshots_and_events_pickle() -> None:
    m = ShardMapper(64)
    for s in range(64):
        m.update_from_event(IngestionStarted(R, s, f"n{s % 4}"))
    state = m.snapshot()
    assert pickle.loads(pickle.dumps(state)) == state
    # Shared status instances keep a big map small on the wire.
    assert len(pickle.dumps(state)) < 1200
    e = IngestionError(R, 3, "n1", "boom")
    assert pickle.loads(pickle.dumps(e)) == e
    assert pickle.loads(pickle.dumps(m)) == m


@pytest.mark.parametrize(
    ("status", "text"),
    [
        (Unassigned(), "Unassigned"),
        (Assigned(), "Assigned"),
        (Active(), "Active"),
        (Recovery(40), "Recovery(40)"),
        (Error("msg"), "Error(msg)"),
        (Stopped(), "Stopped"),
        (Down(), "Down"),
    ],
)
def test_status_text_forms_round_trip(status: ShardStatus, text: str) -> None:
    assert str(status) == text
    assert ShardStatus.parse(text) == status


@pytest.mark.parametrize("text", ["", "Recovery", "Recovery(x)", "Bogus", "Active(1)"])
def test_status_parse_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        ShardStatus.parse(text)


def test_status_members_are_reachable_from_the_base() -> None:
    assert ShardStatus.Recovery(40) == Recovery(40)
    assert ShardStatus.Error is Error
    match ShardStatus.Recovery(25):
        case Recovery(pct):
            assert pct == 25
