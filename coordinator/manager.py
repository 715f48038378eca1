"""The shard manager: the cluster singleton's decisions about shards, as a functional core.

Every public method updates the manager's state and returns a ``Result``: an optional ``reply``
for the caller and the ``messages`` to deliver, as plain frozen data. The Ray actor that wraps
the manager only delivers them, so every rule here is testable without a cluster.

Nodes always receive the *full* shard map of a dataset (``NodeShardMap``, versioned), never
"start shard 3" / "stop shard 5" commands: incremental commands drift as soon as one is lost,
while a full map lets a node converge by diffing what it runs against what it should run. A map
goes out only when the set of shards some node must run changes (an owner, or a shard going
between ingesting and not ingesting): status progress such as Assigned -> Recovery -> Active or
Degraded reaches subscribers as events, and the actor's periodic resync carries it to nodes. So
a report costs O(1) here, whatever the number of shards (65536 at most).
Subscribers get a ``CurrentShardSnapshot`` when they subscribe and then every ``ShardEvent``.
Guardians (``subscribe_all``) also get ``SubscriptionsChanged`` so a restarted singleton can
rebuild its subscriber lists from them (``recover_subscriptions``).

Planned moves (handoffs, operator drains, rebalancing) are decided in ``coordinator.moves``,
which keeps their bookkeeping; the manager applies what it decides, so membership, datasets,
start/stop and publishing stay here, and the move workflow can be read (and tested) alone.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from coordinator.messages import (
    DatasetExists,
    DatasetRemoved,
    DatasetUnknown,
    DatasetVerified,
    EventApplied,
    EventIgnored,
    EventsApplied,
    MemberAdded,
    MemberRemoved,
    Message,
    MovesForced,
    MovesStarted,
    NodeShardMap,
    NodeUnknown,
    RejectReason,
    Reply,
    Result,
    ShardRequestRejected,
    ShardsRecovered,
    ShardsStarted,
    ShardsStopped,
    StaleNodesRemoved,
    Subscribed,
    SubscriberMessage,
    SubscriptionsChanged,
    Unsubscribed,
)
from coordinator.moves import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_MAX_CONCURRENT_MOVES,
    DEFAULT_MOVE_COOLDOWN,
    Action,
    ShardMoves,
    handoff_report,
    is_target_report,
)
from coordinator.rebalance import Plan
from coordinator.strategy import (
    DefaultShardAssignmentStrategy,
    ShardAssignmentStrategy,
    assignment_order,
)
from coordinator.subscriptions import ShardSubscriptions
from core.dataset import Dataset, DatasetRef
from core.mapper import ShardMapper
from core.shard_status import (
    CurrentShardSnapshot,
    Handoff,
    IngestionDegraded,
    IngestionError,
    IngestionStarted,
    IngestionStopped,
    RecoveryInProgress,
    ShardAssignmentStarted,
    ShardDown,
    ShardDrained,
    ShardEvent,
    ShardHandoffStarted,
    ShardMapState,
    ShardStatus,
    Stopped,
)
from store.api import OwnershipChange

__all__ = ["DEFAULT_REASSIGNMENT_MIN_INTERVAL", "ErrorReassignmentStats", "ShardManager"]

Clock = Callable[[], float]
DEFAULT_REASSIGNMENT_MIN_INTERVAL = 2 * 60 * 60.0  # seconds


@dataclass(slots=True)
class ErrorReassignmentStats:
    done: int = 0
    skipped: int = 0


@dataclass(slots=True)
class _Pending:
    """What one call changed in one dataset, published when the call ends."""

    prior_owners: frozenset[str]
    start_version: int
    events: list[tuple[ShardEvent, int]] = field(default_factory=list)
    snapshot_to_subscribers: bool = False
    nodes_need_map: bool = False


_OWNER_SETTING = (ShardAssignmentStarted, IngestionStarted, RecoveryInProgress, IngestionDegraded)


class ShardManager:
    """Owns every dataset's shard map, the member list and the subscriptions.

    Single-threaded and deterministic: time only enters through ``clock`` (seconds).
    """

    def __init__(
        self,
        strategy: ShardAssignmentStrategy | None = None,
        *,
        reassignment_min_interval: float | timedelta = DEFAULT_REASSIGNMENT_MIN_INTERVAL,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        max_concurrent_moves: int = DEFAULT_MAX_CONCURRENT_MOVES,
        move_cooldown: float = DEFAULT_MOVE_COOLDOWN,
        clock: Clock = time.time,
    ) -> None:
        self._strategy: ShardAssignmentStrategy = strategy or DefaultShardAssignmentStrategy()
        if isinstance(reassignment_min_interval, timedelta):
            reassignment_min_interval = reassignment_min_interval.total_seconds()
        self._min_interval = float(reassignment_min_interval)
        self._clock = clock
        self._members: dict[str, None] = {}  # deployment order, newest last
        self._datasets: dict[DatasetRef, Dataset] = {}
        self._mappers: dict[DatasetRef, ShardMapper] = {}
        self._subs = ShardSubscriptions()
        self._reassigned_at: dict[tuple[DatasetRef, int], float] = {}
        self._error_stats: dict[DatasetRef, ErrorReassignmentStats] = {}
        self._retired_versions: dict[DatasetRef, int] = {}
        self._pending: dict[DatasetRef, _Pending] = {}
        self._direct: list[Message] = []
        self._versions: dict[str, str] = {}  # member -> the version its node advertises
        # The move workflow (handoffs, drains, rebalancing): reads these maps, never writes them.
        self._moves = ShardMoves(
            self._mappers,
            clock,
            drain_timeout=drain_timeout,
            max_concurrent_moves=max_concurrent_moves,
            move_cooldown=move_cooldown,
        )
        # Ownership history: why the current call changes owners, the changes waiting for
        # their new owner's epoch (reported when it goes live), and those ready to record.
        self._why = ""
        self._open_changes: dict[tuple[DatasetRef, int], OwnershipChange] = {}
        self._history: list[OwnershipChange] = []
        # A shard's changes get strictly increasing times (ms): a leave and the takeover in the
        # same millisecond still read back newest first (the stores order by time only).
        self._last_change_ms: dict[tuple[DatasetRef, int], int] = {}

    # ----- read-only views ------------------------------------------------------------------

    @property
    def members(self) -> tuple[str, ...]:
        """Member nodes, oldest first."""
        return tuple(self._members)

    @property
    def datasets(self) -> dict[DatasetRef, Dataset]:
        return dict(self._datasets)

    def dataset(self, ref: DatasetRef) -> Dataset | None:
        return self._datasets.get(ref)

    def mapper(self, ref: DatasetRef) -> ShardMapper | None:
        """A copy of the dataset's shard map (the manager's own is never handed out)."""
        m = self._mappers.get(ref)
        return None if m is None else m.copy()

    def snapshot(self, ref: DatasetRef) -> CurrentShardSnapshot | DatasetUnknown:
        m = self._mappers.get(ref)
        return DatasetUnknown(ref) if m is None else CurrentShardSnapshot(ref, m.snapshot())

    def subscribers(self, ref: DatasetRef) -> tuple[str, ...]:
        return self._subs.subscribers(ref)

    @property
    def watchers(self) -> tuple[str, ...]:
        return self._subs.watchers

    @property
    def subscriptions(self) -> ShardSubscriptions:
        """Who listens to what: an immutable value, safe to hand out."""
        return self._subs

    def subscription_state(self) -> SubscriptionsChanged:
        return self._subs.as_message()

    def versions(self) -> dict[str, str]:
        """Each member's advertised version."""
        return {m: self._versions.get(m, "") for m in self._members}

    def handoffs(self) -> dict[tuple[DatasetRef, int], float]:
        """Planned moves in flight: (dataset, shard) -> when each began."""
        return self._moves.handoffs()

    def error_reassignments(self, ref: DatasetRef) -> ErrorReassignmentStats:
        s = self._error_stats.get(ref, ErrorReassignmentStats())
        return ErrorReassignmentStats(s.done, s.skipped)

    # ----- membership -----------------------------------------------------------------------

    def add_member(self, node: str, version: str = "") -> Result:
        """A node joined: remember it (newest last) and its version, and give it what the
        strategy recommends."""
        self._because("joined")
        self._members.setdefault(node, None)
        self._versions[node] = version
        assignments = []
        for ref, dataset in self._datasets.items():
            mapper = self._mappers[ref]
            shards = self._strategy.shard_assignments(node, dataset, mapper)
            if shards:
                self._begin(ref)
                for shard in shards:
                    self._apply(ref, ShardAssignmentStarted(ref, shard, node))
                assignments.append((ref, tuple(shards)))
            else:
                # Nothing changed for the others, but the newcomer still needs the definition
                # and the current map of every dataset.
                self._direct.append(NodeShardMap(node, ref, dataset, mapper.snapshot()))
        return self._finish(MemberAdded(node, tuple(assignments)))

    def remove_member(self, node: str, reason: str = "left") -> Result:
        """A node left: its shards go Down, then move to the others, newest node asked first.
        `reason` goes to the ownership history (e.g. "failed (no answer to pings)")."""
        self._because(reason)
        if node not in self._members and not any(
            m.num_shards_for_node(node) for m in self._mappers.values()
        ):
            return Result(reply=MemberRemoved(node, ()))
        self._members.pop(node, None)
        self._versions.pop(node, None)
        self._moves.undrain(node)
        freed = self._remove_node(node)
        return self._finish(MemberRemoved(node, freed))

    def _remove_node(self, node: str) -> tuple[tuple[DatasetRef, tuple[int, ...]], ...]:
        freed = []
        for ref, shard in self._moves.targeting(node):
            # The move's target left: the shard stays with its owner, which runs it again.
            owner = self._mappers[ref].owner(shard)
            self._begin(ref)
            self._apply(
                ref, ShardAssignmentStarted(ref, shard, owner, f"handoff cancelled: {node} left")
            )
        for ref in self._datasets:
            mapper = self._mappers[ref]
            shards = mapper.shards_for_node(node)
            if shards:
                self._begin(ref)
                for shard in shards:
                    if isinstance(mapper.status(shard), Stopped):
                        self._stop(ref, shard)  # stays stopped, now without an owner
                    else:
                        self._apply(ref, ShardDown(ref, shard, node))
                freed.append((ref, tuple(shards)))
            self._assign_unowned(ref)
        return tuple(freed)

    def remove_stale_coordinators(self, live_nodes: Iterable[str]) -> Result:
        """After a singleton fail-over: drop members and shard owners that are not alive."""
        self._because("failed (not alive after a singleton restart)")
        live = set(live_nodes)
        stale = [m for m in self._members if m not in live]
        owners: set[str] = set()
        for mapper in self._mappers.values():
            owners |= mapper.all_nodes()
        stale += sorted(owners - live - set(stale))
        for node in stale:
            self._members.pop(node, None)
        for node in stale:
            self._remove_node(node)
        return self._finish(StaleNodesRemoved(tuple(stale)))

    # ----- datasets ---------------------------------------------------------------------------

    def add_dataset(self, dataset: Dataset) -> Result:
        """Register a dataset and spread its shards over the members, newest member first."""
        self._because("created")
        ref = dataset.ref
        if ref in self._datasets:
            return Result(reply=DatasetExists(ref))
        # The first version is the creation time in microseconds (and past any version this
        # manager gave the name before): a re-created dataset's maps are newer than every map of
        # its predecessor, even one a node kept because it missed the removal while out of the
        # cluster and a singleton restart since forgot the old version.
        first = max(self._retired_versions.pop(ref, 0), int(self._clock() * 1_000_000))
        self._install(dataset, ShardMapper(dataset.num_shards, first))
        pending = self._begin(ref)
        pending.snapshot_to_subscribers = True
        pending.nodes_need_map = True
        self._assign_unowned(ref)
        return self._finish(DatasetVerified(ref))

    def _install(self, dataset: Dataset, mapper: ShardMapper) -> None:
        ref = dataset.ref
        self._datasets[ref] = dataset
        self._mappers[ref] = mapper
        self._error_stats.setdefault(ref, ErrorReassignmentStats())

    def remove_dataset(self, ref: DatasetRef) -> Result:
        """Take every shard down, tell nodes the dataset is gone and drop its subscriptions."""
        self._because("dataset removed")
        mapper = self._mappers.get(ref)
        if mapper is None:
            return Result(reply=DatasetUnknown(ref))
        pending = self._begin(ref)
        for shard in mapper.assigned_shards():
            self._apply(ref, ShardDown(ref, shard, mapper.owner(shard)))
        audience = self._audience(ref)
        self._pending.pop(ref)
        pending.nodes_need_map = False  # nodes get the final "removed" map below instead
        messages = self._publish(ref, pending)
        state, dataset = mapper.snapshot(), self._datasets[ref]
        messages += [SubscriberMessage(s, DatasetRemoved(ref), state.version) for s in audience]
        messages += [
            NodeShardMap(node, ref, dataset, state, removed=True)
            for node in self._node_audience(pending, mapper)
        ]
        self._retired_versions[ref] = mapper.version + 1
        del self._datasets[ref], self._mappers[ref]
        self._last_change_ms = {k: v for k, v in self._last_change_ms.items() if k[0] != ref}
        had_subscribers = bool(self._subs.subscribers(ref))
        self._subs = self._subs.without_dataset(ref)
        self._error_stats.pop(ref, None)
        self._moves.forget_dataset(ref)
        self._reassigned_at = {k: v for k, v in self._reassigned_at.items() if k[0] != ref}
        if had_subscribers:
            messages += self._subscriptions_changed()
        return Result(tuple(messages), DatasetRemoved(ref))

    # ----- subscriptions ----------------------------------------------------------------------

    def subscribe(self, subscriber: str, ref: DatasetRef) -> Result:
        """A snapshot now, then every change; ``DatasetUnknown`` if there is no such dataset."""
        mapper = self._mappers.get(ref)
        if mapper is None:
            unknown = DatasetUnknown(ref)
            return Result((SubscriberMessage(subscriber, unknown),), unknown)
        is_new = subscriber not in self._subs.subscribers(ref)
        self._subs = self._subs.subscribe(subscriber, ref)
        state = mapper.snapshot()
        messages: list[Message] = [
            SubscriberMessage(subscriber, CurrentShardSnapshot(ref, state), state.version)
        ]
        if is_new:
            messages += self._subscriptions_changed()
        return Result(tuple(messages), Subscribed(ref))

    def subscribe_all(self, subscriber: str) -> Result:
        """Every dataset's snapshot and events, plus subscription changes (for guardians)."""
        is_new = subscriber not in self._subs.watchers
        self._subs = self._subs.watch(subscriber)
        messages: list[Message] = []
        for ref, mapper in self._mappers.items():
            state = mapper.snapshot()
            messages.append(
                SubscriberMessage(subscriber, CurrentShardSnapshot(ref, state), state.version)
            )
        if is_new:
            messages += self._subscriptions_changed()
        else:
            messages.append(SubscriberMessage(subscriber, self.subscription_state()))
        return Result(tuple(messages), Subscribed(None))

    def unsubscribe(self, subscriber: str, ref: DatasetRef | None = None) -> Result:
        """Drop a subscriber from one dataset, or from everything; fine if it is long gone."""
        before, self._subs = self._subs, self._subs.unsubscribe(subscriber, ref)
        messages = self._subscriptions_changed() if self._subs != before else []
        return Result(tuple(messages), Unsubscribed(subscriber))

    def recover_subscriptions(self, state: SubscriptionsChanged) -> Result:
        """Add subscriptions a guardian remembered from the previous singleton, and send each
        recovered subscriber a fresh snapshot of its datasets: what it holds came from the old
        singleton, whose versions and in-flight events this one never saw. Subscribers of a
        dataset not known yet get their snapshot when it is added."""
        before, self._subs = self._subs, self._subs.merged(state)
        messages: list[Message] = []
        for ref, subs in state.by_dataset:
            messages += self._snapshots(ref, subs)
        for ref in self._mappers:
            messages += self._snapshots(ref, state.watchers)
        if self._subs.as_message() != before.as_message():
            messages += self._subscriptions_changed()
        return Result(tuple(messages))

    def snapshots_to_subscribers(self) -> Result:
        """A fresh ``CurrentShardSnapshot`` of each dataset for each of its subscribers and for
        every watcher (one snapshot object per dataset, shared): the periodic heal for a lost
        event, and what subscribers need right after a singleton recovery. O(N) per dataset,
        so call it every publish interval, not per event."""
        messages: list[Message] = []
        for ref in self._mappers:
            messages += self._snapshots(ref, self._audience(ref))
        return Result(tuple(messages))

    def _snapshots(self, ref: DatasetRef, audience: Iterable[str]) -> list[Message]:
        mapper = self._mappers.get(ref)
        if mapper is None:
            return []
        state = mapper.snapshot()
        snap = CurrentShardSnapshot(ref, state)
        return [SubscriberMessage(s, snap, state.version) for s in audience]

    def _subscriptions_changed(self) -> list[Message]:
        state = self.subscription_state()
        return [SubscriberMessage(w, state) for w in self._subs.watchers]

    # ----- recovery ---------------------------------------------------------------------------

    def recover_shards(
        self,
        ref: DatasetRef,
        recovered: ShardMapper | ShardMapState,
        dataset: Dataset | None = None,
    ) -> Result:
        """Install a shard map remembered from the previous singleton; the newest version wins.

        Call it before re-adding members: ``dataset`` registers an unknown dataset without
        assigning anything, so the recovered owners stay in place.
        """
        known = self._datasets.get(ref)
        if known is None and dataset is None:
            return Result(reply=DatasetUnknown(ref))
        definition = known if known is not None else dataset
        assert definition is not None
        if isinstance(recovered, ShardMapState):
            mapper = ShardMapper.from_state(recovered)
        else:
            mapper = recovered.copy()
        if mapper.num_shards != definition.num_shards:
            raise ValueError(
                f"recovered map of {ref} has {mapper.num_shards} shards, "
                f"the dataset has {definition.num_shards}"
            )
        current = self._mappers.get(ref)
        if current is not None and mapper.version <= current.version:
            return Result(reply=ShardsRecovered(ref, False, current.version))
        # One step past the recovered version, so nodes that saw it take the republished map.
        mapper.advance_version(mapper.version + 1)
        prior = current.all_nodes() if current is not None else frozenset()
        self._install(definition, mapper)
        self._moves.restart_clocks(ref, mapper)
        pending = self._begin(ref)
        pending.prior_owners |= prior
        pending.snapshot_to_subscribers = True
        pending.nodes_need_map = True
        return self._finish(ShardsRecovered(ref, True, mapper.version))

    # ----- events from nodes ------------------------------------------------------------------

    def update_from_external_shard_event(self, sender: str, event: ShardEvent) -> Result:
        """Apply a status report from a node, if that node still owns the shard.

        On ``IngestionError`` the shard is offered to the other nodes, unless it was already
        moved because of an error within ``reassignment_min_interval`` (a shard that fails
        everywhere should not bounce around the cluster).
        """
        self._because("reported by the owner")
        ignored = self._event(sender, event)
        if ignored is not None:
            return Result(reply=ignored)
        return self._finish(EventApplied(event))

    def update_from_external_shard_events(
        self, sender: str, events: Sequence[ShardEvent]
    ) -> Result:
        """Apply many reports from one node, in order, and publish once: what a node sends
        when many shards change at a time (thousands recovering at once)."""
        self._because("reported by the owner")
        applied = 0
        ignored: list[EventIgnored] = []
        for event in events:
            why = self._event(sender, event)
            if why is None:
                applied += 1
            else:
                ignored.append(why)
        return self._finish(EventsApplied(applied, tuple(ignored)))

    def _event(self, sender: str, event: ShardEvent) -> EventIgnored | None:
        """Validate and apply one node report; the reason if it is ignored. O(1) in N."""
        ref, shard = event.ref, event.shard
        mapper = self._mappers.get(ref)
        if mapper is None:
            return EventIgnored(event, f"unknown dataset {ref}")
        if not 0 <= shard < mapper.num_shards:
            return EventIgnored(
                event, f"invalid shard {shard}, valid shards are 0..{mapper.num_shards - 1}"
            )
        owner = mapper.owner(shard)
        if owner is None:
            return EventIgnored(event, f"shard {shard} is not assigned to any node")
        status = mapper.status(shard)
        if owner != sender:
            if is_target_report(status, sender, event):
                return self._handoff_report(status, owner, sender, event)
            return EventIgnored(event, f"shard {shard} is owned by {owner}, not by {sender}")
        if isinstance(event, _OWNER_SETTING) and event.node != sender:
            return EventIgnored(event, f"event names node {event.node} but came from {sender}")
        if not mapper.status(shard).ingesting:
            # Stopped with its owner kept (a map from an older singleton): the node was told to
            # run nothing, so this report is about an ingester it is stopping. Only an
            # operator's start brings a stopped shard back.
            return EventIgnored(event, f"shard {shard} is stopped; start it to run it again")
        if isinstance(status, Handoff) or isinstance(event, ShardDrained):
            return self._handoff_report(status, owner, sender, event)
        if isinstance(event, IngestionStopped):
            # A node stops an ingester only when a map no longer has it running the shard (or
            # when it drains). Every map since the shard's current assignment to this node says
            # "run it", so the report is about an earlier ingester: applying it would stop the
            # current one and leave the shard Stopped on an owner that runs nothing.
            return EventIgnored(
                event, f"shard {shard} was assigned to {sender} again after that ingester stopped"
            )
        self._begin(ref)
        self._apply(ref, event)
        if isinstance(event, IngestionError):
            self._reassign_after_error(ref, shard, sender)
        return None

    def _reassign_after_error(self, ref: DatasetRef, shard: int, failed_node: str) -> None:
        self._because(f"error on {failed_node}")
        stats = self._error_stats[ref]
        now = self._clock()
        last = self._reassigned_at.get((ref, shard))
        if last is not None and now - last < self._min_interval:
            stats.skipped += 1
            return
        assignments = self._assign_unowned(ref, exclude=failed_node)
        if any(shard in shards for shards in assignments.values()):
            self._reassigned_at[(ref, shard)] = now
            stats.done += 1
        else:
            stats.skipped += 1

    # ----- planned moves (handoffs): decided by ShardMoves, applied here ------------------------

    def _handoff_report(
        self, status: ShardStatus, owner: str, sender: str, event: ShardEvent
    ) -> EventIgnored | None:
        """Apply a report about a shard in handoff as `handoff_report` says (the old owner's
        progress while it drains, or the target's while it starts the drained shard, changes
        nothing: the old owner answers queries until the target is live)."""
        action = handoff_report(status, owner, sender, event)
        if isinstance(action, str):
            return EventIgnored(event, action)
        ref, shard = event.ref, event.shard
        self._begin(ref)
        if action is Action.DRAINED:
            assert isinstance(status, Handoff)
            if status.target in self._members:
                # The target starts the shard now (new epoch, from the checkpoints just written)
                # while the old owner keeps answering queries; it takes over once live.
                self._apply(ref, event)
            else:
                self._hand_over(ref, shard, sender, status.target, "target gone")
            return None
        self._apply(ref, event)
        if action is Action.FAILED:
            self._reassign_after_error(ref, shard, sender)
        return None

    def _hand_over(self, ref: DatasetRef, shard: int, source: str, target: str, why: str) -> None:
        """Give a handed-off shard to its target; if the target left meanwhile, to whoever the
        strategy picks (the old owner included: it starts from the checkpoints it wrote)."""
        self._because(why)
        if target in self._members:
            self._apply(ref, ShardAssignmentStarted(ref, shard, target, why))
            return
        self._apply(ref, ShardDown(ref, shard, source))
        self._assign_unowned(ref)

    def plan(
        self,
        ref: DatasetRef,
        *,
        add_nodes: int = 0,
        remove_nodes: Sequence[str] = (),
        drain_nodes: Sequence[str] = (),
        budget: int | None = None,
    ) -> Plan | DatasetUnknown:
        """What a rebalance would do now, or after `add_nodes` new nodes joined and
        `remove_nodes` left, without applying anything (`ShardMoves.plan`)."""
        mapper = self._mappers.get(ref)
        if mapper is None:
            return DatasetUnknown(ref)
        return self._moves.plan(
            mapper,
            self._datasets[ref],
            self.versions(),
            self._strategy,
            add_nodes=add_nodes,
            remove_nodes=remove_nodes,
            drain_nodes=drain_nodes,
            budget=budget,
        )

    def rebalance(
        self,
        refs: Sequence[DatasetRef] | None = None,
        *,
        balance: bool = True,
        loads: Mapping[DatasetRef, Mapping[int, float]] | None = None,
    ) -> Result:
        """Start the handoffs that empty draining nodes (`drain_node`) and, with `balance`,
        that narrow each dataset's spread over the other members, within the throttle: at
        most `max_concurrent_moves` in flight per dataset and cluster-wide. `loads` (samples/s
        per shard) makes the balance one of load rather than of shard counts, for the datasets
        it has any load for."""
        self._because("rebalance")
        started: list[tuple[DatasetRef, int, str, str]] = []
        held: list[tuple[DatasetRef, str]] = []
        nodes = self.versions()
        for ref in refs if refs is not None else list(self._datasets):
            mapper = self._mappers.get(ref)
            if mapper is None:
                continue
            # One dataset at a time, each applied before the next is planned: the moves it
            # starts take throttle slots from the next.
            moves, held_back = self._moves.next_moves(
                ref, mapper, nodes, balance=balance, load=(loads or {}).get(ref)
            )
            if held_back is not None:
                held.append((ref, held_back))
            if moves:
                self._begin(ref)
            for move, why in moves:
                event = ShardHandoffStarted(ref, move.shard, move.source, move.target, why)
                self._apply(ref, event)
                started.append((ref, move.shard, move.source, move.target))
        return self._finish(MovesStarted(tuple(started), tuple(held)))

    def free_move_slots(self, ref: DatasetRef) -> int:
        """How many handoffs of `ref` the throttle allows to start now."""
        return self._moves.free_slots(ref)

    @property
    def draining_nodes(self) -> frozenset[str]:
        """Members an operator is emptying (`drain_node`)."""
        return self._moves.draining

    def drain_node(self, node: str, *, cancel: bool = False) -> Result:
        """An operator empties `node` for maintenance: its shards move off through handoffs
        (a few at a time, as the throttle allows, each round of `rebalance`) and it gets no
        new shards until it leaves or the drain is cancelled."""
        if node not in self._members:
            return Result(reply=NodeUnknown(node, tuple(self._members)))
        if cancel:
            self._moves.undrain(node)
            return Result(reply=MovesStarted(()))
        self._moves.drain(node)
        return self.rebalance(balance=False)

    def expire_handoffs(self) -> Result:
        """Force the handoffs whose old owner did not report drained within the drain timeout:
        the target takes the shard anyway, with a new epoch that fences the old owner off the
        store, and the event says so."""
        forced: list[tuple[DatasetRef, int, str, str]] = []
        for ref, shard, source, target, why in self._moves.overdue():
            self._begin(ref)
            self._hand_over(ref, shard, source, target, why)
            forced.append((ref, shard, source, target))
        return self._finish(MovesForced(tuple(forced)))

    # ----- operator requests ------------------------------------------------------------------

    def start_shards(self, ref: DatasetRef, node: str, shards: Sequence[int]) -> Result:
        """Start unowned shards on ``node`` (FiloDB's StartShards, with its validations)."""
        self._because("operator")
        mapper = self._mappers.get(ref)
        if mapper is None:
            return Result(reply=DatasetUnknown(ref))
        if node not in self._members:
            return self._reject(
                ref,
                RejectReason.UNKNOWN_NODE,
                f"node {node!r} is not a member; members are {sorted(self._members)}",
            )
        bad = self._check_shards(ref, mapper, shards)
        if bad is not None:
            return bad
        # A Stopped shard may keep its owner (maps from older singletons), but nothing runs it:
        # it can be started anywhere, that owner included.
        same = [s for s in shards if mapper.owner(s) == node and mapper.is_ingesting(s)]
        if same:
            return self._reject(
                ref, RejectReason.SAME_NODE, f"shards {same} already run on node {node!r}"
            )
        taken = [(s, mapper.owner(s)) for s in shards if mapper.is_ingesting(s)]
        if taken:
            listing = ", ".join(f"{s} on {o!r}" for s, o in taken)
            return self._reject(
                ref,
                RejectReason.OWNED_BY_OTHER,
                f"cannot start shards on {node!r}: {listing}; stop them first",
            )
        capacity = self._strategy.remaining_capacity(node, self._datasets[ref], mapper)
        if len(shards) > capacity:
            return self._reject(
                ref,
                RejectReason.CAPACITY_EXCEEDED,
                f"capacity exceeded: node {node!r} can take {capacity} more shard(s) of {ref}, "
                f"asked for {len(shards)}",
            )
        self._begin(ref)
        for shard in shards:
            self._apply(ref, ShardAssignmentStarted(ref, shard, node))
        return self._finish(ShardsStarted(ref, node, tuple(shards)))

    def stop_shards(self, ref: DatasetRef, shards: Sequence[int]) -> Result:
        """Take shards away from their nodes: Stopped and unowned, and they stay so (node joins
        and leaves do not pick them up) until an operator starts them, as in FiloDB."""
        self._because("operator")
        mapper = self._mappers.get(ref)
        if mapper is None:
            return Result(reply=DatasetUnknown(ref))
        bad = self._check_shards(ref, mapper, shards)
        if bad is not None:
            return bad
        idle = [s for s in shards if mapper.owner(s) is None]
        if idle:
            return self._reject(
                ref,
                RejectReason.NOT_ASSIGNED,
                f"cannot stop shards {idle}: not assigned to any node",
            )
        self._begin(ref)
        for shard in shards:
            self._stop(ref, shard)
        return self._finish(ShardsStopped(ref, tuple(shards)))

    def _stop(self, ref: DatasetRef, shard: int) -> None:
        """Owned -> Stopped without an owner, as two plain events every subscriber applies the
        same way: ``ShardDown`` (owner cleared) then ``IngestionStopped`` (no owner to keep)."""
        mapper = self._mappers[ref]
        owner = mapper.owner(shard)
        if owner is not None:
            self._apply(ref, ShardDown(ref, shard, owner))
        self._apply(ref, IngestionStopped(ref, shard, None))

    def _check_shards(
        self, ref: DatasetRef, mapper: ShardMapper, shards: Sequence[int]
    ) -> Result | None:
        n = mapper.num_shards
        invalid = [s for s in shards if not 0 <= s < n]
        if not shards or invalid:
            what = f"invalid shards {invalid}" if invalid else "no shards given"
            return self._reject(
                ref, RejectReason.INVALID_SHARDS, f"{what}; valid shards of {ref} are 0..{n - 1}"
            )
        dupes = sorted(s for s, count in Counter(shards).items() if count > 1)
        if dupes:
            return self._reject(ref, RejectReason.INVALID_SHARDS, f"shards repeated: {dupes}")
        return None

    @staticmethod
    def _reject(ref: DatasetRef, reason: RejectReason, message: str) -> Result:
        return Result(reply=ShardRequestRejected(ref, reason, message))

    # ----- internals --------------------------------------------------------------------------

    def _assign_unowned(self, ref: DatasetRef, exclude: str | None = None) -> dict[str, list[int]]:
        """Offer unowned shards to members, newest version and newest member first, applying
        each answer before the next."""
        mapper = self._mappers[ref]
        dataset = self._datasets[ref]
        assignments: dict[str, list[int]] = {}
        candidates = {n: v for n, v in self.versions().items() if not self._moves.is_draining(n)}
        for node in assignment_order(candidates):
            if mapper.num_assignable_shards == 0:
                break
            if node == exclude:
                continue
            shards = self._strategy.shard_assignments(node, dataset, mapper)
            if shards:
                self._begin(ref)
                for shard in shards:
                    self._apply(ref, ShardAssignmentStarted(ref, shard, node))
                assignments[node] = shards
        return assignments

    def _begin(self, ref: DatasetRef) -> _Pending:
        pending = self._pending.get(ref)
        if pending is None:
            mapper = self._mappers[ref]
            pending = _Pending(mapper.all_nodes(), mapper.version)
            self._pending[ref] = pending
        return pending

    def _apply(self, ref: DatasetRef, event: ShardEvent) -> None:
        mapper = self._mappers[ref]
        pending = self._pending[ref]
        shard = event.shard
        owner, status = mapper.owner(shard), mapper.status(shard)
        if not mapper.update_from_event(event):
            return
        pending.events.append((event, mapper.version))
        new_status = mapper.status(shard)
        self._note_ownership(ref, shard, owner, mapper.owner(shard), event)
        self._moves.track(ref, shard, new_status, event)
        # Only a change to what some node must run needs the full map (O(N) to build and
        # ship): an owner change, a shard starting or stopping ingestion, or any step of a
        # handoff. Progress such as Assigned -> Recovery -> Active or Degraded does not.
        if (
            mapper.owner(shard) != owner
            or new_status.ingesting != status.ingesting
            or isinstance(new_status, Handoff)
            or isinstance(status, Handoff)
        ):
            pending.nodes_need_map = True

    def _note_ownership(
        self,
        ref: DatasetRef,
        shard: int,
        before: str | None,
        after: str | None,
        event: ShardEvent,
    ) -> None:
        """Keep the ownership history: a change of owner, completed with the new owner's epoch
        and replayed offsets when it reports live (or at once if nobody owns the shard)."""
        key = (ref, shard)
        started = event if isinstance(event, IngestionStarted) else None
        if before == after:
            opened = self._open_changes.get(key)
            if opened is not None and started is not None and opened.to_node == after:
                del self._open_changes[key]
                self._history.append(_with_epoch(opened, started))
            return
        opened = self._open_changes.pop(key, None)
        if opened is not None:
            self._history.append(opened)  # superseded before its owner went live
        if isinstance(event, ShardAssignmentStarted) and event.reason:
            why = event.reason
        elif isinstance(event, IngestionError):
            why = f"error: {event.message}" if event.message else "error"
        elif started is not None:
            why = self._moves.reason(ref, shard, self._why)
        else:
            why = self._why
        at_ms = max(int(self._clock() * 1000), self._last_change_ms.get(key, -1) + 1)
        self._last_change_ms[key] = at_ms
        change = OwnershipChange(ref.name, shard, at_ms, before, after, why or "unknown")
        if after is None:
            self._history.append(change)
        elif started is not None:
            self._history.append(_with_epoch(change, started))
        else:
            self._open_changes[key] = change

    def _because(self, why: str) -> None:
        """Why the ownership changes of the current call happen (for the history)."""
        self._why = why

    def _audience(self, ref: DatasetRef) -> tuple[str, ...]:
        return self._subs.audience(ref)

    def _node_audience(self, pending: _Pending, mapper: ShardMapper) -> list[str]:
        """Members, plus any node that holds or held shards of the dataset in this change."""
        extra = (pending.prior_owners | mapper.all_nodes()).difference(self._members)
        return [*self._members, *sorted(extra)]

    def _publish(self, ref: DatasetRef, pending: _Pending) -> list[Message]:
        mapper = self._mappers[ref]
        audience = self._audience(ref)
        messages: list[Message] = []
        if pending.snapshot_to_subscribers:
            state = mapper.snapshot()
            snap = CurrentShardSnapshot(ref, state)
            messages += [SubscriberMessage(s, snap, state.version) for s in audience]
        elif audience:
            for event, version in pending.events:
                messages += [SubscriberMessage(s, event, version) for s in audience]
        if pending.nodes_need_map:
            state, dataset = mapper.snapshot(), self._datasets[ref]
            messages += [
                NodeShardMap(node, ref, dataset, state)
                for node in self._node_audience(pending, mapper)
            ]
        return messages

    def _finish(self, reply: Reply | None) -> Result:
        messages: list[Message] = []
        for ref, pending in self._pending.items():
            messages += self._publish(ref, pending)
        messages += self._direct
        self._pending.clear()
        self._direct = []
        history, self._history = tuple(self._history), []
        self._why = ""
        return Result(tuple(messages), reply, history)


def _with_epoch(change: OwnershipChange, started: IngestionStarted) -> OwnershipChange:
    return OwnershipChange(
        change.dataset,
        change.shard,
        change.at_ms,
        change.from_node,
        change.to_node,
        change.reason,
        started.epoch,
        started.replayed_offsets,
    )
