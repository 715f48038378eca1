"""ShardManager: membership, datasets, subscriptions, node events, start/stop, recovery."""

from __future__ import annotations

import pickle

import pytest

from coordinator import ErrorReassignmentStats, ShardManager
from coordinator.messages import (
    DatasetExists,
    DatasetRemoved,
    DatasetUnknown,
    DatasetVerified,
    EventApplied,
    EventIgnored,
    MemberAdded,
    MemberRemoved,
    NodeShardMap,
    RejectReason,
    Result,
    ShardRequestRejected,
    ShardsRecovered,
    ShardsStarted,
    ShardsStopped,
    StaleNodesRemoved,
    Subscribed,
    SubscriptionsChanged,
    Unsubscribed,
)
from filopy import (
    Active,
    Assigned,
    CurrentShardSnapshot,
    Error,
    IngestionError,
    IngestionStarted,
    IngestionStopped,
    Recovery,
    RecoveryInProgress,
    ShardAssignmentStarted,
    ShardDown,
    ShardMapper,
    Stopped,
)

from .support import dataset, ref


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def manager_with(nodes: list[str], **kw: object) -> ShardManager:
    mgr = ShardManager(**kw)  # type: ignore[arg-type]
    for n in nodes:
        mgr.add_member(n)
    return mgr


def owned(mgr: ShardManager, name: str = "prom") -> dict[str, list[int]]:
    m = mgr.mapper(ref(name))
    assert m is not None
    return {n: m.shards_for_node(n) for n in sorted(m.all_nodes())}


def events_for(result: Result, subscriber: str) -> list[object]:
    return [p for p in result.payloads_for(subscriber) if not isinstance(p, SubscriptionsChanged)]


# ----- membership and datasets -----------------------------------------------------------------


def test_members_keep_deployment_order() -> None:
    mgr = manager_with(["a", "b", "c"])
    mgr.add_member("a")  # re-joining keeps the original position
    assert mgr.members == ("a", "b", "c")


def test_add_dataset_asks_newest_member_first() -> None:
    mgr = manager_with(["a", "b", "c"])
    result = mgr.add_dataset(dataset(num_shards=8, min_num_nodes=3))
    assert result.reply == DatasetVerified(ref())
    assert owned(mgr) == {"a": [6, 7], "b": [3, 4, 5], "c": [0, 1, 2]}
    m = mgr.mapper(ref())
    assert m is not None and all(m.status(s) == Assigned() for s in range(8))


def test_add_dataset_sends_every_member_the_full_versioned_map() -> None:
    mgr = manager_with(["a", "b", "c"])
    ds = dataset(num_shards=8, min_num_nodes=3)
    result = mgr.add_dataset(ds)
    maps = result.node_maps()
    assert [m.node for m in maps] == ["a", "b", "c"]
    state = maps[0].state
    assert all(m.state is state and m.dataset == ds and not m.removed for m in maps)
    assert state.version == mgr.mapper(ref()).version  # type: ignore[union-attr]
    assert maps[2].shards() == [0, 1, 2]
    assert maps[0].ingesting_shards() == [6, 7]


def test_add_dataset_twice_is_reported_and_changes_nothing() -> None:
    mgr = manager_with(["a"])
    mgr.add_dataset(dataset())
    before = mgr.mapper(ref())
    result = mgr.add_dataset(dataset(num_shards=16))
    assert result == Result(reply=DatasetExists(ref()))
    assert mgr.mapper(ref()) == before


def test_new_member_gets_what_the_strategy_recommends() -> None:
    mgr = ShardManager()
    mgr.add_dataset(dataset(num_shards=8, min_num_nodes=3))
    assert owned(mgr) == {}
    r1 = mgr.add_member("a")
    assert r1.reply == MemberAdded("a", ((ref(), (0, 1, 2)),))
    assert [m.node for m in r1.node_maps()] == ["a"]
    mgr.add_member("b")
    r3 = mgr.add_member("c")
    assert owned(mgr) == {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}
    assert {m.node for m in r3.node_maps()} == {"a", "b", "c"}


def test_member_with_nothing_to_do_still_learns_the_dataset() -> None:
    mgr = manager_with(["a", "b"])
    ds = dataset(num_shards=4, min_num_nodes=2)
    mgr.add_dataset(ds)
    result = mgr.add_member("spare")
    assert result.reply == MemberAdded("spare", ())
    (only,) = result.node_maps()
    assert only.node == "spare" and only.dataset == ds and only.shards() == []


def test_remove_member_downs_its_shards_then_reassigns_newest_first() -> None:
    mgr = manager_with(["a", "b", "c", "d"])
    mgr.add_dataset(dataset(num_shards=8, min_num_nodes=2))
    assert owned(mgr) == {"c": [4, 5, 6, 7], "d": [0, 1, 2, 3]}
    mgr.subscribe("watcher", ref())
    result = mgr.remove_member("d")
    assert result.reply == MemberRemoved("d", ((ref(), (0, 1, 2, 3)),))
    assert mgr.members == ("a", "b", "c")
    # b is the newest remaining member without shards: it takes all four.
    assert owned(mgr) == {"b": [0, 1, 2, 3], "c": [4, 5, 6, 7]}
    events = events_for(result, "watcher")
    assert events == [ShardDown(ref(), s, "d") for s in range(4)] + [
        ShardAssignmentStarted(ref(), s, "b") for s in range(4)
    ]


def test_removed_member_gets_a_final_map_without_its_shards() -> None:
    mgr = manager_with(["a", "b"])
    mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2))
    result = mgr.remove_member("a")
    (final,) = result.node_maps("a")
    assert final.shards() == [] and not final.removed
    (survivor,) = result.node_maps("b")
    assert survivor.state is final.state


def test_remove_unknown_member_is_a_no_op() -> None:
    mgr = manager_with(["a"])
    mgr.add_dataset(dataset())
    assert mgr.remove_member("ghost") == Result(reply=MemberRemoved("ghost", ()))


def test_versions_grow_across_changes() -> None:
    mgr = manager_with(["a", "b"])
    v1 = mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2)).node_maps()[0].version
    v2 = mgr.add_member("c").node_maps()[0].version
    v3 = mgr.remove_member("a").node_maps()[0].version
    assert v1 < v3 and v2 <= v3


def test_a_dataset_re_created_by_a_new_singleton_has_newer_maps_than_its_predecessor() -> None:
    """A node out of the cluster when a dataset was removed keeps the old map; a restarted
    singleton that re-creates the dataset must send maps that node takes."""
    now = [1_000.0]
    old = ShardManager(clock=lambda: now[0])
    for n in ("a", "b"):
        old.add_member(n)
    old.add_dataset(dataset(num_shards=4, min_num_nodes=2))
    for _ in range(50):  # many changes: the old map's version climbs
        old.remove_member("a")
        old.add_member("a")
    kept = old.mapper(ref()).version  # type: ignore[union-attr]
    now[0] += 1.0  # the restart takes time
    new = ShardManager(clock=lambda: now[0])
    for n in ("a", "b"):
        new.add_member(n)
    assert new.add_dataset(dataset(num_shards=4, min_num_nodes=2)).node_maps()[0].version > kept


def test_remove_dataset_tells_nodes_and_subscribers_and_drops_subscriptions() -> None:
    mgr = manager_with(["a", "b"])
    mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2))
    mgr.subscribe("sub", ref())
    mgr.subscribe_all("guardian")
    last_version = mgr.mapper(ref()).version  # type: ignore[union-attr]
    result = mgr.remove_dataset(ref())
    assert result.reply == DatasetRemoved(ref())
    maps = result.node_maps()
    assert {m.node for m in maps} == {"a", "b"} and all(m.removed for m in maps)
    assert all(m.shards() == [] for m in maps)
    assert events_for(result, "sub")[-1] == DatasetRemoved(ref())
    assert [e for e in events_for(result, "sub") if isinstance(e, ShardDown)] == [
        ShardDown(ref(), s, o) for s, o in [(0, "b"), (1, "b"), (2, "a"), (3, "a")]
    ]
    assert mgr.mapper(ref()) is None and mgr.subscribers(ref()) == ()
    assert SubscriptionsChanged((), ("guardian",)) in result.payloads_for("guardian")
    assert mgr.remove_dataset(ref()) == Result(reply=DatasetUnknown(ref()))
    # Re-adding starts above the old version, so nodes never see a version go back.
    readded = mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2))
    assert readded.node_maps()[0].version > last_version


# ----- subscriptions ---------------------------------------------------------------------------


def test_subscribe_unknown_dataset() -> None:
    mgr = ShardManager()
    result = mgr.subscribe("s", ref("nope"))
    assert result.reply == DatasetUnknown(ref("nope"))
    assert result.payloads_for("s") == [DatasetUnknown(ref("nope"))]


def test_subscriber_gets_snapshot_first_then_every_change() -> None:
    mgr = manager_with(["a", "b"])
    mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2))
    sub = mgr.subscribe("s", ref())
    assert sub.reply == Subscribed(ref())
    (snap,) = sub.payloads_for("s")
    assert isinstance(snap, CurrentShardSnapshot)
    assert ShardMapper.from_state(snap.state) == mgr.mapper(ref())
    mirror = ShardMapper.from_state(snap.state)
    r = mgr.update_from_external_shard_event("b", IngestionStarted(ref(), 0, "b"))
    assert r.payloads_for("s") == [IngestionStarted(ref(), 0, "b")]
    for p in r.payloads_for("s"):
        mirror.update_from_event(p)  # type: ignore[arg-type]
    assert mirror == mgr.mapper(ref())
    assert [m.version for m in r.messages if hasattr(m, "subscriber")] == [mirror.version]


def test_unsubscribe_stops_events_and_works_for_gone_subscribers() -> None:
    mgr = manager_with(["a", "b"])
    mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2))
    mgr.subscribe("s", ref())
    assert mgr.unsubscribe("s").reply == Unsubscribed("s")
    assert mgr.subscribers(ref()) == ()
    r = mgr.update_from_external_shard_event("b", IngestionStarted(ref(), 0, "b"))
    assert r.payloads_for("s") == []
    # Never subscribed, or already gone: still fine, nothing left behind.
    assert mgr.unsubscribe("never").messages == ()
    assert mgr.unsubscribe("s", ref("unknown")).reply == Unsubscribed("s")


def test_unsubscribe_from_one_dataset_only() -> None:
    mgr = manager_with(["a"])
    mgr.add_dataset(dataset("one", num_shards=2, min_num_nodes=1))
    mgr.add_dataset(dataset("two", num_shards=2, min_num_nodes=1))
    mgr.subscribe("s", ref("one"))
    mgr.subscribe("s", ref("two"))
    mgr.unsubscribe("s", ref("one"))
    assert mgr.subscribers(ref("one")) == () and mgr.subscribers(ref("two")) == ("s",)


def test_guardian_gets_everything_and_subscription_changes() -> None:
    mgr = manager_with(["a"])
    mgr.add_dataset(dataset("one", num_shards=2, min_num_nodes=1))
    g = mgr.subscribe_all("guardian")
    assert g.reply == Subscribed(None)
    snaps = [p for p in g.payloads_for("guardian") if isinstance(p, CurrentShardSnapshot)]
    assert [s.ref for s in snaps] == [ref("one")]
    assert g.payloads_for("guardian")[-1] == SubscriptionsChanged((), ("guardian",))
    two = mgr.add_dataset(dataset("two", num_shards=2, min_num_nodes=1))
    (snap,) = two.payloads_for("guardian")
    assert isinstance(snap, CurrentShardSnapshot) and snap.ref == ref("two")
    sub = mgr.subscribe("q", ref("two"))
    assert sub.payloads_for("guardian") == [
        SubscriptionsChanged(((ref("two"), ("q",)),), ("guardian",))
    ]
    ev = mgr.update_from_external_shard_event("a", IngestionStarted(ref("one"), 0, "a"))
    assert ev.payloads_for("guardian") == [IngestionStarted(ref("one"), 0, "a")]
    gone = mgr.unsubscribe("q")
    assert gone.payloads_for("guardian") == [SubscriptionsChanged((), ("guardian",))]


def test_subscriber_that_is_also_a_guardian_gets_each_event_once() -> None:
    mgr = manager_with(["a"])
    mgr.add_dataset(dataset(num_shards=2, min_num_nodes=1))
    mgr.subscribe("both", ref())
    mgr.subscribe_all("both")
    r = mgr.update_from_external_shard_event("a", IngestionStarted(ref(), 0, "a"))
    assert r.payloads_for("both") == [IngestionStarted(ref(), 0, "a")]


# ----- events from nodes -----------------------------------------------------------------------


@pytest.fixture
def two_node() -> ShardManager:
    mgr = manager_with(["a", "b"])
    mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2))
    assert owned(mgr) == {"a": [2, 3], "b": [0, 1]}
    mgr.subscribe("s", ref())
    return mgr


def test_event_from_owner_is_applied_and_published(two_node: ShardManager) -> None:
    r = two_node.update_from_external_shard_event("a", IngestionStarted(ref(), 2, "a"))
    assert r.reply == EventApplied(IngestionStarted(ref(), 2, "a"))
    assert two_node.mapper(ref()).status(2) == Active()  # type: ignore[union-attr]
    # Assigned -> Active changes nothing a node runs: subscribers get the event, nodes no map.
    assert r.node_maps() == []
    assert r.payloads_for("s") == [IngestionStarted(ref(), 2, "a")]


def test_events_for_unowned_shards_are_ignored(two_node: ShardManager) -> None:
    two_node.stop_shards(ref(), [2])
    r = two_node.update_from_external_shard_event("a", IngestionStarted(ref(), 2, "a"))
    assert isinstance(r.reply, EventIgnored) and "not assigned" in r.reply.reason
    assert r.messages == ()
    assert two_node.mapper(ref()).status(2) == Stopped()  # type: ignore[union-attr]


def test_late_event_from_previous_owner_is_ignored() -> None:
    mgr = manager_with(["a", "b", "c"])
    mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2))
    assert owned(mgr) == {"b": [2, 3], "c": [0, 1]}
    mgr.stop_shards(ref(), [3])
    assert mgr.start_shards(ref(), "a", [3]).reply == ShardsStarted(ref(), "a", (3,))
    late = IngestionStopped(ref(), 3, "b")  # b's ingestion ended after the move
    r = mgr.update_from_external_shard_event("b", late)
    assert r.reply == EventIgnored(late, "shard 3 is owned by a, not by b")
    assert r.messages == ()
    assert mgr.mapper(ref()).status(3) == Assigned()  # type: ignore[union-attr]


def test_event_naming_another_node_is_ignored(two_node: ShardManager) -> None:
    r = two_node.update_from_external_shard_event("a", IngestionStarted(ref(), 2, "b"))
    assert isinstance(r.reply, EventIgnored) and r.messages == ()
    assert two_node.mapper(ref()).owner(2) == "a"  # type: ignore[union-attr]


def test_events_for_unknown_dataset_or_bad_shard_are_ignored(two_node: ShardManager) -> None:
    r = two_node.update_from_external_shard_event("a", IngestionStarted(ref("x"), 0, "a"))
    assert isinstance(r.reply, EventIgnored) and "unknown dataset" in r.reply.reason
    r = two_node.update_from_external_shard_event("a", IngestionStarted(ref(), 4, "a"))
    assert isinstance(r.reply, EventIgnored) and "invalid shard 4" in r.reply.reason


def test_recovery_progress_goes_to_subscribers_but_not_to_nodes(two_node: ShardManager) -> None:
    first = two_node.update_from_external_shard_event("a", RecoveryInProgress(ref(), 2, "a", 10))
    assert first.node_maps() == []  # Assigned -> Recovery: the node runs the shard either way
    assert first.payloads_for("s") == [RecoveryInProgress(ref(), 2, "a", 10)]
    tick = two_node.update_from_external_shard_event("a", RecoveryInProgress(ref(), 2, "a", 60))
    assert tick.node_maps() == []
    assert tick.payloads_for("s") == [RecoveryInProgress(ref(), 2, "a", 60)]
    assert two_node.mapper(ref()).status(2) == Recovery(60)  # type: ignore[union-attr]


def test_duplicate_event_changes_nothing_and_sends_nothing(two_node: ShardManager) -> None:
    two_node.update_from_external_shard_event("a", IngestionStarted(ref(), 2, "a"))
    r = two_node.update_from_external_shard_event("a", IngestionStarted(ref(), 2, "a"))
    assert r.messages == ()


# ----- ingestion errors --------------------------------------------------------------------------


def test_ingestion_error_moves_the_shard_to_a_node_with_room() -> None:
    clock = FakeClock()
    mgr = manager_with(["a", "b", "spare"], clock=clock)
    mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2))
    assert owned(mgr) == {"b": [2, 3], "spare": [0, 1]}
    mgr.remove_member("spare")  # free capacity: a has none, b is full
    assert owned(mgr) == {"a": [0, 1], "b": [2, 3]}
    mgr.add_member("c")
    mgr.subscribe("s", ref())
    r = mgr.update_from_external_shard_event("a", IngestionError(ref(), 0, "a", "boom"))
    assert owned(mgr) == {"a": [1], "b": [2, 3], "c": [0]}
    assert r.payloads_for("s") == [
        IngestionError(ref(), 0, "a", "boom"),
        ShardAssignmentStarted(ref(), 0, "c"),
    ]
    assert mgr.error_reassignments(ref()).done == 1
    assert r.node_maps("a")[0].shards() == [1]


def test_repeated_error_within_the_interval_is_not_reassigned_again() -> None:
    clock = FakeClock()
    mgr = manager_with(["a", "b", "c", "d"], clock=clock, reassignment_min_interval=3600)
    mgr.add_dataset(dataset(num_shards=2, min_num_nodes=2))
    assert owned(mgr) == {"c": [1], "d": [0]}
    mgr.update_from_external_shard_event("d", IngestionError(ref(), 0, "d", "e1"))
    assert mgr.mapper(ref()).owner(0) == "b"  # type: ignore[union-attr]
    clock.now += 3599
    r = mgr.update_from_external_shard_event("b", IngestionError(ref(), 0, "b", "e2"))
    m = mgr.mapper(ref())
    assert m.owner(0) is None and m.status(0) == Error("e2")  # type: ignore[union-attr]
    assert mgr.error_reassignments(ref()) == ErrorReassignmentStats(done=1, skipped=1)
    assert r.node_maps("b")[0].shards() == []


def test_error_reassignment_allowed_again_after_interval() -> None:
    clock = FakeClock()
    mgr = manager_with(["a", "b", "c", "d"], clock=clock, reassignment_min_interval=60)
    mgr.add_dataset(dataset(num_shards=2, min_num_nodes=2))
    assert owned(mgr) == {"c": [1], "d": [0]}
    mgr.update_from_external_shard_event("d", IngestionError(ref(), 0, "d", "x"))
    assert mgr.mapper(ref()).owner(0) == "b"  # type: ignore[union-attr]
    clock.now += 60
    mgr.update_from_external_shard_event("b", IngestionError(ref(), 0, "b", "y"))
    assert mgr.mapper(ref()).owner(0) == "d"  # type: ignore[union-attr]
    assert mgr.error_reassignments(ref()).done == 2


def test_error_without_spare_capacity_is_counted_as_skipped() -> None:
    mgr = manager_with(["a", "b"], clock=FakeClock())
    mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2))
    mgr.update_from_external_shard_event("a", IngestionError(ref(), 2, "a", "boom"))
    m = mgr.mapper(ref())
    assert m.owner(2) is None and m.status(2) == Error("boom")  # type: ignore[union-attr]
    assert mgr.error_reassignments(ref()).skipped == 1
    assert mgr.error_reassignments(ref()).done == 0


def test_default_reassignment_interval_is_two_hours() -> None:
    def second_error_after(seconds: float) -> str | None:
        clock = FakeClock()
        mgr = manager_with(["a", "b", "c"], clock=clock)
        mgr.add_dataset(dataset(num_shards=2, min_num_nodes=2))
        mgr.update_from_external_shard_event("c", IngestionError(ref(), 0, "c", "x"))
        assert mgr.mapper(ref()).owner(0) == "a"  # type: ignore[union-attr]
        clock.now += seconds
        mgr.update_from_external_shard_event("a", IngestionError(ref(), 0, "a", "y"))
        return mgr.mapper(ref()).owner(0)  # type: ignore[union-attr]

    assert second_error_after(2 * 3600 - 1) is None
    assert second_error_after(2 * 3600) == "c"


# ----- start / stop -----------------------------------------------------------------------------


@pytest.fixture
def three_nodes() -> ShardManager:
    mgr = manager_with(["a", "b", "c"])
    mgr.add_dataset(dataset(num_shards=8, min_num_nodes=2))
    assert owned(mgr) == {"b": [4, 5, 6, 7], "c": [0, 1, 2, 3]}
    return mgr


def rejected(result: Result) -> ShardRequestRejected:
    assert isinstance(result.reply, ShardRequestRejected), result.reply
    assert result.messages == ()
    return result.reply


def test_start_validations(three_nodes: ShardManager) -> None:
    mgr = three_nodes
    assert mgr.start_shards(ref("x"), "a", [0]).reply == DatasetUnknown(ref("x"))
    r = rejected(mgr.start_shards(ref(), "zz", [0]))
    assert r.reason is RejectReason.UNKNOWN_NODE and "'zz'" in r.message
    r = rejected(mgr.start_shards(ref(), "a", [1, 8, -1]))
    assert r.reason is RejectReason.INVALID_SHARDS
    assert "[8, -1]" in r.message and "0..7" in r.message
    r = rejected(mgr.start_shards(ref(), "a", []))
    assert r.reason is RejectReason.INVALID_SHARDS
    r = rejected(mgr.start_shards(ref(), "c", [0, 3]))
    assert r.reason is RejectReason.SAME_NODE
    r = rejected(mgr.start_shards(ref(), "a", [0]))
    assert r.reason is RejectReason.OWNED_BY_OTHER and "stop them first" in r.message
    assert owned(mgr) == {"b": [4, 5, 6, 7], "c": [0, 1, 2, 3]}


def test_start_rejects_repeated_shards(three_nodes: ShardManager) -> None:
    three_nodes.stop_shards(ref(), [0])
    r = rejected(three_nodes.start_shards(ref(), "a", [0, 0]))
    assert r.reason is RejectReason.INVALID_SHARDS and "[0]" in r.message


def test_stop_then_start_elsewhere(three_nodes: ShardManager) -> None:
    mgr = three_nodes
    stop = mgr.stop_shards(ref(), [0, 1])
    assert stop.reply == ShardsStopped(ref(), (0, 1))
    m = mgr.mapper(ref())
    assert m.status(0) == Stopped() and m.owner(0) is None  # type: ignore[union-attr]
    assert stop.node_maps("c")[0].shards() == [2, 3]
    start = mgr.start_shards(ref(), "a", [0, 1])
    assert start.reply == ShardsStarted(ref(), "a", (0, 1))
    assert owned(mgr) == {"a": [0, 1], "b": [4, 5, 6, 7], "c": [2, 3]}
    assert start.node_maps("a")[0].shards() == [0, 1]


def test_start_rejects_when_capacity_exceeded(three_nodes: ShardManager) -> None:
    mgr = three_nodes
    mgr.stop_shards(ref(), [4])
    r = rejected(mgr.start_shards(ref(), "c", [4]))  # c already holds 4 of max 4
    assert r.reason is RejectReason.CAPACITY_EXCEEDED and "'c'" in r.message
    mgr.stop_shards(ref(), [0, 1, 2, 3])
    r = rejected(mgr.start_shards(ref(), "a", [0, 1, 2, 3, 4]))  # more than 4 on one node
    assert r.reason is RejectReason.CAPACITY_EXCEEDED
    assert mgr.start_shards(ref(), "a", [0, 1, 2, 3]).reply == ShardsStarted(
        ref(), "a", (0, 1, 2, 3)
    )


def test_stop_validations(three_nodes: ShardManager) -> None:
    mgr = three_nodes
    assert mgr.stop_shards(ref("x"), [0]).reply == DatasetUnknown(ref("x"))
    r = rejected(mgr.stop_shards(ref(), [9]))
    assert r.reason is RejectReason.INVALID_SHARDS and "0..7" in r.message
    mgr.stop_shards(ref(), [0])
    r = rejected(mgr.stop_shards(ref(), [0, 1]))
    assert r.reason is RejectReason.NOT_ASSIGNED and "[0]" in r.message
    assert mgr.mapper(ref()).owner(1) == "c"  # type: ignore[union-attr]


def test_stopped_shards_stay_stopped_through_member_changes(three_nodes: ShardManager) -> None:
    """FiloDB: a stopped shard stays stopped until an operator starts it (it used to go Down,
    and the next join or leave took it)."""
    mgr = three_nodes
    mgr.stop_shards(ref(), [0, 1])
    joined = mgr.add_member("d")
    assert joined.reply == MemberAdded("d", ())
    mgr.remove_member("b")  # b's shards are reassigned; the stopped ones are not
    m = mgr.mapper(ref())
    assert m is not None
    assert [(m.owner(s), m.status(s)) for s in (0, 1)] == [(None, Stopped())] * 2
    assert owned(mgr) == {"c": [2, 3], "d": [4, 5, 6, 7]}
    assert mgr.start_shards(ref(), "a", [0, 1]).reply == ShardsStarted(ref(), "a", (0, 1))


# ----- recovery ---------------------------------------------------------------------------------


def test_recover_shards_installs_a_map_into_a_fresh_manager() -> None:
    old = manager_with(["a", "b"])
    ds = dataset(num_shards=4, min_num_nodes=2)
    old.add_dataset(ds)
    old.update_from_external_shard_event("a", IngestionStarted(ref(), 2, "a"))
    saved = old.mapper(ref())
    assert saved is not None

    new = ShardManager()
    assert new.recover_shards(ref(), saved).reply == DatasetUnknown(ref())
    result = new.recover_shards(ref(), saved.snapshot(), dataset=ds)
    assert result.reply == ShardsRecovered(ref(), True, saved.version + 1)
    assert new.mapper(ref()) == saved
    assert {m.node for m in result.node_maps()} == {"a", "b"}
    # Members re-join after recovery: their shards stay where they were.
    new.add_member("a")
    new.add_member("b")
    assert new.mapper(ref()) == saved
    assert new.remove_stale_coordinators(["a", "b"]).reply == StaleNodesRemoved(())


def test_recover_shards_keeps_the_newest_version() -> None:
    mgr = manager_with(["a", "b"])
    mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2))
    current = mgr.mapper(ref())
    assert current is not None
    stale = ShardMapper(4)
    stale.update_from_event(IngestionStarted(ref(), 0, "zzz"))
    r = mgr.recover_shards(ref(), stale)
    assert r.reply == ShardsRecovered(ref(), False, current.version)
    assert mgr.mapper(ref()) == current
    newer = current.copy()
    newer.advance_version(current.version + 10)
    newer.update_from_event(IngestionStarted(ref(), 0, "b"))
    assert mgr.recover_shards(ref(), newer).reply == ShardsRecovered(
        ref(), True, current.version + 12
    )
    assert mgr.mapper(ref()) == newer
    with pytest.raises(ValueError, match="8 shards"):
        big = ShardMapper(8)
        big.advance_version(10_000)
        mgr.recover_shards(ref(), big)


def test_recover_subscriptions_from_a_guardian() -> None:
    old = manager_with(["a"])
    old.add_dataset(dataset(num_shards=2, min_num_nodes=1))
    old.subscribe_all("guardian")
    changes = old.subscribe("q1", ref()).payloads_for("guardian")
    state = changes[-1]
    assert isinstance(state, SubscriptionsChanged) and state.subscribers(ref()) == ("q1",)

    new = ShardManager()
    new.add_dataset(dataset(num_shards=2, min_num_nodes=1))
    new.subscribe("q2", ref())
    result = new.recover_subscriptions(state)
    assert set(new.subscribers(ref())) == {"q1", "q2"}
    assert new.watchers == ("guardian",)
    snap = new.snapshot(ref())
    assert result.payloads_for("guardian") == [snap, new.subscription_state()]
    assert result.payloads_for("q1") == [snap]  # recovered: a fresh snapshot at once
    assert result.payloads_for("q2") == []  # subscribed to this singleton: already has one
    again = new.recover_subscriptions(state)
    assert not any(isinstance(m.payload, SubscriptionsChanged) for m in again.messages)


def test_remove_stale_coordinators() -> None:
    old = manager_with(["a", "b", "c"])
    ds = dataset(num_shards=8, min_num_nodes=2)
    old.add_dataset(ds)
    saved = old.mapper(ref())
    assert saved is not None
    new = ShardManager()
    new.recover_shards(ref(), saved, dataset=ds)
    for n in ["a", "x"]:
        new.add_member(n)
    result = new.remove_stale_coordinators(live_nodes=["a"])
    assert result.reply == StaleNodesRemoved(("x", "b", "c"))
    assert new.members == ("a",)
    # a takes b's shards, then is full (4 = 8 shards / 2 nodes); c's stay unowned.
    assert owned(new) == {"a": [4, 5, 6, 7]}
    assert new.mapper(ref()).unassigned_shards() == [0, 1, 2, 3]  # type: ignore[union-attr]
    finals = {m.node: m.shards() for m in result.node_maps()}
    assert finals == {"a": [4, 5, 6, 7], "b": [], "c": []}


# ----- plumbing ---------------------------------------------------------------------------------


def test_results_pickle_for_ray() -> None:
    mgr = manager_with(["a", "b"])
    mgr.subscribe_all("g")
    results = [
        mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2)),
        mgr.subscribe("s", ref()),
        mgr.update_from_external_shard_event("a", IngestionError(ref(), 2, "a", "x")),
        mgr.stop_shards(ref(), [0, 9]),
        mgr.remove_member("b"),
    ]
    for r in results:
        assert pickle.loads(pickle.dumps(r)) == r


def test_custom_strategy_is_used() -> None:
    class EverythingToTheFirstAsked:
        def shard_assignments(self, node, dataset, mapper):
            return mapper.unassigned_shards()

        def remaining_capacity(self, node, dataset, mapper):
            return dataset.num_shards

    mgr = manager_with(["a", "b"], strategy=EverythingToTheFirstAsked())
    mgr.add_dataset(dataset(num_shards=4, min_num_nodes=2))
    assert owned(mgr) == {"b": [0, 1, 2, 3]}


def test_same_calls_give_the_same_results() -> None:
    def run() -> list[Result]:
        mgr = manager_with(["n1", "n2", "n3"], clock=FakeClock())
        out = [mgr.add_dataset(dataset(num_shards=16, min_num_nodes=3)), mgr.subscribe_all("g")]
        out.append(mgr.update_from_external_shard_event("n3", IngestionError(ref(), 0, "n3", "x")))
        out.append(mgr.remove_member("n2"))
        out.append(mgr.add_member("n4"))
        return out

    assert run() == run()


def test_node_map_helpers() -> None:
    mgr = manager_with(["a"])
    ds = dataset(num_shards=2, min_num_nodes=1)
    (m,) = mgr.add_dataset(ds).node_maps()
    assert isinstance(m, NodeShardMap) and m.version == m.state.version
    gone = NodeShardMap("a", ref(), ds, m.state, removed=True)
    assert gone.shards() == [] and gone.ingesting_shards() == []


def test_late_ingestion_stopped_after_a_restart_on_the_same_node_is_ignored() -> None:
    mgr = ShardManager()
    mgr.add_member("a")
    mgr.add_dataset(dataset("one", num_shards=4, min_num_nodes=1))
    mgr.update_from_external_shard_event("a", IngestionStarted(ref("one"), 0, "a"))
    mgr.stop_shards(ref("one"), [0])
    mgr.start_shards(ref("one"), "a", [0])
    late = mgr.update_from_external_shard_event("a", IngestionStopped(ref("one"), 0, "a"))
    assert isinstance(late.reply, EventIgnored)
    assert isinstance(mgr.mapper(ref("one")).status(0), Assigned)
    mgr.update_from_external_shard_event("a", IngestionStarted(ref("one"), 0, "a"))
    assert isinstance(mgr.mapper(ref("one")).status(0), Active)
