"""Random interleavings of operator start/stop, member changes, node reports and singleton
restarts against simulated nodes (issue 11, item 5).

The nodes are small models of ``NodeCoordinator``: each keeps the newest ``NodeShardMap`` per
dataset and runs exactly its ``ingesting_shards()`` (stopping an ingester reports
``IngestionStopped``, a started one later reports ``RecoveryInProgress``, ``IngestionStarted``,
maybe ``IngestionDegraded`` or ``IngestionError``). Messages keep Ray's per-sender order (one
FIFO queue per direction and node) but are delivered at random times, so reports from earlier
ingesters and from former owners reach the manager after later decisions. A restarted singleton
recovers from an exact guardian mirror; maps the old one sent still arrive, in any order
relative to the new one's. Reports that are lost (and re-sent by the node's re-report) are out
of scope here: every report arrives.

After ``settle`` (everything delivered, every ingester caught up) the manager's map and the
nodes agree: a shard the map has some node ingesting runs on that node and nowhere else, every
other shard runs nowhere, and ``start_shards`` on a shard's owner answers ``same_node`` only
when that node really runs it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from coordinator.manager import ShardManager
from coordinator.messages import (
    NodeShardMap,
    RejectReason,
    Result,
    ShardRequestRejected,
    ShardsStarted,
    ShardsStopped,
    SubscriberMessage,
    SubscriptionsChanged,
)
from core.shard_status import (
    CurrentShardSnapshot,
    IngestionDegraded,
    IngestionError,
    IngestionStarted,
    IngestionStopped,
    RecoveryInProgress,
    ShardEvent,
)
from filopy import Dataset, ShardMapper

from .support import dataset

DATASETS = [
    dataset("small", num_shards=4, min_num_nodes=2),
    dataset("mid", num_shards=8, min_num_nodes=3),
]
BY_NAME = {d.name: d for d in DATASETS}
GUARDIAN = "guardian"
Key = tuple[str, int]  # (dataset name, shard)

NEW, RECOVERING, LIVE, FAILED = "new", "recovering", "live", "failed"


@dataclass
class SimNode:
    """A node coordinator: newest map per dataset, ingesters, and its two message queues."""

    name: str
    alive: bool = True
    inbox: deque[NodeShardMap] = field(default_factory=deque)  # from the current singleton
    stale: deque[NodeShardMap] = field(default_factory=deque)  # from a singleton since replaced
    outbox: deque[ShardEvent] = field(default_factory=deque)  # reports to the singleton
    held: dict[str, NodeShardMap] = field(default_factory=dict)
    running: dict[Key, str] = field(default_factory=dict)  # ingester state per shard

    def apply_map(self, m: NodeShardMap) -> None:
        """``NodeCoordinator.apply_map``: keep the newest version, run its ingesting shards."""
        held = self.held.get(m.ref.name)
        if held is not None and m.version <= held.version and not m.removed:
            return
        if m.removed:
            self.held.pop(m.ref.name, None)
        else:
            self.held[m.ref.name] = m
        wanted = set(m.ingesting_shards())
        running = {s for (name, s) in self.running if name == m.ref.name}
        for s in sorted(running - wanted):
            del self.running[(m.ref.name, s)]
            self.outbox.append(IngestionStopped(m.ref, s, self.name))
        for s in sorted(wanted - running):
            self.running[(m.ref.name, s)] = NEW

    def progress(self, key: Key, fail: bool = False, degrade: bool = False) -> None:
        """The ingester of ``key`` takes its next step and reports it."""
        ref, state = BY_NAME[key[0]].ref, self.running[key]
        if fail:
            self.running[key] = FAILED
            self.outbox.append(IngestionError(ref, key[1], self.name, "boom"))
        elif degrade:
            self.outbox.append(IngestionDegraded(ref, key[1], self.name, "store unavailable"))
        elif state == NEW:
            self.running[key] = RECOVERING
            self.outbox.append(RecoveryInProgress(ref, key[1], self.name, 50))
        elif state == RECOVERING:
            self.running[key] = LIVE
            self.outbox.append(IngestionStarted(ref, key[1], self.name))


class Interleavings(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.mgr = ShardManager()
        self.nodes: dict[str, SimNode] = {}
        self.joined = 0
        self.mirror: dict[str, ShardMapper] = {}  # the guardian's view, from its messages
        self.send(self.mgr.subscribe_all(GUARDIAN))

    # -- plumbing --

    def send(self, result: Result) -> Result:
        """What the actor does with a result: maps to node inboxes, the rest to the guardian."""
        for m in result.messages:
            if isinstance(m, NodeShardMap):
                node = self.nodes.get(m.node)
                if node is not None and node.alive:
                    node.inbox.append(m)
            elif isinstance(m, SubscriberMessage) and m.subscriber == GUARDIAN:
                p = m.payload
                if isinstance(p, CurrentShardSnapshot):
                    self.mirror[p.ref.name] = ShardMapper.from_state(p.state)
                elif isinstance(p, ShardEvent):
                    self.mirror[p.ref.name].update_from_event(p)
                elif not isinstance(p, SubscriptionsChanged):
                    self.mirror.pop(p.ref.name, None)  # DatasetRemoved
        return result

    def mapper(self, name: str) -> ShardMapper:
        m = self.mgr.mapper(BY_NAME[name].ref)
        assert m is not None
        return m

    def datasets(self) -> list[Dataset]:
        return [d for d in DATASETS if self.mgr.dataset(d.ref) is not None]

    def alive(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.alive]

    def report(self, node: SimNode, events: list[ShardEvent]) -> None:
        if len(events) == 1:
            self.send(self.mgr.update_from_external_shard_event(node.name, events[0]))
        else:
            self.send(self.mgr.update_from_external_shard_events(node.name, events))

    # -- the operator --

    @rule(d=st.sampled_from(DATASETS))
    def add_dataset(self, d: Dataset) -> None:
        self.send(self.mgr.add_dataset(d))

    @precondition(lambda self: self.datasets())
    @rule(data=st.data())
    def remove_dataset(self, data: st.DataObject) -> None:
        d = data.draw(st.sampled_from(self.datasets()))
        self.send(self.mgr.remove_dataset(d.ref))

    @precondition(lambda self: self.datasets() and self.mgr.members)
    @rule(data=st.data())
    def start_shards(self, data: st.DataObject) -> None:
        d = data.draw(st.sampled_from(self.datasets()))
        node = data.draw(st.sampled_from(self.mgr.members))
        shards = data.draw(st.lists(st.integers(0, d.num_shards - 1), min_size=1, max_size=2))
        before = self.mapper(d.name)
        result = self.send(self.mgr.start_shards(d.ref, node, sorted(set(shards))))
        reply = result.reply
        if isinstance(reply, ShardRequestRejected) and reply.reason is RejectReason.SAME_NODE:
            # Never a false same_node: the map really has that node running them.
            assert any(before.owner(s) == node and before.is_ingesting(s) for s in shards)
        if isinstance(reply, ShardsStarted):
            assert all(not before.is_ingesting(s) for s in shards)

    @precondition(lambda self: self.datasets())
    @rule(data=st.data())
    def stop_shards(self, data: st.DataObject) -> None:
        d = data.draw(st.sampled_from(self.datasets()))
        shards = data.draw(st.lists(st.integers(0, d.num_shards - 1), min_size=1, max_size=2))
        result = self.send(self.mgr.stop_shards(d.ref, sorted(set(shards))))
        if isinstance(result.reply, ShardsStopped):
            m = self.mapper(d.name)
            assert all(m.owner(s) is None and str(m.status(s)) == "Stopped" for s in shards)

    # -- membership --

    @rule()
    def join(self) -> None:
        self.joined += 1
        name = f"n{self.joined}"
        self.nodes[name] = SimNode(name)
        self.send(self.mgr.add_member(name))

    @precondition(lambda self: self.mgr.members)
    @rule(data=st.data(), crash=st.booleans())
    def leave(self, data: st.DataObject, crash: bool) -> None:
        """A crash kills the process (its reports in flight still arrive); otherwise the node
        was declared failed but lives on, quarantined, and may rejoin."""
        node = self.nodes[data.draw(st.sampled_from(self.mgr.members))]
        if crash:
            node.alive = False
            node.inbox.clear()
            node.stale.clear()
            node.running.clear()
            node.held.clear()
        self.send(self.mgr.remove_member(node.name))

    @precondition(lambda self: any(n.name not in self.mgr.members for n in self.alive()))
    @rule(data=st.data())
    def rejoin(self, data: st.DataObject) -> None:
        quarantined = [n.name for n in self.alive() if n.name not in self.mgr.members]
        self.send(self.mgr.add_member(data.draw(st.sampled_from(quarantined))))

    # -- deliveries and ingesters --

    @precondition(lambda self: any(n.inbox or n.stale for n in self.alive()))
    @rule(data=st.data())
    def deliver_map(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from([n for n in self.alive() if n.inbox or n.stale]))
        queues = [q for q in (node.inbox, node.stale) if q]
        node.apply_map(data.draw(st.sampled_from(queues)).popleft())

    @precondition(lambda self: any(n.outbox for n in self.nodes.values()))
    @rule(data=st.data())
    def deliver_reports(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from([n for n in self.nodes.values() if n.outbox]))
        count = data.draw(st.integers(1, len(node.outbox)))
        self.report(node, [node.outbox.popleft() for _ in range(count)])

    @precondition(lambda self: any(n.running for n in self.alive()))
    @rule(data=st.data(), how=st.sampled_from(["step", "step", "step", "fail", "degrade"]))
    def ingester(self, data: st.DataObject, how: str) -> None:
        node = data.draw(st.sampled_from([n for n in self.alive() if n.running]))
        key = data.draw(st.sampled_from(sorted(node.running)))
        if node.running[key] != FAILED:
            node.progress(key, fail=how == "fail", degrade=how == "degrade")

    @rule()
    def resync(self) -> None:
        """The actor's periodic resync: every member gets every current map."""
        for ref, ds in self.mgr.datasets.items():
            state = self.mgr.snapshot(ref).state  # type: ignore[union-attr]
            for name in self.mgr.members:
                self.send(Result((NodeShardMap(name, ref, ds, state),)))
        self.send(self.mgr.snapshots_to_subscribers())

    @rule()
    def singleton_restart(self) -> None:
        """A new singleton recovers the maps and subscriptions from the guardian, then re-adds
        every live node (as ``NodeClusterActor._recover``). The old one's maps still in flight
        may arrive before or after the new one's."""
        for node in self.alive():
            node.stale.extend(node.inbox)
            node.inbox.clear()
        self.mgr = ShardManager()
        for name, mirror in sorted(self.mirror.items()):
            self.send(self.mgr.recover_shards(BY_NAME[name].ref, mirror.snapshot(), BY_NAME[name]))
        self.send(self.mgr.recover_subscriptions(SubscriptionsChanged((), (GUARDIAN,))))
        for node in self.alive():
            self.send(self.mgr.add_member(node.name))
        self.send(self.mgr.remove_stale_coordinators([n.name for n in self.alive()]))

    # -- the check --

    @rule()
    def settle(self) -> None:
        """Deliver everything and let every ingester catch up, then compare map and nodes."""
        for _ in range(100):
            busy = False
            for node in self.alive():
                while node.stale or node.inbox:
                    node.apply_map((node.stale or node.inbox).popleft())
                    busy = True
                for key, state in sorted(node.running.items()):
                    if state in (NEW, RECOVERING):
                        node.progress(key)
                        busy = True
            for node in self.nodes.values():
                if node.outbox:
                    self.report(node, list(node.outbox))
                    node.outbox.clear()
                    busy = True
            if not busy:
                break
        else:
            raise AssertionError("the cluster did not settle")
        members = set(self.mgr.members)
        for d in self.datasets():
            m = self.mapper(d.name)
            for s in range(d.num_shards):
                runners = [n.name for n in self.alive() if (d.name, s) in n.running]
                owner = m.owner(s)
                assert owner is None or owner in members, (d.name, s, owner)
                if m.is_ingesting(s):
                    assert runners == [owner], (d.name, s, owner, runners, m.status(s))
                    assert self.nodes[owner].running[(d.name, s)] == LIVE, (d.name, s)
                    rejected = self.mgr.start_shards(d.ref, owner, [s]).reply
                    assert isinstance(rejected, ShardRequestRejected)
                    assert rejected.reason is RejectReason.SAME_NODE
                else:
                    assert runners == [], (d.name, s, owner, m.status(s), runners)
        for node in self.alive():
            for name, held in node.held.items():
                if self.mgr.dataset(BY_NAME[name].ref) is None:
                    # Removed while this node was out (not a member, owning nothing): it was
                    # not told, and its map has it running nothing of the dataset.
                    assert held.ingesting_shards() == [], (node.name, name)
                    continue
                ingesting = self.mapper(name).snapshot().ingesting_shards(node.name)
                assert held.ingesting_shards() == ingesting, (node.name, name)
            assert {name for name, _ in node.running} <= set(node.held)

    @invariant()
    def guardian_mirror_matches(self) -> None:
        assert set(self.mirror) == {d.name for d in self.datasets()}
        for d in self.datasets():
            assert self.mirror[d.name] == self.mapper(d.name)

    @invariant()
    def at_most_one_node_runs_a_shard_live(self) -> None:
        """Even mid-flight, two nodes never both run a shard the map has on one of them...
        unless the other is still to process the map that took it away."""
        for d in self.datasets():
            m = self.mapper(d.name)
            for s in range(d.num_shards):
                owner = m.owner(s)
                if owner is not None and m.is_ingesting(s):
                    for node in self.alive():
                        if node.name != owner and (d.name, s) in node.running:
                            assert node.inbox or node.stale, (d.name, s, owner, node.name)


Interleavings.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestInterleavings = Interleavings.TestCase
