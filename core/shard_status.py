"""Shard statuses, the events that move a shard between them, and immutable shard map snapshots.

Everything here is plain frozen data so the shard manager's messages can be pickled by Ray and
compared in tests. A status is one of eight small classes, reachable as ``ShardStatus.Active``
and friends so callers can pattern-match on them (``case Recovery(pct):``).
"""

from __future__ import annotations

import re
import sys
from array import array
from dataclasses import dataclass, field
from typing import Any, ClassVar

from core.dataset import DatasetRef

__all__ = [
    "ACTIVE",
    "ASSIGNED",
    "DOWN",
    "STOPPED",
    "UNASSIGNED",
    "Active",
    "Assigned",
    "CurrentShardSnapshot",
    "Degraded",
    "Down",
    "Error",
    "Handoff",
    "IngestionDegraded",
    "IngestionError",
    "IngestionStarted",
    "IngestionStopped",
    "Recovery",
    "RecoveryInProgress",
    "ShardAssignmentStarted",
    "ShardDown",
    "ShardDrained",
    "ShardEvent",
    "ShardHandoffStarted",
    "ShardMapState",
    "ShardStatus",
    "Stopped",
    "Unassigned",
]


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """Base of the shard statuses; ``str()`` gives the text form used by the REST API."""

    letter: ClassVar[str] = "?"
    # Whether a node is (or should be) running ingestion for the shard.
    ingesting: ClassVar[bool] = False

    Unassigned: ClassVar[type[Unassigned]]
    Assigned: ClassVar[type[Assigned]]
    Active: ClassVar[type[Active]]
    Recovery: ClassVar[type[Recovery]]
    Degraded: ClassVar[type[Degraded]]
    Error: ClassVar[type[Error]]
    Stopped: ClassVar[type[Stopped]]
    Down: ClassVar[type[Down]]
    Handoff: ClassVar[type[Handoff]]

    def __str__(self) -> str:
        return type(self).__name__

    @staticmethod
    def parse(text: str) -> ShardStatus:
        """Inverse of ``str()``: ``"Recovery(40)"`` -> ``Recovery(40)``."""
        m = _STATUS_RE.match(text.strip())
        if not m:
            raise ValueError(f"not a shard status: {text!r}")
        name, arg = m.group(1), m.group(2)
        if name == "Recovery" and arg is not None:
            return Recovery(int(arg))
        if name == "Error" and arg is not None:
            return Error(arg)
        if name == "Degraded" and arg is not None:
            return Degraded(arg)
        if name == "Handoff" and arg is not None:
            target, _, drained = arg.rpartition(", ")
            if drained == "drained" and target:
                return Handoff(target, drained=True)
            return Handoff(arg)
        if arg is None and name in _SIMPLE:
            return _SIMPLE[name]
        raise ValueError(f"not a shard status: {text!r}")


@dataclass(frozen=True, slots=True)
class Unassigned(ShardStatus):
    letter: ClassVar[str] = "."


@dataclass(frozen=True, slots=True)
class Assigned(ShardStatus):
    letter: ClassVar[str] = "N"
    ingesting: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class Active(ShardStatus):
    letter: ClassVar[str] = "A"
    ingesting: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class Recovery(ShardStatus):
    """Replaying the Kafka backlog before going Active."""

    progress_pct: int = 0
    letter: ClassVar[str] = "R"
    ingesting: ClassVar[bool] = True

    def __str__(self) -> str:
        return f"Recovery({self.progress_pct})"


@dataclass(frozen=True, slots=True)
class Degraded(ShardStatus):
    """Still ingesting, but not healthy: the store or Kafka is unreachable (``message`` says
    which and why). The owner keeps the shard and catches up by itself once the outage ends."""

    message: str = ""
    letter: ClassVar[str] = "!"
    ingesting: ClassVar[bool] = True

    def __str__(self) -> str:
        return f"Degraded({self.message})"


@dataclass(frozen=True, slots=True)
class Error(ShardStatus):
    message: str = ""
    letter: ClassVar[str] = "E"

    def __str__(self) -> str:
        return f"Error({self.message})"


@dataclass(frozen=True, slots=True)
class Stopped(ShardStatus):
    letter: ClassVar[str] = "S"


@dataclass(frozen=True, slots=True)
class Down(ShardStatus):
    letter: ClassVar[str] = "D"


@dataclass(frozen=True, slots=True)
class Handoff(ShardStatus):
    """A planned move to ``target``: the owner stops consuming, flushes and checkpoints every
    flush group (``drained`` once done); then ``target`` starts the shard with a new epoch
    from those checkpoints (replaying nothing) and takes it over once live. The owner answers
    queries until then, so a planned move never makes a shard unavailable."""

    target: str = ""
    drained: bool = False
    letter: ClassVar[str] = "H"
    ingesting: ClassVar[bool] = True  # still the owner's: it serves queries until handed over

    def __str__(self) -> str:
        return f"Handoff({self.target}{', drained' if self.drained else ''})"


ShardStatus.Unassigned = Unassigned
ShardStatus.Assigned = Assigned
ShardStatus.Active = Active
ShardStatus.Recovery = Recovery
ShardStatus.Degraded = Degraded
ShardStatus.Error = Error
ShardStatus.Stopped = Stopped
ShardStatus.Down = Down
ShardStatus.Handoff = Handoff

# Shared instances: a 4096-shard map then pickles as a few objects plus references.
UNASSIGNED = Unassigned()
ASSIGNED = Assigned()
ACTIVE = Active()
STOPPED = Stopped()
DOWN = Down()
_SIMPLE: dict[str, ShardStatus] = {
    "Unassigned": UNASSIGNED,
    "Assigned": ASSIGNED,
    "Active": ACTIVE,
    "Stopped": STOPPED,
    "Down": DOWN,
}
_STATUS_RE = re.compile(r"^([A-Za-z]+)(?:\((.*)\))?$", re.DOTALL)


_SHARED_BY_TYPE: dict[type[ShardStatus], ShardStatus] = {type(s): s for s in _SIMPLE.values()}


def canonical(status: ShardStatus) -> ShardStatus:
    """The shared instance for argument-less statuses, so snapshots stay small when pickled."""
    return _SHARED_BY_TYPE.get(type(status), status)


@dataclass(frozen=True, slots=True)
class ShardEvent:
    """A change to one shard of one dataset; ``node`` is the owner it concerns (if any)."""

    ref: DatasetRef
    shard: int
    node: str | None


@dataclass(frozen=True, slots=True)
class ShardAssignmentStarted(ShardEvent):
    """The manager gave the shard to ``node``: status Assigned, owner set. ``reason`` says why
    when it is a move (e.g. a rebalance, or a drain that timed out and was forced)."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class ShardHandoffStarted(ShardEvent):
    """A planned move of the shard from ``node`` to ``target`` began: status Handoff(target),
    owner kept; ``node`` drains the shard and reports ``ShardDrained``."""

    target: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ShardDrained(ShardEvent):
    """``node`` stopped consuming the shard and flushed and checkpointed all it held: status
    Handoff(target, drained). The target starts the shard now, and becomes its owner with its
    ``IngestionStarted``; ``node`` answers queries until then."""


@dataclass(frozen=True, slots=True)
class IngestionStarted(ShardEvent):
    """``node`` is ingesting the shard live: status Active, owner set. The ingester adds the
    ownership epoch it claimed and the offsets it read again at start (for the ownership
    history); they are notes, not part of the event's identity. ``replayed_offsets``: the
    offsets it read from its first one that an owner before it had read; exact when that owner
    let go (it notes where it stopped: 0 after a drain), else everything below the partition's
    end offset at the claim, all a killed owner could have read (``offsets_read_before``)."""

    epoch: int | None = field(default=None, compare=False)
    replayed_offsets: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class RecoveryInProgress(ShardEvent):
    """``node`` is replaying the backlog: status Recovery(pct), owner set. ``message`` tells
    subscribers what recovery found that they should know (e.g. offsets lost to retention)."""

    progress_pct: int = 0
    message: str = ""


@dataclass(frozen=True, slots=True)
class IngestionDegraded(ShardEvent):
    """``node`` keeps ingesting the shard but cannot flush it (store outage) or cannot reach
    Kafka: status Degraded(message), owner set. ``IngestionStarted`` follows once it is healthy."""

    message: str = ""


@dataclass(frozen=True, slots=True)
class IngestionError(ShardEvent):
    """Ingestion failed on ``node``: status Error, owner cleared so the shard can move."""

    message: str = ""


@dataclass(frozen=True, slots=True)
class IngestionStopped(ShardEvent):
    """Ingestion ended (e.g. end of stream): status Stopped, owner kept."""


@dataclass(frozen=True, slots=True)
class ShardDown(ShardEvent):
    """The shard was taken away from ``node`` (node left, stop request): Down, owner cleared."""


@dataclass(frozen=True, slots=True)
class ShardMapState:
    """An immutable, versioned copy of one dataset's shard map.

    This is what nodes and subscribers receive: two flat tuples instead of a mapper object, so
    one snapshot can be shared by every message of a change and pickles compactly.
    """

    num_shards: int
    owners: tuple[str | None, ...]
    statuses: tuple[ShardStatus, ...]
    version: int
    # Pickled form, built on first pickling and shared by every message carrying this snapshot.
    _wire: tuple[Any, ...] | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle as a node table plus small integer codes, far smaller and faster than two
        tuples of a reference per shard: Ray pickles a snapshot per call (docs/sharding.md)."""
        if self._wire is None:
            object.__setattr__(self, "_wire", _encode_state(self))
        return _decode_state, self._wire  # type: ignore[return-value]

    def owner(self, shard: int) -> str | None:
        return self.owners[shard]

    def status(self, shard: int) -> ShardStatus:
        return self.statuses[shard]

    def shards_for_node(self, node: str) -> list[int]:
        return [s for s, o in enumerate(self.owners) if o == node]

    def draining_shards(self, node: str) -> list[int]:
        """The shards ``node`` should drain (stop consuming, flush, checkpoint) for a move."""
        return [
            s
            for s, (o, st) in enumerate(zip(self.owners, self.statuses, strict=True))
            if o == node and isinstance(st, Handoff)
        ]

    def ingesting_shards(self, node: str) -> list[int]:
        """The shards ``node`` should be running: its own (a shard it drains included: it
        serves queries from it until the move completes), and those drained for a handoff to
        it, which it starts before it becomes their owner."""
        return [
            s
            for s, (o, st) in enumerate(zip(self.owners, self.statuses, strict=True))
            if (o == node and st.ingesting)
            or (isinstance(st, Handoff) and st.drained and st.target == node)
        ]


@dataclass(frozen=True, slots=True)
class CurrentShardSnapshot:
    """The full shard map of a dataset, sent to a subscriber first and after bulk changes."""

    ref: DatasetRef
    state: ShardMapState


def _codes(values: list[int], table_size: int) -> tuple[str, bytes]:
    typecode = "B" if table_size <= 0xFF else "H" if table_size <= 0xFFFF else "I"
    arr = array(typecode, values)
    if sys.byteorder == "big":
        arr.byteswap()  # always little-endian on the wire
    return typecode, arr.tobytes()


def _decode_codes(typecode: str, data: bytes) -> array[int]:
    arr = array(typecode)
    arr.frombytes(data)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr


def _encode_state(state: ShardMapState) -> tuple[Any, ...]:
    nodes: dict[str | None, int] = {None: 0}
    statuses: dict[ShardStatus, int] = {}
    owner_codes = [nodes.setdefault(o, len(nodes)) for o in state.owners]
    status_codes = [statuses.setdefault(st, len(statuses)) for st in state.statuses]
    return (
        state.num_shards,
        state.version,
        tuple(nodes)[1:],
        *_codes(owner_codes, len(nodes)),
        tuple(statuses),
        *_codes(status_codes, len(statuses)),
    )


def _decode_state(
    num_shards: int,
    version: int,
    nodes: tuple[str, ...],
    owner_type: str,
    owner_data: bytes,
    statuses: tuple[ShardStatus, ...],
    status_type: str,
    status_data: bytes,
) -> ShardMapState:
    table: tuple[str | None, ...] = (None, *nodes)
    shared = tuple(canonical(s) for s in statuses)
    owners = tuple(table[i] for i in _decode_codes(owner_type, owner_data))
    return ShardMapState(
        num_shards,
        owners,
        tuple(shared[i] for i in _decode_codes(status_type, status_data)),
        version,
    )
