"""One dataset's shard map: who owns each shard and in what state.

Ownership and status follow a small set of rules so that any reachable state can be rebuilt
from events (tests/unit/test_properties.py rebuilds every map it reaches): an owned shard is
Assigned, Active, Recovery, Degraded, Handoff or Stopped; an unowned one is Unassigned, Error,
Stopped or Down. Indexes (shards per node, unowned shards, shards free for automatic assignment)
are kept up to date in O(log N) per change: the shard manager applies one event per shard report
and asks the assignment strategy about hundreds of nodes per change, so nothing on those paths
may scan or copy all N shards (65536 at most).

A Stopped shard is never handed out automatically (``assignable_shards``): it stays stopped until
an operator starts it, owned or not.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from core.errors import Invalid
from core.hashing import log2_shards
from core.shard_status import (
    ACTIVE,
    ASSIGNED,
    DOWN,
    STOPPED,
    UNASSIGNED,
    Active,
    Assigned,
    Degraded,
    Error,
    Handoff,
    IngestionDegraded,
    IngestionError,
    IngestionStarted,
    IngestionStopped,
    Recovery,
    RecoveryInProgress,
    ShardAssignmentStarted,
    ShardDown,
    ShardDrained,
    ShardEvent,
    ShardHandoffStarted,
    ShardMapState,
    ShardStatus,
    Stopped,
    canonical,
)

__all__ = ["ShardEventError", "ShardMapper"]

# statuses that imply "some node ingests this shard"
_OWNED_ONLY = (Assigned, Active, Recovery, Degraded, Handoff)


class _MinSet:
    """A set of shard numbers that yields its smallest members in O(k log N).

    A lazy min-heap beside the set: removals only touch the set, and stale heap entries are
    dropped when met (or all at once when they outnumber the live ones), so every update is
    O(log N) amortized instead of the O(N) shift of a sorted list.
    """

    __slots__ = ("_heap", "_members")

    def __init__(self, members: Iterable[int] = ()) -> None:
        self._members = set(members)
        self._heap = sorted(self._members)

    def add(self, shard: int) -> None:
        if shard not in self._members:
            self._members.add(shard)
            heapq.heappush(self._heap, shard)

    def discard(self, shard: int) -> None:
        self._members.discard(shard)
        if len(self._heap) > 2 * len(self._members) + 64:
            self._heap = sorted(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, shard: int) -> bool:
        return shard in self._members

    def smallest(self, limit: int | None = None) -> list[int]:
        """Members in ascending order, at most ``limit`` of them."""
        if limit is None or limit >= len(self._members):
            return sorted(self._members)
        out: list[int] = []
        heap, members = self._heap, self._members
        while len(out) < limit and heap:
            shard = heapq.heappop(heap)
            if shard in members and (not out or out[-1] != shard):
                out.append(shard)
        for shard in out:
            heapq.heappush(heap, shard)
        return out

    def copy(self) -> _MinSet:
        c = _MinSet.__new__(_MinSet)
        c._members = self._members.copy()
        c._heap = self._heap.copy()
        return c


class ShardEventError(Invalid):
    """An event that cannot apply to this mapper (e.g. a shard number out of range): the
    report is wrong, not the map, so the map stays as it was."""

    def __init__(self, event: ShardEvent, reason: str) -> None:
        super().__init__(f"{reason} [shard={event.shard}, event={event}]")
        self.event = event


class ShardMapper:
    """Mutable shard map of one dataset; not thread-safe (the manager is single-threaded)."""

    __slots__ = (
        "_assignable",
        "_free",
        "_log2",
        "_node_shards",
        "_owners",
        "_snapshot",
        "_statuses",
        "_version",
        "num_shards",
    )

    def __init__(self, num_shards: int, version: int = 0) -> None:
        self._log2 = log2_shards(num_shards)
        self.num_shards = num_shards
        self._owners: list[str | None] = [None] * num_shards
        self._statuses: list[ShardStatus] = [UNASSIGNED] * num_shards
        self._node_shards: dict[str, set[int]] = {}
        self._free = _MinSet(range(num_shards))  # unowned shards
        self._assignable = _MinSet(range(num_shards))  # unowned and not Stopped
        self._version = version
        self._snapshot: ShardMapState | None = None

    # ----- construction, copies, equality -------------------------------------------------

    @classmethod
    def from_state(cls, state: ShardMapState) -> ShardMapper:
        """Rebuild a mapper from a snapshot (e.g. on a node, or when recovering the manager)."""
        if len(state.owners) != state.num_shards or len(state.statuses) != state.num_shards:
            raise ValueError("shard map state has the wrong number of shards")
        m = cls(state.num_shards, state.version)
        m._owners = list(state.owners)
        m._statuses = [canonical(s) for s in state.statuses]
        m._reindex()
        m._snapshot = state
        return m

    def _reindex(self) -> None:
        self._node_shards = {}
        free = []
        for shard, owner in enumerate(self._owners):
            if owner is None:
                free.append(shard)
            else:
                self._node_shards.setdefault(owner, set()).add(shard)
        self._free = _MinSet(free)
        self._assignable = _MinSet(s for s in free if not isinstance(self._statuses[s], Stopped))

    def copy(self) -> ShardMapper:
        m = ShardMapper(self.num_shards, self._version)
        m._owners = self._owners.copy()
        m._statuses = self._statuses.copy()
        m._node_shards = {n: s.copy() for n, s in self._node_shards.items()}
        m._free = self._free.copy()
        m._assignable = self._assignable.copy()
        m._snapshot = self._snapshot
        return m

    def __eq__(self, other: object) -> bool:
        """Same shards, owners and statuses; the version is bookkeeping, not state."""
        if not isinstance(other, ShardMapper):
            return NotImplemented
        return (
            self.num_shards == other.num_shards
            and self._owners == other._owners
            and self._statuses == other._statuses
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"ShardMapper({self.num_shards} shards, version {self._version}: {self.summary()})"

    # ----- versioning and snapshots -------------------------------------------------------

    @property
    def version(self) -> int:
        """Grows with every change, so receivers can drop stale maps."""
        return self._version

    def advance_version(self, version: int) -> None:
        """Move the version forward to at least ``version`` (used when mirroring a remote map)."""
        if version > self._version:
            self._version = version
            self._snapshot = None

    def _changed(self) -> None:
        self._version += 1
        self._snapshot = None

    def snapshot(self) -> ShardMapState:
        """Immutable copy of the current state; cached until the next change."""
        if self._snapshot is None:
            self._snapshot = ShardMapState(
                self.num_shards, tuple(self._owners), tuple(self._statuses), self._version
            )
        return self._snapshot

    # ----- low-level ownership ------------------------------------------------------------

    def _set_owner(self, shard: int, node: str | None) -> None:
        old = self._owners[shard]
        if old == node:
            return
        if old is None:
            self._free.discard(shard)
        else:
            shards = self._node_shards[old]
            shards.discard(shard)
            if not shards:
                del self._node_shards[old]
        if node is None:
            self._free.add(shard)
        else:
            self._node_shards.setdefault(node, set()).add(shard)
        self._owners[shard] = node

    def _set(self, shard: int, node: str | None, status: ShardStatus) -> bool:
        if self._owners[shard] == node and self._statuses[shard] == status:
            return False
        self._set_owner(shard, node)
        self._statuses[shard] = status
        if node is None and not isinstance(status, Stopped):
            self._assignable.add(shard)
        else:
            self._assignable.discard(shard)
        return True

    # ----- updates ------------------------------------------------------------------------

    def update_from_event(self, event: ShardEvent) -> bool:
        """Apply one event; returns whether anything changed.

        Raises ``ShardEventError`` for a shard outside ``[0, num_shards)`` or an event that must
        name an owner but does not.
        """
        shard = event.shard
        if not 0 <= shard < self.num_shards:
            raise ShardEventError(
                event, f"invalid shard {shard}, valid shards are 0..{self.num_shards - 1}"
            )
        match event:
            case ShardAssignmentStarted(node=node):
                changed = self._set(shard, self._require_node(event, node), ASSIGNED)
            case IngestionStarted(node=node):
                changed = self._set(shard, self._require_node(event, node), ACTIVE)
            case RecoveryInProgress(node=node, progress_pct=pct):
                changed = self._set(shard, self._require_node(event, node), Recovery(pct))
            case IngestionDegraded(node=node, message=message):
                changed = self._set(shard, self._require_node(event, node), Degraded(message))
            case IngestionError(message=message):
                changed = self._set(shard, None, Error(message))
            case IngestionStopped():
                changed = self._set(shard, self._owners[shard], STOPPED)
            case ShardDown():
                changed = self._set(shard, None, DOWN)
            case ShardHandoffStarted(node=node, target=target):
                node = self._require_node(event, node)
                if not target or target == node:
                    raise ShardEventError(event, "a handoff must name another node as target")
                changed = self._set(shard, node, Handoff(target))
            case ShardDrained(node=node):
                status = self._statuses[shard]
                if not isinstance(status, Handoff) or self._owners[shard] != node:
                    raise ShardEventError(event, f"shard {shard} is not being handed off by {node}")
                changed = self._set(shard, node, Handoff(status.target, drained=True))
            case _:
                raise ShardEventError(event, f"unknown shard event type {type(event).__name__}")
        if changed:
            self._changed()
        return changed

    @staticmethod
    def _require_node(event: ShardEvent, node: str | None) -> str:
        if not node:
            raise ShardEventError(event, f"{type(event).__name__} must name the owning node")
        return node

    def _unassign(self, shard: int) -> bool:
        status = self._statuses[shard]
        if isinstance(status, _OWNED_ONLY):
            status = UNASSIGNED
        return self._set(shard, None, status)

    def remove_node(self, node: str) -> list[int]:
        """Unassign every shard of ``node``; returns the shards it freed, ascending."""
        freed = sorted(self._node_shards.get(node, ()))
        for shard in freed:
            self._unassign(shard)
        if freed:
            self._changed()
        return freed

    # ----- queries ------------------------------------------------------------------------

    def owner(self, shard: int) -> str | None:
        return self._owners[shard]

    def status(self, shard: int) -> ShardStatus:
        return self._statuses[shard]

    @property
    def owners(self) -> tuple[str | None, ...]:
        return tuple(self._owners)

    @property
    def statuses(self) -> tuple[ShardStatus, ...]:
        return tuple(self._statuses)

    def shards_for_node(self, node: str) -> list[int]:
        return sorted(self._node_shards.get(node, ()))

    def num_shards_for_node(self, node: str) -> int:
        return len(self._node_shards.get(node, ()))

    def all_nodes(self) -> frozenset[str]:
        """Nodes that own at least one shard."""
        return frozenset(self._node_shards)

    @property
    def num_assigned_nodes(self) -> int:
        return len(self._node_shards)

    def assigned_shards(self) -> list[int]:
        return [s for s, o in enumerate(self._owners) if o is not None]

    def unassigned_shards(self, limit: int | None = None) -> list[int]:
        """Shards without an owner (Unassigned, Error, Down, or an unowned Stopped), ascending."""
        return self._free.smallest(None if limit is None else max(0, limit))

    @property
    def num_unassigned_shards(self) -> int:
        return len(self._free)

    def assignable_shards(self, limit: int | None = None) -> list[int]:
        """Unowned shards that automatic assignment may hand out (not Stopped), ascending."""
        return self._assignable.smallest(None if limit is None else max(0, limit))

    @property
    def num_assignable_shards(self) -> int:
        return len(self._assignable)

    def is_ingesting(self, shard: int) -> bool:
        """Whether the map has the shard's owner running it (owned, status ``ingesting``)."""
        return self._owners[shard] is not None and self._statuses[shard].ingesting

    def active_shards(self) -> list[int]:
        return [s for s, st in enumerate(self._statuses) if isinstance(st, Active)]

    def active_or_recovering_shards(self, shards: Iterable[int] | None = None) -> list[int]:
        candidates = range(self.num_shards) if shards is None else shards
        return [s for s in candidates if isinstance(self._statuses[s], Active | Recovery)]

    def is_healthy(self) -> bool:
        """Every shard is Active."""
        return all(isinstance(st, Active) for st in self._statuses)

    # ----- rendering ----------------------------------------------------------------------

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for st in self._statuses:
            name = type(st).__name__
            counts[name] = counts.get(name, 0) + 1
        return ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))

    def render(self, names: Mapping[str, str] | None = None) -> str:
        """A 16-shards-per-row status grid plus each node's shards (by `names`, node id ->
        readable name, where given), for the CLI."""
        names = names or {}
        lines = [
            "Status legend: .=Unassigned N=Assigned A=Active R=Recovery !=Degraded E=Error "
            "S=Stopped D=Down H=Handoff",
            f"----- Status map (version {self._version}) -----",
        ]
        for start in range(0, self.num_shards, 16):
            row = self._statuses[start : start + 16]
            groups = ["".join(st.letter for st in row[i : i + 8]) for i in range(0, len(row), 8)]
            end = start + len(row) - 1
            lines.append(f"  {start:5d}-{end:<5d}  " + "  ".join(groups))
        lines.append("----- Nodes -----")
        for node in sorted(self._node_shards, key=lambda n: (names.get(n, n), n)):
            shown = names.get(node, node)
            lines.append(f"  {shown}: {shard_ranges(sorted(self._node_shards[node]))}")
        if not self._node_shards:
            lines.append("  (none)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


def shard_ranges(shards: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``: keeps 4096-shard listings readable."""
    parts: list[str] = []
    i = 0
    while i < len(shards):
        j = i
        while j + 1 < len(shards) and shards[j + 1] == shards[j] + 1:
            j += 1
        parts.append(str(shards[i]) if i == j else f"{shards[i]}-{shards[j]}")
        i = j + 1
    return ", ".join(parts)
