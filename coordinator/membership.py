"""Cluster membership as a state machine: which FiloPy nodes the singleton counts as members.

A node Ray reports alive is *joining* until its coordinator answers a ping, then a *member*
(the shard manager may give it shards). A member silent for longer than the failure timeout is
*quarantined*: its shards move, but its process may live on, so it must answer again (and get
the map that took its shards away) before it rejoins as the newest member. A node whose process
died or that Ray reports gone leaves for good (*gone*); if Ray shows it again it joins afresh.

Silence is evidence against the singleton too: when more members fall silent at once than still
answer, the singleton is more likely the one cut off (its host partitioned from the nodes) than
they all failed, and moving their shards would only replay them elsewhere, or nowhere. Then no
one is quarantined (`suspect_self` says why) until more answer than are silent; nodes whose
process dies are still reported by Ray and leave as before.

The allowed moves are data (`TRANSITIONS`), as in dskit's ring lifecycler: any other move is a
bug and raises `IllegalTransition` naming both states. Pure: no Ray; time comes from the clock
passed in, so every path is unit-tested without a cluster. The singleton does the I/O (pings,
Ray's node list) and tells the manager about the joins and leaves this returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from coordinator.failure_detector import PingFailureDetector
from core.errors import Internal


class NodeState(StrEnum):
    JOINING = "joining"  # Ray reports the node; its coordinator has not answered yet
    MEMBER = "member"  # answered: counts for shard assignment, watched by the failure detector
    QUARANTINED = "quarantined"  # silent past the timeout: shards moved, must answer to rejoin
    GONE = "gone"  # process died or node left Ray; forgotten


# From each state, the states a node may move to. A node not yet known can only start joining.
TRANSITIONS: dict[NodeState | None, frozenset[NodeState]] = {
    None: frozenset({NodeState.JOINING}),
    NodeState.JOINING: frozenset({NodeState.MEMBER, NodeState.GONE}),
    NodeState.MEMBER: frozenset({NodeState.QUARANTINED, NodeState.GONE}),
    NodeState.QUARANTINED: frozenset({NodeState.MEMBER, NodeState.GONE}),
    NodeState.GONE: frozenset(),
}


class IllegalTransition(Internal):
    """A move the state machine does not allow: a bug in the caller, never an outage."""

    def __init__(self, node: str, current: NodeState | None, wanted: NodeState) -> None:
        super().__init__(f"node {node}: cannot go from {current or 'unknown'} to {wanted}")
        self.node, self.current, self.wanted = node, current, wanted


@dataclass(frozen=True, slots=True)
class Change:
    """One move: `left` is true when a member stops being one (its shards must move)."""

    node: str
    before: NodeState | None
    after: NodeState
    why: str

    @property
    def joined(self) -> bool:
        return self.after is NodeState.MEMBER

    @property
    def left(self) -> bool:
        return self.before is NodeState.MEMBER


class Membership:
    """Node states, the failure detector for members, and the moves between states."""

    def __init__(
        self,
        failure_timeout_s: float,
        ping_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._states: dict[str, NodeState] = {}
        self._detector = PingFailureDetector(failure_timeout_s, ping_interval_s, clock)
        self.suspect_self: str | None = None  # why silent members are not quarantined now

    # ----- reading ---------------------------------------------------------------------------

    def state(self, node: str) -> NodeState | None:
        return self._states.get(node)

    def nodes(self, state: NodeState) -> list[str]:
        """Nodes in `state`, in the order they entered it (members: oldest first)."""
        return [n for n, s in self._states.items() if s is state]

    @property
    def members(self) -> list[str]:
        return self.nodes(NodeState.MEMBER)

    def known(self) -> set[str]:
        return set(self._states)

    def silent_for(self, node: str) -> float:
        return self._detector.silent_for(node)

    # ----- events ----------------------------------------------------------------------------

    def discovered(self, node: str) -> Change | None:
        """Ray reports a FiloPy node: a node not known yet starts joining."""
        if node in self._states:
            return None
        return self._move(node, NodeState.JOINING, "Ray reports the node")

    def answered(self, node: str) -> Change | None:
        """The node's coordinator answered a ping: joining or quarantined nodes become members
        (the newest), a member's silence ends. Unknown nodes are ignored (a late answer)."""
        match self._states.get(node):
            case NodeState.MEMBER:
                self._detector.heard_from(node)
                return None
            case NodeState.JOINING | NodeState.QUARANTINED:
                return self._move(node, NodeState.MEMBER, "its coordinator answered")
        return None

    def died(self, node: str, why: str) -> Change | None:
        """The node's process died or Ray no longer lists it: gone, from any state."""
        if node not in self._states:
            return None
        return self._move(node, NodeState.GONE, why)

    def vanished(self, live: Iterable[str]) -> list[Change]:
        """Every known node Ray no longer lists as alive is gone."""
        alive = set(live)
        return [
            c
            for n in list(self._states)
            if n not in alive
            for c in [self.died(n, "Ray reports the node dead")]
            if c is not None
        ]

    def tick(self) -> list[Change]:
        """Once per ping round: members silent past the timeout are quarantined, unless more
        are silent than answer within half the timeout (then the singleton suspects itself:
        `suspect_self`)."""
        self._detector.tick()
        members = self.members
        silent = list(self._detector.failed(among=members))
        # Answering means heard within half the timeout. Members cut off at one instant cross
        # the timeout one by one (each was last heard at its own point of the ping round), so
        # one that is merely on its way to the timeout is not counted as answering.
        recent = self._detector.timeout_s / 2
        answering = [n for n in members if n not in silent and self.silent_for(n) <= recent]
        if silent and len(silent) > len(answering):
            self.suspect_self = (
                f"{len(silent)} of {len(members)} members silent past the failure timeout, "
                f"{len(answering)} answering: the singleton is more likely cut off than they; "
                "no shard moves until more answer than are silent"
            )
            return []
        if self.suspect_self is not None:
            # The singleton was cut off, not they: the ones not heard yet since the link came
            # back get a full timeout from now, as if they had just joined.
            self.suspect_self = None
            for n in silent:
                self._detector.heard_from(n)
            return []
        return [
            self._move(
                n, NodeState.QUARANTINED, f"no answer to pings for {self.silent_for(n):.1f} s"
            )
            for n in silent
        ]

    def _move(self, node: str, to: NodeState, why: str) -> Change:
        before = self._states.get(node)
        if to not in TRANSITIONS[before]:
            raise IllegalTransition(node, before, to)
        if before is NodeState.MEMBER:
            self._detector.unwatch(node)
        if to is NodeState.GONE:
            del self._states[node]
        else:
            self._states.pop(node, None)  # re-insert: the order of `nodes()` is entry order
            self._states[node] = to
        if to is NodeState.MEMBER:
            self._detector.watch(node)
        return Change(node, before, to, why)


__all__ = ["TRANSITIONS", "Change", "IllegalTransition", "Membership", "NodeState"]
