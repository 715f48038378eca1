"""NodeGuardian mirrors the manager's feed well enough for a new singleton to recover from."""

from __future__ import annotations

from coordinator import ShardManager
from coordinator.guardian import NodeGuardian, merged_subscriptions, newest_maps
from filopy import IngestionStarted

from .support import dataset, ref


def _feed(guardian: NodeGuardian, result, name: str = "g") -> None:
    for m in result.messages:
        if getattr(m, "subscriber", None) == name:
            guardian.apply(m)


def test_guardian_mirrors_maps_and_subscriptions_through_changes() -> None:
    mgr = ShardManager()
    g = NodeGuardian()
    _feed(g, mgr.subscribe_all("g"))
    for node in ("a", "b", "c"):
        _feed(g, mgr.add_member(node))
    _feed(g, mgr.add_dataset(dataset("one", num_shards=8, min_num_nodes=3)))
    _feed(g, mgr.subscribe("client-1", ref("one")))
    _feed(g, mgr.update_from_external_shard_event("a", IngestionStarted(ref("one"), 0, "a")))
    _feed(g, mgr.remove_member("b"))

    state = g.state()
    assert state.map_for(ref("one")) == mgr.mapper(ref("one")).snapshot()
    assert state.subscriptions == mgr.subscription_state()
    assert state.subscriptions.subscribers(ref("one")) == ("client-1",)


def test_recovery_takes_the_newest_map_and_all_subscribers() -> None:
    mgr = ShardManager()
    early, late = NodeGuardian(), NodeGuardian()
    for name, g in (("early", early), ("late", late)):
        _feed(g, mgr.subscribe_all(name), name)
    mgr.add_member("a")
    r = mgr.add_dataset(dataset("one", num_shards=4, min_num_nodes=1))
    _feed(early, r, "early")
    _feed(late, r, "late")
    r = mgr.update_from_external_shard_event("a", IngestionStarted(ref("one"), 1, "a"))
    _feed(late, r, "late")  # "early" missed the last event
    r = mgr.subscribe("client-1", ref("one"))
    _feed(early, r, "early")  # and "late" missed the subscription

    states = [early.state(), late.state()]
    assert newest_maps(states)[ref("one")] == mgr.mapper(ref("one")).snapshot()
    subs = merged_subscriptions(states)
    assert subs.subscribers(ref("one")) == ("client-1",)
    assert set(subs.watchers) == {"early", "late"}
