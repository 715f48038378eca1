"""Planned shard moves: rebalancing, operator drains and the handoff protocol.

A planned move never leaves a shard without a server. Its owner drains it (a final flush and
checkpoint) while still answering queries: status ``Handoff(target)``. The target then starts it
from those checkpoints with a new epoch (``Handoff(target, drained)``) and owns it once live.

The ``ShardManager`` owns the shard maps and applies every event; it delegates the moves here.
``ShardMoves`` decides which moves to start (through the pure planner of
``coordinator.rebalance``) and which handoffs are overdue, and keeps the bookkeeping only moves
need: when each handoff began and why, when a shard last moved (the cooldown), the nodes an
operator is emptying, and the throttle. Which report a shard in handoff accepts, from whom, is
data (``REPORTS``), as dskit's ring keeps its allowed state transitions; `handoff_report` reads
it. Pure and synchronous, time from the clock passed in: unit-tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum, StrEnum
from typing import NamedTuple

from coordinator.rebalance import Move, Plan, evacuation_moves, plan_moves, version_key
from coordinator.strategy import ShardAssignmentStrategy, assignment_order
from core.dataset import Dataset, DatasetRef
from core.mapper import ShardMapper
from core.shard_status import (
    Active,
    Handoff,
    IngestionError,
    IngestionStarted,
    ShardAssignmentStarted,
    ShardDrained,
    ShardEvent,
    ShardHandoffStarted,
    ShardStatus,
)

__all__ = [
    "DEFAULT_DRAIN_TIMEOUT",
    "DEFAULT_MAX_CONCURRENT_MOVES",
    "DEFAULT_MOVE_COOLDOWN",
    "REPORTS",
    "Action",
    "Overdue",
    "Role",
    "ShardMoves",
    "Step",
    "handoff_report",
    "is_target_report",
]

DEFAULT_DRAIN_TIMEOUT = 60.0  # seconds a handoff waits for the old owner's drain
DEFAULT_MAX_CONCURRENT_MOVES = 4  # handoffs in flight, per dataset and cluster-wide
DEFAULT_MOVE_COOLDOWN = 300.0  # seconds a moved shard stays put before a rebalance moves it again

Key = tuple[DatasetRef, int]


class Step(StrEnum):
    """Where a handoff is, read from the shard's ``Handoff`` status."""

    DRAINING = "draining"  # the owner flushes and checkpoints, then reports ShardDrained
    WARMING = "warming"  # drained: the target starts the shard, the owner still answers queries


class Role(StrEnum):
    """Who reports about a shard in handoff."""

    OWNER = "owner"  # the node moving the shard away
    TARGET = "target"  # the node taking it; heard only once the owner drained


class Action(Enum):
    """What the manager does with an accepted report about a shard in handoff (not a str, so
    `handoff_report`'s answer tells an action from a reason to ignore the report)."""

    DRAINED = "drained"  # the target starts the shard now; if it left, the shard is placed anew
    LIVE = "live"  # the target is live: the move is done, the target owns the shard
    FAILED = "failed"  # an ingestion error ends the move as any error does: offered elsewhere


# The reports a shard in handoff accepts; every other report about it is ignored (with the
# reason `handoff_report` gives), so a late report from either side cannot undo a step.
REPORTS: Mapping[tuple[Step, Role, type[ShardEvent]], Action] = {
    (Step.DRAINING, Role.OWNER, ShardDrained): Action.DRAINED,
    (Step.DRAINING, Role.OWNER, IngestionError): Action.FAILED,
    (Step.WARMING, Role.OWNER, IngestionError): Action.FAILED,
    (Step.WARMING, Role.TARGET, IngestionStarted): Action.LIVE,
    (Step.WARMING, Role.TARGET, IngestionError): Action.FAILED,
}


def is_target_report(status: ShardStatus, sender: str, event: ShardEvent) -> bool:
    """Whether a report from a node other than the owner is the handoff target's own report
    about starting the drained shard (the only time the target is heard before it owns it)."""
    return (
        isinstance(status, Handoff)
        and status.drained
        and status.target == sender
        and event.node == sender
    )


def handoff_report(status: ShardStatus, owner: str, sender: str, event: ShardEvent) -> Action | str:
    """What a report about a shard being handed off does: an ``Action``, or why it is ignored.

    The caller has checked that the sender is the owner or `is_target_report`; a
    ``ShardDrained`` about a shard not in handoff comes here too, and is ignored."""
    shard = event.shard
    if not isinstance(status, Handoff) or (
        isinstance(event, ShardDrained) and event.node != sender
    ):
        return f"shard {shard} is not being handed off by {sender}"
    step = Step.WARMING if status.drained else Step.DRAINING
    role = Role.OWNER if sender == owner else Role.TARGET
    action = REPORTS.get((step, role, type(event)))
    if action is not None:
        return action
    if role is Role.TARGET:
        return f"shard {shard} is still served by its old owner until live"
    if isinstance(event, ShardDrained):
        return f"shard {shard} is not being handed off by {sender}"
    # The old owner's reports while it drains: the shard stays in Handoff until drained.
    return f"shard {shard} is being handed off to {status.target}"


class Overdue(NamedTuple):
    """A handoff past the drain timeout, and why it is forced."""

    ref: DatasetRef
    shard: int
    source: str
    target: str
    why: str


class ShardMoves:
    """The move workflow's state and decisions; the ``ShardManager`` applies what it decides.

    It reads the manager's shard maps (``mappers``, the manager's own dict, never written
    here) and hears of every applied event through `track`, which is how it knows when a
    handoff begins and ends."""

    def __init__(
        self,
        mappers: Mapping[DatasetRef, ShardMapper],
        clock: Callable[[], float],
        *,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        max_concurrent_moves: int = DEFAULT_MAX_CONCURRENT_MOVES,
        move_cooldown: float = DEFAULT_MOVE_COOLDOWN,
    ) -> None:
        self._mappers = mappers
        self._clock = clock
        self._drain_timeout = float(drain_timeout)
        self._cooldown = float(move_cooldown)
        self._max_moves = max(0, int(max_concurrent_moves))
        self._handoffs: dict[Key, float] = {}  # in flight: when each began (clock seconds)
        self._reasons: dict[Key, str] = {}  # why each handoff in flight started
        self._moved_at: dict[Key, float] = {}  # when a shard's last move ended
        self._draining: set[str] = set()  # members an operator is emptying

    # ----- views ------------------------------------------------------------------------------

    def handoffs(self) -> dict[Key, float]:
        """Planned moves in flight: (dataset, shard) -> when each began."""
        return dict(self._handoffs)

    @property
    def draining(self) -> frozenset[str]:
        """Members an operator is emptying."""
        return frozenset(self._draining)

    def is_draining(self, node: str) -> bool:
        return node in self._draining

    def free_slots(self, ref: DatasetRef) -> int:
        """How many handoffs of `ref` the throttle allows to start now: at most
        `max_concurrent_moves` in flight per dataset and cluster-wide."""
        in_flight = sum(1 for r, _ in self._handoffs if r == ref)
        return max(0, min(self._max_moves - in_flight, self._max_moves - len(self._handoffs)))

    def reason(self, ref: DatasetRef, shard: int, default: str) -> str:
        """Why the shard's handoff in flight started (for the ownership history)."""
        return self._reasons.get((ref, shard), default)

    def targeting(self, node: str) -> list[Key]:
        """The handoffs whose target is `node`."""
        return [k for k in self._handoffs if self._target(*k) == node]

    def _target(self, ref: DatasetRef, shard: int) -> str | None:
        status = self._mappers[ref].status(shard)
        return status.target if isinstance(status, Handoff) else None

    # ----- bookkeeping --------------------------------------------------------------------------

    def track(self, ref: DatasetRef, shard: int, status: ShardStatus, event: ShardEvent) -> None:
        """Hear of an event the manager applied (`status` is the shard's status after it): a
        handoff begins when the shard enters Handoff and ends, whichever way, when it leaves."""
        key = (ref, shard)
        if isinstance(status, Handoff):
            self._handoffs.setdefault(key, self._clock())
            if isinstance(event, ShardHandoffStarted):
                self._reasons[key] = event.reason or "rebalance"
        else:
            if self._handoffs.pop(key, None) is not None:
                self._moved_at[key] = self._clock()
            self._reasons.pop(key, None)

    def drain(self, node: str) -> None:
        """An operator empties `node`: its shards move off, it gets no new ones."""
        self._draining.add(node)

    def undrain(self, node: str) -> None:
        """The drain of `node` is cancelled, or the node left."""
        self._draining.discard(node)

    def forget_dataset(self, ref: DatasetRef) -> None:
        """The dataset is removed: a dataset created again under its name starts with no
        handoffs, reasons or cooldowns of the old one's."""
        for book in (self._handoffs, self._reasons, self._moved_at):
            for key in [k for k in book if k[0] == ref]:
                del book[key]

    def restart_clocks(self, ref: DatasetRef, mapper: ShardMapper) -> None:
        """A recovered map's handoffs go on (their owners re-report drained, or the drain
        timeout forces them), timed from now."""
        now = self._clock()
        for key in [k for k in self._handoffs if k[0] == ref]:
            del self._handoffs[key]
        for shard, st in enumerate(mapper.statuses):
            if isinstance(st, Handoff):
                self._handoffs[(ref, shard)] = now

    # ----- decisions ----------------------------------------------------------------------------

    def overdue(self) -> list[Overdue]:
        """The handoffs whose old owner did not report drained (or whose target did not go
        live) within the drain timeout: the manager forces them, and a new epoch fences the old
        owner off the store."""
        now = self._clock()
        due: list[Overdue] = []
        for (ref, shard), began in self._handoffs.items():
            if now - began < self._drain_timeout:
                continue
            mapper = self._mappers[ref]
            source, target = mapper.owner(shard), self._target(ref, shard)
            if source is None or target is None:
                continue
            status = mapper.status(shard)
            late = (
                f"{target} did not go live within {self._drain_timeout:g} s of the drain"
                if isinstance(status, Handoff) and status.drained
                else f"{source} did not drain within {self._drain_timeout:g} s"
            )
            why = f"rebalance: {late}, move forced (epoch fencing keeps {source} from writing)"
            due.append(Overdue(ref, shard, source, target, why))
        return due

    def next_moves(
        self,
        ref: DatasetRef,
        mapper: ShardMapper,
        nodes: Mapping[str, str],
        *,
        balance: bool,
        load: Mapping[int, float] | None,
    ) -> tuple[list[tuple[Move, str]], str | None]:
        """The handoffs to start now in one dataset, each with why ("drain" or "rebalance"),
        within the throttle, and (with `balance`) why no more were planned: first those that
        empty draining nodes, then those that narrow the spread over the other members
        (`nodes`: name -> version). `load` (samples/s per shard) makes the balance one of load
        rather than of shard counts."""
        budget = self.free_slots(ref)
        staying = {n: v for n, v in nodes.items() if n not in self._draining}
        # A shard in a handoff counts where it is going (as in `plan`): counted at its old
        # owner, the next rounds would move more off that node than the balance needs and
        # then move them back.
        owners = _destinations(mapper)
        now = self._clock()
        active = [
            isinstance(st, Active) and o in nodes
            for o, st in zip(owners, mapper.statuses, strict=True)
        ]
        # The cooldown keeps balancing from chasing a moved shard's noisy load; an
        # operator's drain waits for none (it empties the node as fast as the throttle lets).
        movable = [
            a and now - self._moved_at.get((ref, s), -self._cooldown) >= self._cooldown
            for s, a in enumerate(active)
        ]
        moves = list(evacuation_moves(owners, active, self._draining, nodes, budget))
        for m in moves:
            owners[m.shard], movable[m.shard] = m.target, False
        held: str | None = None
        if balance:
            weights = _weights(mapper.num_shards, load)
            # Measured loads are noisy (a shard catching up after a move reads hot): nodes
            # within 25% of the mean node load count as even.
            noise = 0.25 * sum(weights) / max(1, len(staying)) if weights else 0.0
            plan = plan_moves(owners, movable, staying, budget - len(moves), weights, noise)
            moves += plan.moves
            held = plan.held_back
        return [(m, "drain" if m.source in self._draining else "rebalance") for m in moves], held

    def plan(
        self,
        mapper: ShardMapper,
        dataset: Dataset,
        nodes: dict[str, str],
        strategy: ShardAssignmentStrategy,
        *,
        add_nodes: int = 0,
        remove_nodes: Sequence[str] = (),
        drain_nodes: Iterable[str] = (),
        budget: int | None = None,
    ) -> Plan:
        """What a rebalance would do now, or after `add_nodes` new nodes joined (of the newest
        version) and `remove_nodes` left, without applying anything: the same planner the
        periodic rebalance runs, on a copy of the map. Shards a leaving node frees are first
        placed as a leave places them (the strategy), then balanced; `drain_nodes` and the
        nodes being drained are emptied first. `budget` None: no throttle."""
        ref = dataset.ref
        mapper = mapper.copy()
        nodes = dict(nodes)
        newest = max(nodes.values(), key=version_key, default="")
        for i in range(add_nodes):
            nodes[f"new-{i + 1}"] = newest
        for node in remove_nodes:
            nodes.pop(node, None)
            mapper.remove_node(node)
        for node in assignment_order(nodes):
            shards = strategy.shard_assignments(node, dataset, mapper)
            for shard in shards:
                mapper.update_from_event(ShardAssignmentStarted(ref, shard, node))
        limit = 1 << 30 if budget is None else budget
        owners = _destinations(mapper)
        movable = [isinstance(st, Active) for st in mapper.statuses]
        leaving = set(drain_nodes) | (self._draining & set(nodes))
        evacuate = evacuation_moves(owners, movable, leaving, nodes, limit)
        for m in evacuate:
            owners[m.shard], movable[m.shard] = m.target, False
        staying = {n: v for n, v in nodes.items() if n not in leaving}
        plan = plan_moves(owners, movable, staying, limit - len(evacuate))
        before = {n: float(mapper.num_shards_for_node(n)) for n in nodes}
        after = dict.fromkeys(nodes, 0.0)
        for owner in plan.owners:
            if owner in after:
                after[owner] += 1
        return Plan(evacuate + plan.moves, plan.owners, before, after, plan.held_back)


def _destinations(mapper: ShardMapper) -> list[str | None]:
    """Each shard's owner, or for a shard in a handoff the node it is going to."""
    return [
        st.target if isinstance(st, Handoff) else o
        for o, st in zip(mapper.owners, mapper.statuses, strict=True)
    ]


def _weights(num_shards: int, load: Mapping[int, float] | None) -> list[float] | None:
    """Per-shard weights for the planner from measured samples/s, or None (count shards) when
    nothing was measured. A shard with no measurement weighs the mean of the measured ones,
    so an unmeasured shard (just moved, or starting) is neither free nor heavy."""
    if not load:
        return None
    measured = [max(0.0, float(v)) for v in load.values()]
    total = sum(measured)
    if total <= 0:
        return None
    mean = total / len(measured)
    return [max(0.0, float(load[s])) if s in load else mean for s in range(num_shards)]
